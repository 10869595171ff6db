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

  it('takes no limit or time from the requests answered 5xx, which it counts apart', () => {
    const tally = new DroppedRequestTally();
    const minute = T0 / MINUTE;
    for (const event of [dropped(T0 + 1_000, 503, 1_000), dropped(T0 + 30_000, 201, 60), dropped(T0 + 50_000, 502, 1_000)]) tally.add(event);
    expect([tally.count(minute), tally.serverErrors(minute), tally.highestLimit(minute), tally.earliest(minute), tally.latest(minute)]).toEqual([3, 2, 60, T0 + 30_000, T0 + 30_000]);
  });

  it('keeps its latest 21 minutes, by 10-second step: an older one counts 0', () => {
    const tally = new DroppedRequestTally();
    const minute = T0 / MINUTE;
    tally.add(dropped(T0));
    tally.add(dropped(T0 + 16 * MINUTE));
    expect([tally.count(minute), tally.count(minute + 16)]).toEqual([1, 1]);
    tally.add(dropped(T0 + 128 * 10_000)); // 128 steps later, 21 min 20 s: takes the first step's slot
    expect([tally.count(minute), tally.count(minute + 16), tally.count(minute + 21)]).toEqual([0, 1, 1]);
    tally.add(dropped(T0 + 5_000)); // its step's slot holds a later one: too old to record
    expect(tally.count(minute)).toBe(0);
  });

  it('counts the answered requests of the 10-second steps wholly within a span', () => {
    const tally = new DroppedRequestTally();
    for (const at of [T0 + 1_000, T0 + 9_000, T0 + 15_000, T0 + 25_000]) tally.add(dropped(at));
    tally.add(dropped(T0 + 12_000, 503));
    expect(tally.answeredBetween(T0, T0 + 20_000)).toBe(3); // two steps: 2 + 1 (the 503 left out)
    expect(tally.answeredBetween(T0 + 5_000, T0 + 30_000)).toBe(2); // the steps at 10 s and 20 s
    expect(tally.answeredBetween(T0, T0 + 9_999)).toBe(0); // no step wholly within
  });

  it('says whether it holds 401s, and counts without them when asked', () => {
    const tally = new DroppedRequestTally();
    const minute = T0 / MINUTE;
    for (const event of [dropped(T0 + 1_000), dropped(T0 + 12_000, 503), dropped(T0 + 15_000)]) tally.add(event);
    expect(tally.holdsRefused()).toBe(false);
    for (const event of [dropped(T0 + 2_000, 401), dropped(T0 + 16_000, 401), dropped(T0 + 17_000, 401)]) tally.add(event);
    expect(tally.holdsRefused()).toBe(true);
    const authenticated = tally.withoutRefused();
    expect([tally.count(minute), authenticated.count(minute), authenticated.serverErrors(minute)]).toEqual([6, 3, 1]);
    expect([tally.answeredBetween(T0, T0 + 20_000), authenticated.answeredBetween(T0, T0 + 20_000)]).toEqual([5, 2]);
  });
});
