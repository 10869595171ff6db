/**
 * Compressed record batches. kafkajs reads gzip alone: on a batch in snappy, lz4 or zstd it throws
 * while decoding the fetch, before the worker sees a message, which stops the consumer, and stops it
 * again after every restart, as the batch is still there. Producers commonly compress (Java's and
 * librdkafka's `compression.type`), so the worker gives kafkajs the three other codecs Kafka defines,
 * and its gzip again, to refuse a corrupt batch as they do (refusingCorrupt). Only reading matters:
 * the worker's own producers (dead letters, posted events) do not compress, but kafkajs's codec
 * interface has both halves, so gzip, snappy and lz4 write too, and zstd refuses to.
 */
import { promisify } from 'node:util';
import { gzip as gzipCallback, unzip as unzipCallback } from 'node:zlib';
import { decompress as zstdDecompress } from 'fzstd';
import kafkajs, { type CompressionTypes as CompressionType } from 'kafkajs';
import { compressFrame as lz4CompressFrame, decompressFrame as lz4DecompressFrame } from 'lz4-napi';
import { compress as snappyCompress, uncompress as snappyUncompress } from 'snappy';

// A default import: Node's ESM loader finds no named export CompressionCodecs in kafkajs's CommonJS
// (its exports object lists it as `CompressionCodecs: Compression.Codecs`); vitest's loader would.
const { CompressionCodecs, CompressionTypes, KafkaJSNonRetriableError } = kafkajs;

/** kafkajs's codec interface: `compress` gets its Encoder (the records' bytes in `buffer`). */
interface KafkaCodec {
  compress(encoder: { buffer: Buffer }): Promise<Buffer>;
  decompress(buffer: Buffer): Promise<Buffer>;
}

/**
 * The Java client writes snappy in xerial's framing (snappy-java's stream format): this magic, a
 * version and a compatible version (4 bytes each), then blocks of a 4-byte big-endian length and a
 * raw snappy block. librdkafka reads both that and one raw snappy block, and so does the worker.
 */
const XERIAL_MAGIC = Buffer.from([0x82, 0x53, 0x4e, 0x41, 0x50, 0x50, 0x59, 0x00]); // \x82SNAPPY\0
const XERIAL_HEADER_BYTES = 16;

export async function snappyDecompress(buffer: Buffer): Promise<Buffer> {
  if (!isXerialFramed(buffer)) return (await snappyUncompress(buffer)) as Buffer;
  const blocks: Buffer[] = [];
  let offset = XERIAL_HEADER_BYTES;
  while (offset < buffer.length) {
    if (offset + 4 > buffer.length) throw new Error('snappy: a xerial block length is cut short');
    const length = buffer.readUInt32BE(offset);
    offset += 4;
    if (offset + length > buffer.length) throw new Error('snappy: a xerial block is cut short');
    blocks.push((await snappyUncompress(buffer.subarray(offset, offset + length))) as Buffer);
    offset += length;
  }
  return Buffer.concat(blocks);
}

function isXerialFramed(buffer: Buffer): boolean {
  return buffer.length >= XERIAL_HEADER_BYTES && buffer.subarray(0, XERIAL_MAGIC.length).equals(XERIAL_MAGIC);
}

/** Kafka's lz4 is the LZ4 frame format (with the header checksum right, since record batches v1). */
export function lz4Decompress(buffer: Buffer): Promise<Buffer> {
  return lz4DecompressFrame(buffer);
}

/** One or more zstd frames, with or without their content size (Java's streaming writer leaves it out). */
export async function zstdDecompressBatch(buffer: Buffer): Promise<Buffer> {
  const bytes = zstdDecompress(buffer);
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

/**
 * A batch these cannot read (corrupt: brokers check a batch's CRC as it is produced, so it should not
 * happen) is refused as kafkajs refused a codec it lacked: an error it does not retry, naming the
 * codec, which stops the consumer (kafka-consumer.ts). A plain error would have kafkajs restart the
 * consumer without end, each restart a rebalance of the whole group.
 */
function refusingCorrupt(codec: string, decompress: (buffer: Buffer) => Promise<Buffer>): (buffer: Buffer) => Promise<Buffer> {
  return (buffer) =>
    decompress(buffer).catch((error: unknown) => {
      throw new KafkaJSNonRetriableError(`cannot decompress a ${codec} record batch: ${(error as Error).message}`);
    });
}

const gzip = promisify(gzipCallback);
const unzip = promisify(unzipCallback);

const CODECS: Record<CompressionType.GZIP | CompressionType.Snappy | CompressionType.LZ4 | CompressionType.ZSTD, KafkaCodec> = {
  // kafkajs's own gzip, but refusing a corrupt batch as the others do.
  [CompressionTypes.GZIP]: { compress: (encoder) => gzip(encoder.buffer), decompress: refusingCorrupt('gzip', (buffer) => unzip(buffer)) },
  [CompressionTypes.Snappy]: { compress: (encoder) => snappyCompress(encoder.buffer), decompress: refusingCorrupt('snappy', snappyDecompress) },
  [CompressionTypes.LZ4]: { compress: (encoder) => lz4CompressFrame(encoder.buffer), decompress: refusingCorrupt('lz4', lz4Decompress) },
  [CompressionTypes.ZSTD]: {
    compress: () => Promise.reject(new Error('this worker reads zstd but does not write it')),
    decompress: refusingCorrupt('zstd', zstdDecompressBatch),
  },
};

/** Gives kafkajs (one registry per process) the codecs it lacks, and its gzip refusing corrupt batches; safe to call more than once. */
export function registerKafkaCodecs(): void {
  for (const [type, codec] of Object.entries(CODECS)) {
    CompressionCodecs[Number(type) as keyof typeof CODECS] = () => codec;
  }
}
