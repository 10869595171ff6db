/**
 * The validator thread (started through validator-thread.mjs): validates Kafka batches off the main thread, in the order
 * they arrive, so that parsing and validation run on one core while the main thread fetches from
 * Kafka and the storage engine inserts on the other. Holds the RecentEventIds of the Kafka path.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { RecentEventIds } from './recent-event-ids.ts';
import { validateBatch, type RawBatch } from './validate-batch.ts';

const recentIds = new RecentEventIds((workerData as { dedupCacheSize: number }).dedupCacheSize);

parentPort!.on('message', (job: { id: number; batch: RawBatch }) => {
  try {
    const result = validateBatch(job.batch, recentIds);
    // Transfer the row bytes instead of copying them.
    parentPort!.postMessage({ id: job.id, result }, [result.rows.buffer as ArrayBuffer]);
  } catch (error) {
    parentPort!.postMessage({ id: job.id, error: error instanceof Error ? error.message : String(error) });
  }
});
