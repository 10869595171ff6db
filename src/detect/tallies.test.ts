import { describe, expect, it } from 'vitest';
import { DroppedRequestTally } from './tallies.ts';
import type { WindowEvent } from './types.ts';

const T0 = Date.UTC(2026, 10, 20, 12, 0, 0);
const MINUTE = 60_000;

function dropped(timestamp: number, status = 201, rateLimitPerMinute = 60): WindowEvent {
  return { eventId: `e${timestamp}`, timestamp, status, rateLimitPerMinute, ip: '203.0.113.7', network: '203.0.113.0/24', userAgent: 'curl/8.5.0' } as WindowEvent;
}

describe('DroppedRequestTally', () => {
  it('counts the requests the cap dropped per minute, their 5xx, highest limit and span', () => {
    const tally = new DroppedRequestTally();
    const minute = T0 / MINUTE;
    for (const event of [dropped(T0 + 5_000), dropped(T0 + 20_000, 503, 0), dropped(T0 + 59_999, 429, 120), dropped(T0 + MINUTE + 1)]) tally.add(event);
    expect([tally.count(minute), tally.serverErrors(minute), tally.highestLimit(minute), tally.earliest(minute), tally.latest(minute)]).toEqual([3, 1, 120, T0 + 5_000, T0 + 59_999]);
    expect(tally.count(minute + 1)).toBe(1);
    expect([tally.count(minute - 1), tally.highestLimit(minute - 1), tally.earliest(minute - 1)]).toEqual([0, 0, Number.NaN]);
  });

  it('keeps the latest 16 minutes it dropped requests of: an older minute counts 0', () => {
    const tally = new DroppedRequestTally();
    const minute = T0 / MINUTE;
    tally.add(dropped(T0));
    tally.add(dropped(T0 + 16 * MINUTE)); // takes the first minute's slot
    expect(tally.count(minute)).toBe(0);
    expect(tally.count(minute + 16)).toBe(1);
    tally.add(dropped(T0 + 30_000)); // too old to record
    expect(tally.count(minute)).toBe(0);
  });
});
