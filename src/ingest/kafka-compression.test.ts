import { Zstd } from '@hpcc-js/wasm-zstd';
import { CompressionCodecs, CompressionTypes } from 'kafkajs';
import { compressFrame } from 'lz4-napi';
import { compressSync as snappyCompressSync } from 'snappy';
import { describe, expect, it } from 'vitest';
import { xerialFramed } from '../../test/support/compression.ts';
import { lz4Decompress, registerKafkaCodecs, snappyDecompress, zstdDecompressBatch } from './kafka-compression.ts';

const TEXT = '{"eventId":"e1","apiKeyId":"pk_live_a"}\n{"eventId":"e2","apiKeyId":"pk_live_a"}\n';

/** Byte for byte (vitest's deep equality walks a Buffer of megabytes one element at a time). */
function sameBytes(actual: Buffer, expected: Buffer): void {
  expect(actual.length).toBe(expected.length);
  expect(actual.equals(expected)).toBe(true);
}

/** Many records' worth of JSON: more than one 64 KiB block of every format. */
function records(count: number): Buffer {
  return Buffer.from(Array.from({ length: count }, (_, i) => `{"eventId":"e${i}","apiKeyId":"pk_live_${i % 97}","status":${200 + (i % 3)}}\n`).join(''));
}

describe('snappy', () => {
  it('reads one raw block (librdkafka) and the xerial framing of several (the Java client)', async () => {
    const plain = records(5_000);
    sameBytes(await snappyDecompress(snappyCompressSync(plain)), plain);
    sameBytes(await snappyDecompress(xerialFramed(plain)), plain);
  });

  it('refuses a xerial frame cut short rather than returning part of the records', async () => {
    const framed = xerialFramed(records(100), 1024);
    await expect(snappyDecompress(framed.subarray(0, framed.length - 3))).rejects.toThrow(/cut short/);
    await expect(snappyDecompress(framed.subarray(0, 18))).rejects.toThrow(/cut short/);
  });
});

describe('lz4', () => {
  it('reads a frame of the reference implementation with block and content checksums and a content size (lz4 1.9.4: --content-size -BX)', async () => {
    const frame = Buffer.from(
      '04224d187c4050000000000000005435000000f1087b226576656e744964223a226531222c226170694b65791000c9706b5f6c6976655f61227d0a28001f32280002505f61227d0a0c2164b500000000583917fe',
      'hex',
    );
    expect((await lz4Decompress(frame)).toString()).toBe(TEXT);
  });

  it('reads frames of many blocks', async () => {
    const plain = records(20_000);
    sameBytes(await lz4Decompress(await compressFrame(plain)), plain);
  });
});

describe('zstd', () => {
  it('reads a frame without its content size (zstd 1.5.4: --no-content-size, as streaming writers leave it out)', async () => {
    const frame = Buffer.from('28b52ffd040085010044027b226576656e744964223a226531222c226170694b6579706b5f6c6976655f61227d0a320300c0164b5d3ad76c02a4196530', 'hex');
    expect((await zstdDecompressBatch(frame)).toString()).toBe(TEXT);
  });

  it('reads a frame many times smaller than its records, and frames one after another', async () => {
    const zstd = await Zstd.load();
    const plain = Buffer.from('{"eventId":"same","apiKeyId":"pk_live_a"}\n'.repeat(50_000));
    const frame = zstd.compress(plain);
    expect(frame.length * 100).toBeLessThan(plain.length);
    sameBytes(await zstdDecompressBatch(Buffer.from(frame)), plain);
    const other = records(3_000);
    const both = Buffer.concat([frame, zstd.compress(other)]);
    sameBytes(await zstdDecompressBatch(both), Buffer.concat([plain, other]));
  });
});

describe('registerKafkaCodecs', () => {
  // CompressionCodecs is the registry kafkajs's record batch decoder looks a batch's codec up in.
  it('gives kafkajs a codec for every compression Kafka defines', async () => {
    registerKafkaCodecs();
    for (const type of [CompressionTypes.GZIP, CompressionTypes.Snappy, CompressionTypes.LZ4, CompressionTypes.ZSTD] as const) {
      expect(() => CompressionCodecs[type]()).not.toThrow();
    }
    const codec = CompressionCodecs[CompressionTypes.LZ4]();
    expect((await codec.decompress(await compressFrame(Buffer.from(TEXT)))).toString()).toBe(TEXT);
    await expect(CompressionCodecs[CompressionTypes.ZSTD]().compress({ buffer: Buffer.from(TEXT) })).rejects.toThrow(/does not write/);
    // A batch it cannot read: an error kafkajs does not retry (it would restart the consumer without end), naming the codec.
    for (const [type, name] of [[CompressionTypes.GZIP, 'gzip'], [CompressionTypes.Snappy, 'snappy'], [CompressionTypes.LZ4, 'lz4'], [CompressionTypes.ZSTD, 'zstd']] as const) {
      const refused = CompressionCodecs[type]().decompress(Buffer.from('not a compressed batch at all'));
      await expect(refused).rejects.toMatchObject({ name: 'KafkaJSNonRetriableError', retriable: false, message: expect.stringContaining(`cannot decompress a ${name} record batch`) });
    }
  });
});
