import { afterEach, describe, expect, it } from 'vitest';
import type { RequestEvent } from '../events/request-event.ts';
import { EVENT_TIME_RANGE } from '../events/request-event.ts';
import { createLogger } from '../logger.ts';
import { AnalysisThread, type Detection } from './analysis-thread.ts';

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

  it('sends unasked what a key waiting out REJUDGE_MS is found to have done, when no batch follows', async () => {
    analysis = new AnalysisThread(
      { dedupCacheSize: 1_000, eventTimes: EVENT_TIME_RANGE, detection: true, entitledPlans: ['business'], maxWindowEvents: 1_000_000 },
      createLogger('silent'),
    );
    const unasked: Detection[] = [];
    analysis.onDeferredDetection = (detection) => unasked.push(detection);
    await analysis.ready;
    // The thread judges as of the events' times (never later than its clock): 40 requests of a key in
    // one second, 30 of them 401, end just before now; high_failure_rate finds a medium brute force.
    const start = Date.now() - 1_200;
    const first = await analysis.detect(Array.from({ length: 40 }, (_, i) => event(i, start + i * 25, i < 30 ? 401 : 201)));
    expect(first.findings.map((f) => [f.ruleId, f.finding.severity])).toEqual([['high_failure_rate', 'medium']]);
    // The guessing then runs flat out (critical), within REJUDGE_MS of that finding: the key waits.
    const burst = await analysis.detect(Array.from({ length: 1_200 }, (_, i) => event(100 + i, start + 1_000 + Math.floor(i / 6), 401)));
    expect(burst.findings).toEqual([]);
    // Nothing else is posted: the thread judges the key itself once the wait is over.
    await expect.poll(() => unasked.flatMap((detection) => detection.findings.map((f) => f.finding.severity)), { timeout: 5_000 }).toEqual(['critical']);
    expect(unasked[0]!.load?.trackedKeys).toBe(1);
  });
});
