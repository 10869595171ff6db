/**
 * Prints, as JSON, the new space (the young generation's two semi-spaces) of this process's main
 * thread, before and after it starts a thread with startWorkerThread, and of that thread, in MiB,
 * each read after allocating enough short-lived objects to grow it to its maximum. Run by analysis-thread.test.ts with and without
 * `--max-semi-space-size`.
 */
import { getHeapSpaceStatistics } from 'node:v8';
import { startWorkerThread } from '../../src/ingest/analysis-thread.ts';

function churnThenNewSpaceMb(): number {
  let kept: { i: number; text: string }[] = [];
  for (let i = 0; i < 3_000_000; i++) {
    kept.push({ i, text: `x${i}` });
    if (kept.length > 200_000) kept = [];
  }
  return getHeapSpaceStatistics().find((space) => space.space_name === 'new_space')!.space_size / 2 ** 20;
}

const main = churnThenNewSpaceMb();
// The thread runs the same function, as plain JavaScript (tsx compiles this file's copy).
const threadCode = `const { getHeapSpaceStatistics } = require('node:v8');
require('node:worker_threads').parentPort.postMessage((${churnThenNewSpaceMb.toString()})());`;
const worker = startWorkerThread(threadCode, { eval: true });
const thread = await new Promise<number>((resolve, reject) => worker.once('message', resolve).once('error', reject));
await worker.terminate();
const mainAfter = churnThenNewSpaceMb();
console.log(JSON.stringify({ main, mainAfter, thread }));
