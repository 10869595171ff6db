import { describe, expect, it } from 'vitest';
import { EventWindow } from './event-window.ts';
import type { WindowEvent } from './types.ts';

const MINUTE = 60_000;
const T0 = Date.UTC(2026, 10, 20, 12, 0, 0);

function event(id: string, timestamp: number, network: string): WindowEvent {
  return { eventId: id, timestamp, ip: '203.0.113.1', network, userAgent: 'ua', method: 'GET', path: '/', status: 200, responseTimeMs: 1, rateLimitPerMinute: 60 };
}

function windowOf(events: WindowEvent[]): EventWindow {
  const window = new EventWindow();
  for (const e of events) window.insert(e);
  return window;
}

const ids = (events: readonly WindowEvent[]) => events.map((e) => e.eventId);

describe('EventWindow.thin', () => {
  it('keeps the first and the last event of each group in each minute, in time order, and returns the rest', () => {
    const events = [
      event('a1', T0 + 1_000, 'A'),
      event('b1', T0 + 2_000, 'B'),
      event('a2', T0 + 3_000, 'A'),
      event('a3', T0 + 4_000, 'A'),
      event('b2', T0 + 5_000, 'B'),
      event('a4', T0 + 6_000, 'A'),
      // The next minute: groups start again.
      event('a5', T0 + MINUTE + 1_000, 'A'),
      event('a6', T0 + MINUTE + 2_000, 'A'),
      event('a7', T0 + MINUTE + 3_000, 'A'),
      // Not thinned: at or after `to`.
      event('a8', T0 + 2 * MINUTE, 'A'),
      event('a9', T0 + 2 * MINUTE + 1, 'A'),
      event('a10', T0 + 2 * MINUTE + 2, 'A'),
    ];
    const window = windowOf(events);
    const removed = window.thin(T0, T0 + 2 * MINUTE, (e) => e.network);
    expect(ids(removed).sort()).toEqual(['a2', 'a3', 'a6'].sort());
    expect(ids(window.toArray())).toEqual(['a1', 'b1', 'b2', 'a4', 'a5', 'a7', 'a8', 'a9', 'a10']);
    expect(window.size).toBe(9);
    expect(window.oldestTime).toBe(T0 + 1_000);
    // Thinning the same span again changes nothing.
    expect(window.thin(T0, T0 + 2 * MINUTE, (e) => e.network)).toEqual([]);
  });

  it('thins only [from, to), after older events have left the front', () => {
    const events = Array.from({ length: 12 }, (_, i) => event(`e${i}`, T0 + i * 10_000, 'A')); // two minutes, six a minute
    const window = windowOf(events);
    window.dropOldest();
    const removed = window.thin(T0 + MINUTE, T0 + 2 * MINUTE, (e) => e.network);
    expect(ids(removed)).toEqual(['e7', 'e8', 'e9', 'e10']);
    expect(ids(window.toArray())).toEqual(['e1', 'e2', 'e3', 'e4', 'e5', 'e6', 'e11']);
  });
});
