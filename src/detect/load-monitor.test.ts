import { describe, expect, it } from 'vitest';
import { createLogger } from '../logger.ts';
import { WorkerMetrics } from '../metrics.ts';
import type { EngineLoad } from './engine.ts';
import { DetectionLoadMonitor, WARNING_INTERVAL_MS } from './load-monitor.ts';

const WHOLE: EngineLoad = { windowEvents: 1_000, trackedKeys: 10, eventsPerKeyCap: 5_000, maxEventsPerKey: 5_000, maxWindowEvents: 10_000, shedEvents: 0, forgottenKeys: 0, thinnedEvents: 0, futureEvents: 0, eventsWithoutLimit: 0, merchantsWithoutLimit: [], idleHistories: 0, historyEntries: 0, shedHistories: 0, tallyEntries: 0, sprayEntries: 0 };

function monitor(clock?: () => number) {
  const lines: { level: number; msg: string }[] = [];
  const logger = createLogger('info', { write: (line: string) => lines.push(JSON.parse(line)) });
  const metrics = new WorkerMetrics({ defaultMetrics: false });
  const value = async (name: string) => (await metrics.registry.getSingleMetric(name)!.get()).values[0]?.value ?? 0;
  return { loads: new DetectionLoadMonitor(metrics, logger, clock), lines, value };
}

