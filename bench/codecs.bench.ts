/**
 * tsx bench/codecs.bench.ts (npm run bench:codecs) — what reading a compressed Kafka batch costs the
 * worker: one batch of the ingest bench's events (a fetch returns a producer's batch; 1,250 events of
 * about 300 bytes by default), decompressed by each codec the intake reads (src/ingest/kafka-compression.ts,
 * and kafkajs's own gzip). Prints the compressed size, time per batch and per event, and throughput.
 * gzip (zlib), snappy and lz4 (Node-API bindings) run on libuv's pool, off the event loop; zstd
 * (pure JavaScript) on it.
 * Env: BENCH_BATCH (1250), BENCH_ROUNDS (400).
 */
import { promisify } from 'node:util';
import { gzip as gzipCallback, unzip as unzipCallback } from 'node:zlib';
import { Zstd } from '@hpcc-js/wasm-zstd';
import { compressFrame } from 'lz4-napi';
import { compress as snappyCompress } from 'snappy';
import { lz4Decompress, snappyDecompress, zstdDecompressBatch } from '../src/ingest/kafka-compression.ts';
import { makeEvent } from '../test/support/events.ts';

const gzip = promisify(gzipCallback);
const unzip = promisify(unzipCallback);
const BATCH = Number(process.env.BENCH_BATCH ?? 1_250);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 400);

async function main(): Promise<void> {
  const options = { runId: 'bench', startMs: Date.now() - 3_600_000, keys: 10_000, merchants: 500 };
  const records = Buffer.from(Array.from({ length: BATCH }, (_, i) => JSON.stringify(makeEvent(i, options))).join('\n'));
  const zstd = await Zstd.load();
  const codecs: [string, Buffer, (batch: Buffer) => Promise<Buffer>][] = [
    ['gzip (kafkajs: zlib.unzip)', await gzip(records), (batch) => unzip(batch)],
    ['snappy', await snappyCompress(records), snappyDecompress],
    ['lz4', await compressFrame(records), lz4Decompress],
    ['zstd (fzstd)', Buffer.from(zstd.compress(records)), zstdDecompressBatch],
  ];
  console.log(`batch: ${BATCH} events, ${records.length} bytes; ${ROUNDS} rounds each`);
  console.log('| codec | compressed bytes | ms per batch | µs per event | MB/s |');
  console.log('|---|---|---|---|---|');
  for (const [name, compressed, decompress] of codecs) {
    const back = await decompress(compressed);
    if (!back.equals(records)) throw new Error(`${name}: the batch read back differs`);
    for (let i = 0; i < ROUNDS / 10; i++) await decompress(compressed); // warm-up
    const started = performance.now();
    for (let i = 0; i < ROUNDS; i++) await decompress(compressed);
    const ms = (performance.now() - started) / ROUNDS;
    console.log(`| ${name} | ${compressed.length} | ${ms.toFixed(3)} | ${((ms * 1000) / BATCH).toFixed(2)} | ${(records.length / ms / 1000).toFixed(0)} |`);
  }
}

await main();
