import { describe, expect, it } from 'vitest';
import type { Detection } from '../ingest/analysis-thread.ts';
import { capturedLogs } from '../../test/support/logs.ts';
import type { SprayedRequests } from './source-spray.ts';
import { SprayAcrossReplicas } from './spray-across-replicas.ts';

const NOW = Date.UTC(2026, 10, 29, 12, 0, 0);
const KEY: SprayedRequests = {
  network: '203.0.113.0/24',
  merchantId: 'm_1',
  apiKeyId: 'pk_live_1',
  partition: 3,
  ip: '203.0.113.9',
  userAgent: 'curl/8.5.0',
  failures: 1,
  judged: 1,
  first: NOW - 1_000,
  newest: NOW - 1_000,
  newestEventId: 'e1',
  country: undefined,
  plan: 'business',
  keyRows: 1,
  keyFailures: 1,
  keyJudged: 1,
  keyLive: true,
};

function setUp(options: { owned: number[]; read?: () => Promise<SprayedRequests[]> }) {
  const calls = { reads: [] as { notBefore: number; clock: number; until: number; owned: readonly number[] }[], judged: [] as SprayedRequests[][], detections: [] as Detection[] };
  let owned = new Set(options.owned);
  const { logger, lines } = capturedLogs();
  const reader = new SprayAcrossReplicas({
    owned: () => owned,
    read: async ({ notBefore, clock, until }, ownedNow) => {
      calls.reads.push({ notBefore: notBefore.getTime(), clock: clock.getTime(), until: until.getTime(), owned: ownedNow });
      return options.read ? options.read() : [KEY];
    },
    judge: async (keys) => {
      calls.judged.push(keys);
      return { findings: [], ruleErrors: [] };
    },
    onDetection: (detection) => calls.detections.push(detection),
    logger,
    everyMs: 10,
    now: () => NOW,
  });
  return { reader, calls, lines, own: (partitions: number[]) => (owned = new Set(partitions)) };
}

describe('SprayAcrossReplicas', () => {
  it('reads as of storage\'s newest 401 (up to 5 minutes ahead, as admission takes events, and an hour behind) while it owns partition 0, naming the partitions it owns, and hands each reading to detection', async () => {
    const { reader, calls } = setUp({ owned: [0, 2] });
    await reader.check();
    expect(calls.reads).toEqual([{ notBefore: NOW - 60 * 60_000, clock: NOW, until: NOW + 5 * 60_000, owned: [0, 2] }]);
    expect(calls.judged).toEqual([[KEY]]);
    expect(calls.detections).toHaveLength(1);
  });

  it('reads nothing without partition 0', async () => {
    const { reader, calls, own } = setUp({ owned: [1, 2] });
    await reader.check();
    expect(calls.reads).toEqual([]);
    own([0, 1]);
    await reader.check();
    own([1]);
    await reader.check();
    expect(calls.reads).toHaveLength(1);
    expect(calls.judged).toEqual([[KEY]]);
  });

  it('does not start reading once stopped (a start-up that ends after the stop began)', async () => {
    const { reader, calls } = setUp({ owned: [0] });
    await reader.stop();
    reader.start();
    await new Promise((resolve) => setTimeout(resolve, 30));
    expect(calls.reads).toEqual([]);
  });

  it('logs failed readings as one failure and goes on to the next; a check during a reading joins it', async () => {
    let fail = true;
    const { reader, calls, lines } = setUp({ owned: [0], read: async () => (fail ? Promise.reject(new Error('storage down')) : [KEY]) });
    await reader.check();
    await reader.check();
    expect(calls.judged).toEqual([]);
    expect(lines).toEqual([expect.objectContaining({ level: 40, msg: expect.stringMatching(/^cannot read or judge the keys sprayed across replicas/) })]);
    fail = false;
    await Promise.all([reader.check(), reader.check()]);
    expect(calls.judged).toEqual([[KEY]]);
    expect(lines.slice(1)).toEqual([expect.objectContaining({ level: 30, msg: 'the keys sprayed across replicas are read again', failures: 2 })]);
  });
});
