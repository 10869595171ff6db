/**
 * Starts a thread with startWorkerThread, then prints, as JSON, the new space (the young
 * generation's two semi-spaces) of that thread and of this process's main thread, in MiB. Each is
 * read after allocating enough short-lived objects to grow it to its maximum, the main thread's after
 * the thread has started (and the flag was set back), as in the worker. Run by
 * analysis-thread.test.ts with and without `--max-semi-space-size`.
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

// The thread runs the same function, as plain JavaScript (tsx compiles this file's copy).
const threadCode = `const { getHeapSpaceStatistics } = require('node:v8');
require('node:worker_threads').parentPort.postMessage((${churnThenNewSpaceMb.toString()})());`;
const worker = startWorkerThread(threadCode, { eval: true });
const thread = await new Promise<number>((resolve, reject) => worker.once('message', resolve).once('error', reject));
await worker.terminate();
const main = churnThenNewSpaceMb();
console.log(JSON.stringify({ main, thread }));
