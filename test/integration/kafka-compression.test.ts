/**
 * Compressed record batches on the real broker: producers compress with whatever `compression.type`
 * they are given, and the worker reads every codec Kafka defines. Each batch here is written the way
 * another client writes it (snappy in the Java client's xerial framing, lz4 frames, zstd frames of
 * the reference library), by codecs of this test's own, before the worker's are registered.
 */
import { Zstd } from '@hpcc-js/wasm-zstd';
import { CompressionCodecs, CompressionTypes } from 'kafkajs';
import { compressFrame } from 'lz4-napi';
import { describe, expect, it } from 'vitest';
import { xerialFramed } from '../support/compression.ts';
import { useEngines } from '../support/engines.ts';
import { asOfToday, makeEvent } from '../support/events.ts';
import { groupCaughtUp, topicSize } from '../support/kafka.ts';
import { testConfig, testNames, waitFor } from '../support/worker.ts';

const names = testNames('compressed');
const eventOptions = { runId: names.runId, startMs: asOfToday(Date.UTC(2026, 10, 20, 12, 0, 0)) };
const PER_CODEC = 2_000;
const WRITERS = [CompressionTypes.None, CompressionTypes.GZIP, CompressionTypes.Snappy, CompressionTypes.LZ4, CompressionTypes.ZSTD] as const;

async function useWritingCodecs(): Promise<void> {
  const zstd = await Zstd.load();
  const writing = (compress: (plain: Buffer) => Buffer | Promise<Buffer>) => () => ({
    compress: async (encoder: { buffer: Buffer }) => compress(encoder.buffer),
    decompress: () => Promise.reject(new Error('this test only writes')),
  });
  CompressionCodecs[CompressionTypes.Snappy] = writing(xerialFramed);
  CompressionCodecs[CompressionTypes.LZ4] = writing((plain) => compressFrame(plain));
  CompressionCodecs[CompressionTypes.ZSTD] = writing((plain) => Buffer.from(zstd.compress(plain)));
}

describe('Kafka intake of compressed batches', () => {
  const engines = useEngines();

  it('stores every event of batches in each compression Kafka defines, the Java client\'s snappy framing included', async () => {
    const { clickhouse, producer, kafka } = engines;
    await useWritingCodecs();
    for (const [n, compression] of WRITERS.entries()) {
      const messages = Array.from({ length: PER_CODEC }, (_, i) => {
        const event = makeEvent(n * PER_CODEC + i, eventOptions);
        return { key: event.apiKeyId, value: JSON.stringify(event) };
      });
      for (let start = 0; start < messages.length; start += 500) {
        await producer.send({ topic: names.topic, acks: -1, compression, messages: messages.slice(start, start + 500) });
      }
    }
    expect(await topicSize(kafka, names.topic)).toBe(WRITERS.length * PER_CODEC);

    // The worker registers its own codecs (reading every kind) as it starts.
    const worker = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse, names }));
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'the worker commits every partition to its end', 90_000);
    const [stored] = await worker.clickhouse.queryRows<{ rows: number; distinct_ids: number }>(
      `SELECT count() AS rows, uniqExact(event_id) AS distinct_ids FROM ${clickhouse.database}.request_events WHERE position(event_id, {runId:String}) > 0`,
      { runId: names.runId },
    );
    expect(stored).toEqual({ rows: WRITERS.length * PER_CODEC, distinct_ids: WRITERS.length * PER_CODEC });
    expect(await topicSize(kafka, names.dlqTopic).catch(() => 0)).toBe(0);
  });

  it('stops intake for good, naming the codec, on a batch it cannot decompress, rather than have kafkajs restart the consumer without end', async () => {
    const { clickhouse, producer } = engines;
    const corrupt = testNames('corrupt');
    CompressionCodecs[CompressionTypes.LZ4] = () => ({
      compress: async () => Buffer.from('not an lz4 frame'),
      decompress: () => Promise.reject(new Error('this test only writes')),
    });
    const event = makeEvent(0, { runId: corrupt.runId, startMs: eventOptions.startMs });
    await producer.send({ topic: corrupt.topic, acks: -1, compression: CompressionTypes.LZ4, messages: [{ key: event.apiKeyId, value: JSON.stringify(event) }] });
    let fatal: Error | undefined;
    await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse, names: corrupt }), { onFatal: (error) => (fatal = error) });
    await waitFor(() => fatal !== undefined, 'intake stops for good', 60_000);
    expect(fatal!.message).toContain('cannot decompress a lz4 record batch');
  });
});
