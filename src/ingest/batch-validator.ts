/**
 * The main thread's handle on the validator thread. validate() posts a batch and resolves with its
 * rows; results come back in the order batches were posted. If the thread dies, every pending and
 * later call rejects: the intake then stops committing and Kafka redelivers from the last commit.
 */
import type { KafkaMessage } from 'kafkajs';
import { Worker } from 'node:worker_threads';
import type { RawBatch, ValidatedBatch } from './validate-batch.ts';

type Pending = { resolve(result: ValidatedBatch): void; reject(error: Error): void };

export class BatchValidator {
  private readonly worker: Worker;
  private readonly pending = new Map<number, Pending>();
  private nextId = 0;
  private failure: Error | undefined;

  constructor(options: { dedupCacheSize: number }) {
    // The .mjs entry registers the TypeScript loader in the thread, however the main thread was started.
    this.worker = new Worker(new URL('./validator-thread.mjs', import.meta.url), {
      workerData: { dedupCacheSize: options.dedupCacheSize },
    });
    this.worker.on('message', (message: { id: number; result?: ValidatedBatch; error?: string }) => {
      const pending = this.pending.get(message.id);
      this.pending.delete(message.id);
      if (!pending) return;
      if (message.result) pending.resolve({ ...message.result, rows: Buffer.from(message.result.rows.buffer, message.result.rows.byteOffset, message.result.rows.byteLength) });
      else pending.reject(new Error(`validator thread: ${message.error}`));
    });
    this.worker.on('error', (error) => this.fail(error));
    this.worker.on('exit', (code) => this.fail(new Error(`validator thread exited with code ${code}`)));
  }

  validate(topic: string, partition: number, messages: readonly KafkaMessage[]): Promise<ValidatedBatch> {
    if (this.failure) return Promise.reject(this.failure);
    const batch = packBatch(topic, partition, messages);
    const id = this.nextId++;
    return new Promise<ValidatedBatch>((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.worker.postMessage({ id, batch }, [batch.values.buffer as ArrayBuffer]);
    });
  }

  async close(): Promise<void> {
    this.failure ??= new Error('validator closed');
    await this.worker.terminate();
  }

  private fail(error: Error): void {
    this.failure ??= error;
    for (const pending of this.pending.values()) pending.reject(this.failure);
    this.pending.clear();
  }
}

/** Copies the message values into one transferable buffer. */
function packBatch(topic: string, partition: number, messages: readonly KafkaMessage[]): RawBatch {
  let total = 0;
  for (const message of messages) total += message.value?.length ?? 0;
  const values = new Uint8Array(total);
  const ends = new Uint32Array(messages.length);
  const offsets = new Float64Array(messages.length);
  let position = 0;
  messages.forEach((message, index) => {
    if (message.value) {
      values.set(message.value, position);
      position += message.value.length;
    }
    ends[index] = position;
    offsets[index] = Number(message.offset);
  });
  return { topic, partition, values, ends, offsets };
}
