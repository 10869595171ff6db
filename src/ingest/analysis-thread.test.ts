import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { getHeapStatistics } from 'node:v8';
import { afterEach, describe, expect, it } from 'vitest';
import { capturedLogs } from '../../test/support/logs.ts';
import { writeMmdb } from '../../test/support/mmdb.ts';
import type { RequestEvent } from '../events/request-event.ts';
import { EVENT_TIME_RANGE } from '../events/request-event.ts';
import { createLogger } from '../logger.ts';
import { AnalysisThread, startWorkerThread, type Detection } from './analysis-thread.ts';
import { MAX_DEAD_LETTER_PAYLOAD, toDeadLetter } from './dead-letter.ts';
import { MAX_COPIED_VALUE_BYTES } from './validate-batch.ts';

function event(i: number, timestamp: number, status: number): RequestEvent {
  return {
    eventId: `e${i}`,
    timestamp,
    merchantId: 'm_1',
    plan: 'business',
    apiKeyId: 'pk_live_a',
    environment: 'live',
    ip: `203.0.113.${i % 250}`,
    userAgent: 'okhttp/4.12.0',
    method: 'POST',
    path: '/v1/verify/sessions',
    status,
    responseTimeMs: 50,
  };
}

describe('AnalysisThread', () => {
  let analysis: AnalysisThread | undefined;
  afterEach(() => analysis?.close());

  /** A thread with detection on, and the detections it sends unasked. */
  async function startThread() {
    const thread = new AnalysisThread(
      { dedupCacheSize: 100_000, eventTimes: EVENT_TIME_RANGE, detection: true, entitledPlans: ['business'], maxWindowEvents: 1_000_000 },
      createLogger('silent'),
    );
    const unasked: Detection[] = [];
    thread.onDeferredDetection = (detection) => unasked.push(detection);
    await thread.ready;
    return { thread, unasked };
  }

  it('geolocates with the ASN database it is given (GEOIP_ASN_DB): impossible travel names each end\'s operator', async () => {
    // The bundled city database places 8.8.8.8 in Mountain View and 52.95.110.1 in New York, 4,100 km apart.
    const dir = await mkdtemp(join(tmpdir(), 'analysis-asn-'));
    try {
      const asnDb = join(dir, 'asn.mmdb');
      const operator = { autonomous_system_number: 64500, autonomous_system_organization: 'Example Carrier' };
      await writeMmdb(asnDb, [{ cidr: '8.8.8.0/24', record: operator }, { cidr: '52.95.110.0/24', record: operator }], { databaseType: 'GeoLite2-ASN', ipVersion: 6 });
      const now = Date.now();
      const hop = [
        ...Array.from({ length: 10 }, (_, i) => ({ ...event(i, now - 6 * 60_000 + i * 30_000, 201), ip: '8.8.8.8' })),
        { ...event(10, now - 30_000, 201), ip: '52.95.110.1' },
      ];
      const travelFound = async (geoAsnDb?: string) => {
        const thread = new AnalysisThread(
          { dedupCacheSize: 1_000, eventTimes: EVENT_TIME_RANGE, detection: true, entitledPlans: ['business'], maxWindowEvents: 1_000_000, geoAsnDb },
          createLogger('silent'),
        );
        try {
          await thread.ready;
          return (await thread.detect(hop)).findings.filter((f) => f.ruleId === 'impossible_travel').map((f) => f.finding.summary);
        } finally {
          await thread.close();
        }
      };
      expect(await travelFound()).toEqual([expect.stringMatching(/\(Mountain View, US\) and .* \(New York, US\), /)]);
      expect(await travelFound(asnDb)).toEqual([
        expect.stringMatching(/\(Mountain View, US, AS64500 Example Carrier\) and .* \(New York, US, AS64500 Example Carrier\), .*both addresses are AS64500's, in US/),
      ]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('warns at start of an IPv4-only GeoIP database, naming the file', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'analysis-asn-'));
    try {
      const asnDb = join(dir, 'asn-ipv4.mmdb');
      await writeMmdb(asnDb, [{ cidr: '8.8.8.0/24', record: { autonomous_system_number: 15169 } }], { databaseType: 'GeoLite2-ASN', ipVersion: 4 });
      const { logger, lines } = capturedLogs<{ level: number; component?: string; msg: string }>();
      analysis = new AnalysisThread({ dedupCacheSize: 1_000, eventTimes: EVENT_TIME_RANGE, detection: true, entitledPlans: ['business'], maxWindowEvents: 1_000_000, geoAsnDb: asnDb }, logger);
      await analysis.ready;
      expect(lines).toEqual([expect.objectContaining({ level: 40, component: 'analysis', msg: `${asnDb} holds IPv4 addresses only: requests from IPv6 addresses get no place or operator from it; use a database that covers both` })]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('rejects a value over V8\'s longest string as too large, takes a key as long for no apiKeyId, and goes on with the batch (a compressed batch can expand to them)', async () => {
    analysis = new AnalysisThread({ dedupCacheSize: 1_000, eventTimes: EVENT_TIME_RANGE, detection: false, entitledPlans: ['business'], maxWindowEvents: 1_000_000 }, createLogger('silent'));
    await analysis.ready;
    const huge = Buffer.alloc(0x1fffffe8 + 1, 'A'); // one character more than a string may hold
    const good = event(0, Date.now() - 1_000, 201);
    const message = (value: Buffer, offset: number) => ({ key: Buffer.from(good.apiKeyId), value, offset: String(offset), timestamp: String(Date.now()), attributes: 0, headers: {} });
    // And a key as long, on a valid event: no apiKeyId could be it.
    const hugeKey = { ...message(Buffer.from(JSON.stringify({ ...good, eventId: 'e_huge_key' })), 9), key: huge };
    const result = await analysis.analyzeBatch('api.request-metadata', 0, [message(huge, 7), message(Buffer.from(JSON.stringify(good)), 8), hugeKey]);
    expect({ rows: result.rowCount, misrouted: result.misrouted }).toEqual({ rows: 2, misrouted: 1 });
    expect(result.rejections).toEqual([expect.objectContaining({ index: 0, offset: '7', rejection: expect.objectContaining({ reason: 'too_large' }) })]);
    // Only the head crossed to the thread: more than a dead letter keeps, so its letter says it was cut.
    expect(result.rejections[0]!.text.length).toBe(MAX_COPIED_VALUE_BYTES);
    expect(toDeadLetter(result.rejections[0]!.rejection, result.rejections[0]!.text, { topic: 'api.request-metadata', partition: 0, offset: '7' })).toMatchObject({ payloadTruncated: true, payload: 'A'.repeat(MAX_DEAD_LETTER_PAYLOAD) });
  });

  it('reports its own heap with each detection, against the limit it was given (DETECTION_MAX_HEAP_MB)', async () => {
    analysis = new AnalysisThread({ dedupCacheSize: 1_000, eventTimes: EVENT_TIME_RANGE, detection: true, entitledPlans: ['business'], maxWindowEvents: 1_000_000, maxHeapMb: 96 }, createLogger('silent'));
    await analysis.ready;
    const { heap } = await analysis.detect([event(0, Date.now() - 1_000, 201)]);
    // V8's limit is the old generation's plus three semi-spaces: 96 + 48 MiB with the 16 MB ones
    // startWorkerThread gives the thread (Node 24 would give it 64 MB ones: 96 + 192), far under the
    // default that the test's own thread has (about 4 GiB).
    expect(heap!.limitBytes / 2 ** 20).toBeGreaterThanOrEqual(96);
    expect(heap!.limitBytes / 2 ** 20).toBeLessThan(96 + 192);
    expect(heap!.limitBytes).toBeLessThan(getHeapStatistics().heap_size_limit / 4);
    expect(heap!.usedBytes).toBeGreaterThan(1_000_000);
    expect(heap!.usedBytes).toBeLessThan(heap!.limitBytes);
  });

  it('sends unasked what a key waiting out REJUDGE_MS is found to have done, when no batch follows', async () => {
    const { thread, unasked } = await startThread();
    analysis = thread;
    // The thread judges as of the events' times (never later than its clock): 40 requests of a key in
    // one second, 30 of them 401, end just before now; high_failure_rate finds a medium brute force.
    const start = Date.now() - 1_200;
    const first = await analysis.detect(Array.from({ length: 40 }, (_, i) => event(i, start + i * 25, i < 30 ? 401 : 201)));
    // (Only high_failure_rate's findings are looked at: the test is about its wait, not what else the burst is.)
    const failureRate = (findings: Detection['findings']) => findings.filter((f) => f.ruleId === 'high_failure_rate');
    expect(failureRate(first.findings).map((f) => [f.ruleId, f.finding.severity])).toEqual([['high_failure_rate', 'medium']]);
    // The guessing then runs flat out (critical), within REJUDGE_MS of that finding: the key waits.
    const burst = await analysis.detect(Array.from({ length: 1_200 }, (_, i) => event(100 + i, start + 1_000 + Math.floor(i / 6), 401)));
    expect(failureRate(burst.findings)).toEqual([]);
    // Nothing else is posted: the thread judges the key itself once the wait is over.
    await expect.poll(() => unasked.flatMap((detection) => failureRate(detection.findings).map((f) => f.finding.severity)), { timeout: 5_000 }).toEqual(['critical']);
    expect(unasked[0]!.load?.trackedKeys).toBe(1);
  });

  it('judges a key under attack at most about twice a second when its events reach detection late: the timer leaves a partition taking batches to them', async () => {
    const { thread, unasked } = await startThread();
    analysis = thread;
    // A brute force whose events reach detection 700 ms after they happened (producer batching, consumer lag):
    // every REJUDGE_MS wait, in event time, is over by the clock when it starts.
    const lagMs = 700;
    const start = Date.now();
    await analysis.detect(Array.from({ length: 200 }, (_, i) => event(i, start - lagMs - 40_000 + i * 200, 401)));
    const judgements = new Map<string, number>();
    const count = (findings: readonly { ruleId: string }[]) => {
      for (const { ruleId } of findings) judgements.set(ruleId, (judgements.get(ruleId) ?? 0) + 1);
    };
    let i = 1_000;
    while (Date.now() - start < 3_000) {
      const now = Date.now();
      count((await analysis.detect(Array.from({ length: 5 }, (_, j) => event(i++, now - lagMs - 25 + j * 5, 401)))).findings);
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
    await new Promise((resolve) => setTimeout(resolve, 600)); // and the timer's, once the batches stop
    for (const detection of unasked) count(detection.findings);
    // Per rule that fires (high_failure_rate; all of it within 60 s is no velocity_attack): about two
    // a second over 3 s, the first, and the timer's once the batches stop. Judged by the timer between
    // batches, as of a time ahead of their events, it was about 60 each.
    expect(judgements.get('high_failure_rate')).toBeGreaterThanOrEqual(3);
    expect(Math.max(...judgements.values()), JSON.stringify([...judgements])).toBeLessThanOrEqual(12);
  }, 20_000);
});

describe('startWorkerThread', () => {
  /** The new space of the main thread and of a thread it starts, in MiB (test/support/young-generation-probe.ts). */
  async function newSpacesMb(nodeOptions: string[]): Promise<{ main: number; thread: number }> {
    const probe = fileURLToPath(new URL('../../test/support/young-generation-probe.ts', import.meta.url));
    const { stdout } = await promisify(execFile)(process.execPath, [...nodeOptions, '--import', 'tsx', probe], { timeout: 60_000 });
    return JSON.parse(stdout) as { main: number; thread: number };
  }

  it('gives the thread semi-spaces of 16 MB when the main thread runs with 64 MB ones', async () => {
    const { main, thread } = await newSpacesMb(['--max-semi-space-size=64']);
    // The main thread grows its young generation only after the thread has started (as the worker's
    // does, under Kafka intake): it still reaches two semi-spaces of 64 MB.
    expect(main).toBe(128);
    expect(thread).toBeGreaterThan(0);
    expect(thread).toBeLessThanOrEqual(32); // two of 16 MB at most
  });

  it('gives it the same in a process started without the flag (Node 24 would give it 64 MB)', async () => {
    const { thread } = await newSpacesMb([]);
    expect(thread).toBeGreaterThan(0);
    expect(thread).toBeLessThanOrEqual(32);
  });
});