describe('DetectionLoadMonitor', () => {
  it('warns once when the windows start shedding, notes when they stop, and counts what was shed', async () => {
    const { loads, lines, value } = monitor();
    loads.record(WHOLE);
    loads.record({ ...WHOLE, windowEvents: 9_000, eventsPerKeyCap: 800, shedEvents: 4_000 });
    loads.record({ ...WHOLE, windowEvents: 9_000, eventsPerKeyCap: 800, shedEvents: 4_500, forgottenKeys: 3 });
    expect(lines.map((line) => [line.level, line.msg.slice(0, 40)])).toEqual([[40, 'detection windows are over their memory ']]);
    expect(await value('security_center_detection_shed_events_total')).toBe(4_500);
    expect(await value('security_center_detection_forgotten_keys_total')).toBe(3);
    expect(await value('security_center_detection_events_per_key_cap')).toBe(800);
    expect(await value('security_center_detection_window_events')).toBe(9_000);

    loads.record({ ...WHOLE, shedEvents: 4_500, forgottenKeys: 3 });
    expect(lines.at(-1)).toMatchObject({ level: 30, msg: 'detection windows are within their memory budget again' });
    expect(await value('security_center_detection_events_per_key_cap')).toBe(5_000);
  });

  it('shows the idle keys\' histories, every history\'s entries, the spray tally\'s and the analysis thread\'s heap', async () => {
    const { loads, value } = monitor();
    loads.record({ ...WHOLE, idleHistories: 40, historyEntries: 1_300, sprayEntries: 75 }, { usedBytes: 300 * 2 ** 20, limitBytes: 1_024 * 2 ** 20 });
    expect(await value('security_center_detection_spray_entries')).toBe(75);
    expect(await value('security_center_detection_heap_used_bytes')).toBe(300 * 2 ** 20);
    expect(await value('security_center_detection_heap_limit_bytes')).toBe(1_024 * 2 ** 20);
    expect(await value('security_center_detection_idle_key_histories')).toBe(40);
    expect(await value('security_center_detection_key_history_entries')).toBe(1_300);
  });

  it('counts idle histories shed for the budget, warning of them at most every ten minutes', async () => {
    let now = 0;
    const { loads, lines, value } = monitor(() => now);
    const warnings = () => lines.filter((line) => line.level === 40).map((line) => (line as { shedHistories?: number }).shedHistories);
    loads.record({ ...WHOLE, idleHistories: 900, shedHistories: 100 });
    now += 60_000;
    loads.record({ ...WHOLE, idleHistories: 900, shedHistories: 150 });
    now += WARNING_INTERVAL_MS;
    loads.record({ ...WHOLE, idleHistories: 900, shedHistories: 150 });
    loads.record({ ...WHOLE, idleHistories: 900, shedHistories: 170 });
    expect(await value('security_center_detection_shed_key_histories_total')).toBe(170);
    // The first at once; the next ten minutes later, with the 50 shed since; the last 20 wait.
    expect(warnings()).toEqual([100, 50]);
    now += WARNING_INTERVAL_MS;
    loads.record({ ...WHOLE, shedHistories: 170 });
    expect(warnings()).toEqual([100, 50, 20]);
    // Nothing shed since, nothing said; the windows' own warning is not raised by histories alone.
    now += WARNING_INTERVAL_MS;
    loads.record({ ...WHOLE, shedHistories: 170 });
    expect(warnings()).toEqual([100, 50, 20]);
    expect(lines.some((line) => line.msg.startsWith('detection windows'))).toBe(false);
  });

  it('counts on when a new engine reports, whose counts start again from zero', async () => {
    const { loads, value } = monitor();
    loads.record({ ...WHOLE, shedEvents: 700 });
    loads.record({ ...WHOLE, shedEvents: 50 });
    loads.record({ ...WHOLE, shedEvents: 80 });
    expect(await value('security_center_detection_shed_events_total')).toBe(700 + 80);
  });

  it('counts the events left out for being dated ahead of the clock', async () => {
    const { loads, value, lines } = monitor();
    loads.record({ ...WHOLE, futureEvents: 3 });
    loads.record({ ...WHOLE, futureEvents: 5 });
    expect(await value('security_center_detection_future_events_total')).toBe(5);
    expect(lines).toEqual([]);
  });

  it('counts the events thinned out of busy keys\' history, without a warning: their windows are whole', async () => {
    const { loads, value, lines } = monitor();
    loads.record({ ...WHOLE, thinnedEvents: 1_200 });
    loads.record({ ...WHOLE, thinnedEvents: 3_000 });
    expect(await value('security_center_detection_thinned_events_total')).toBe(3_000);
    expect(lines).toEqual([]);
  });

  it('counts the events velocity_attack cannot judge for want of a limit, warning of them at most every ten minutes with the merchants', async () => {
    let now = 0;
    const { loads, lines, value } = monitor(() => now);
    const warnings = () => lines.filter((line) => line.level === 40) as unknown as { events: number; merchants: string[]; msg: string }[];
    loads.record({ ...WHOLE, eventsWithoutLimit: 40, merchantsWithoutLimit: ['m_ent'] });
    now += 60_000;
    loads.record({ ...WHOLE, eventsWithoutLimit: 90, merchantsWithoutLimit: ['m_other'] });
    // A load without new events (after a deferred judgement) repeats the last batch's merchants: they are not news.
    loads.record({ ...WHOLE, eventsWithoutLimit: 90, merchantsWithoutLimit: ['m_stale'] });
    loads.record({ ...WHOLE, eventsWithoutLimit: 95, merchantsWithoutLimit: ['m_a', 'm_b', 'm_c', 'm_d', 'm_e'] });
    expect(await value('security_center_detection_events_without_limit_total')).toBe(95);
    expect(warnings().map(({ events, merchants }) => ({ events, merchants }))).toEqual([{ events: 40, merchants: ['m_ent'] }]);
    expect(warnings()[0]!.msg).toContain('rateLimitPerMinute');
    // Ten minutes on: the events since, and their merchants, at most five (m_ent, fixed since, is not named again).
    now += WARNING_INTERVAL_MS;
    loads.record({ ...WHOLE, eventsWithoutLimit: 95, merchantsWithoutLimit: ['m_a'] });
    expect(warnings().map(({ events, merchants }) => ({ events, merchants }))).toEqual([
      { events: 40, merchants: ['m_ent'] },
      { events: 55, merchants: ['m_other', 'm_a', 'm_b', 'm_c', 'm_d'] },
    ]);
    // None since: nothing more is said.
    now += WARNING_INTERVAL_MS;
    loads.record({ ...WHOLE, eventsWithoutLimit: 95, merchantsWithoutLimit: ['m_a'] });
    expect(warnings()).toHaveLength(2);
  });
});
