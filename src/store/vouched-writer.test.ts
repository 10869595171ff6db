import { describe, expect, it } from 'vitest';
import type { VouchedNetwork } from '../detect/engine.ts';
import { createLogger } from '../logger.ts';
import { MAX_HELD, VouchedWriter } from './vouched-writer.ts';

const logger = createLogger('silent');
const record = (partition: number, n: number): VouchedNetwork => ({ merchantId: 'm_1', apiKeyId: 'pk_live_a', partition, network: `198.51.${n}.0/24`, at: 1_700_000_000_000 + n });

/** A store that records what it was asked to insert, failing while `failing` is set. */
function fakeStore() {
  const inserted: { topic: string; rows: VouchedNetwork[] }[] = [];
  const store = {
    failing: false,
    inserted,
    async insertVouchedNetworks(topic: string, rows: readonly VouchedNetwork[]) {
      if (store.failing) throw new Error('storage unavailable');
      inserted.push({ topic, rows: [...rows] });
    },
  };
  return store;
}

describe('VouchedWriter', () => {
  it('writes what it holds grouped by topic (HTTP apart), and nothing when it holds nothing', async () => {
    const store = fakeStore();
    const writer = new VouchedWriter({ store, topicOf: (p) => (p < 0 ? '' : 'api.request-metadata'), logger, flushEveryMs: 60_000 });
    await writer.flush();
    expect(store.inserted).toEqual([]);
    writer.add([record(0, 1), record(-1, 2), record(3, 3)]);
    await writer.flush();
    expect(store.inserted).toEqual([
      { topic: 'api.request-metadata', rows: [record(0, 1), record(3, 3)] },
      { topic: '', rows: [record(-1, 2)] },
    ]);
    expect(writer.pending).toBe(0);
    await writer.stop();
  });

  it('keeps what a failed write held and writes it with the next, up to MAX_HELD', async () => {
    const store = fakeStore();
    const writer = new VouchedWriter({ store, topicOf: () => 't', logger, flushEveryMs: 60_000 });
    store.failing = true;
    writer.add([record(0, 1)]);
    await writer.flush();
    expect(writer.pending).toBe(1);
    writer.add([record(0, 2)]);
    store.failing = false;
    await writer.flush();
    expect(store.inserted).toEqual([{ topic: 't', rows: [record(0, 1), record(0, 2)] }]);
    writer.add(Array.from({ length: MAX_HELD + 10 }, (_, n) => record(0, n)));
    expect(writer.pending).toBe(MAX_HELD);
    await writer.stop();
  });

  it('writes on its own after flushEveryMs, and what is held at a stop', async () => {
    const store = fakeStore();
    const writer = new VouchedWriter({ store, topicOf: () => 't', logger, flushEveryMs: 20 });
    writer.add([record(0, 1)]);
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(store.inserted).toHaveLength(1);
    const stopping = new VouchedWriter({ store, topicOf: () => 't', logger, flushEveryMs: 60_000 });
    stopping.add([record(0, 2)]);
    await stopping.stop();
    expect(store.inserted).toHaveLength(2);
  });
});
