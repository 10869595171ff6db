import { describe, expect, it } from 'vitest';
import { BREAKER_PAUSE_MS, BREAKER_THRESHOLD, CircuitBreakers } from './breaker.ts';

const T0 = Date.UTC(2026, 10, 21, 10, 0, 0);

function failTimes(breakers: CircuitBreakers, endpointId: string, times: number, at = T0) {
  let last;
  for (let i = 0; i < times; i++) last = breakers.record(endpointId, false, at + i);
  return last;
}

describe('CircuitBreakers', () => {
  it('pauses an endpoint for an hour after 10 consecutive failures, not 9', () => {
    const breakers = new CircuitBreakers();
    expect(failTimes(breakers, 'e1', BREAKER_THRESHOLD - 1)).toBeUndefined(); // a count is not stored
    expect(breakers.pausedUntil('e1', T0 + 100)).toBeUndefined();
    const state = breakers.record('e1', false, T0 + 100);
    expect(state).toEqual({ endpointId: 'e1', consecutiveFailures: 10, pausedUntil: T0 + 100 + BREAKER_PAUSE_MS, updatedAt: T0 + 100 });
    expect(breakers.pausedUntil('e1', T0 + 100 + BREAKER_PAUSE_MS - 1)).toBe(T0 + 100 + BREAKER_PAUSE_MS);
    expect(breakers.pausedUntil('e1', T0 + 100 + BREAKER_PAUSE_MS)).toBeUndefined();
    expect(breakers.openCount(T0 + 200)).toBe(1);
  });

  it('is open from the pause until a success closes it, its pause over or not', () => {
    const breakers = new CircuitBreakers();
    failTimes(breakers, 'e1', BREAKER_THRESHOLD - 1);
    expect(breakers.isOpen('e1')).toBe(false);
    breakers.record('e1', false, T0 + 100);
    expect(breakers.isOpen('e1')).toBe(true);
    expect(breakers.pausedUntil('e1', T0 + 100 + BREAKER_PAUSE_MS)).toBeUndefined();
    expect(breakers.isOpen('e1')).toBe(true); // the pause is over: the next attempt decides
    breakers.record('e1', true, T0 + 100 + BREAKER_PAUSE_MS);
    expect(breakers.isOpen('e1')).toBe(false);
    expect(breakers.isOpen('e2')).toBe(false);
  });

  it('a success in between starts the count again', () => {
    const breakers = new CircuitBreakers();
    failTimes(breakers, 'e1', 9);
    expect(breakers.record('e1', true, T0 + 10)).toEqual({ endpointId: 'e1', consecutiveFailures: 0, pausedUntil: 0, updatedAt: T0 + 10 });
    failTimes(breakers, 'e1', 9, T0 + 20);
    expect(breakers.pausedUntil('e1', T0 + 30)).toBeUndefined();
  });

  it('after the hour, one failure pauses again and one success closes it', () => {
    const breakers = new CircuitBreakers();
    failTimes(breakers, 'e1', 10);
    const after = T0 + BREAKER_PAUSE_MS + 10;
    expect(breakers.record('e1', false, after)?.pausedUntil).toBe(after + BREAKER_PAUSE_MS);
    const later = after + BREAKER_PAUSE_MS;
    breakers.record('e1', true, later);
    expect(breakers.pausedUntil('e1', later)).toBeUndefined();
    expect(breakers.openCount(later)).toBe(0);
  });

  it('keeps endpoints apart and reports no change for a success on a healthy endpoint', () => {
    const breakers = new CircuitBreakers();
    failTimes(breakers, 'e1', 10);
    expect(breakers.pausedUntil('e2', T0 + 20)).toBeUndefined();
    expect(breakers.record('e2', true, T0 + 20)).toBeUndefined();
  });

  it('resumes from stored states (the longer pause wins)', () => {
    const breakers = new CircuitBreakers();
    breakers.merge([
      { endpointId: 'e1', consecutiveFailures: 10, pausedUntil: T0 + 1000, updatedAt: T0 },
      { endpointId: 'e1', consecutiveFailures: 3, pausedUntil: 0, updatedAt: T0 - 5000 },
    ]);
    expect(breakers.pausedUntil('e1', T0 + 10)).toBe(T0 + 1000);
  });

  it('lets as many attempts be in flight as failures are short of 10, and one after a pause', () => {
    const breakers = new CircuitBreakers();
    expect(breakers.allowedInFlight('e1')).toBe(BREAKER_THRESHOLD);
    failTimes(breakers, 'e1', 3);
    expect(breakers.allowedInFlight('e1')).toBe(BREAKER_THRESHOLD - 3);
    failTimes(breakers, 'e1', 7, T0 + 10);
    expect(breakers.pausedUntil('e1', T0 + 20)).toBeDefined();
    expect(breakers.allowedInFlight('e1')).toBe(1); // once the hour is over, one probe decides
    breakers.record('e1', true, T0 + BREAKER_PAUSE_MS + 100);
    expect(breakers.allowedInFlight('e1')).toBe(BREAKER_THRESHOLD);
  });

  // Another replica's stored state, taken in by one whose own history is `local`.
  const pause = (at: number) => ({ endpointId: 'e1', consecutiveFailures: BREAKER_THRESHOLD, pausedUntil: at + BREAKER_PAUSE_MS, updatedAt: at });
  const closure = (at: number) => ({ endpointId: 'e1', consecutiveFailures: 0, pausedUntil: 0, updatedAt: at });
  it.each([
    ['a pause stored before this replica\'s own later failures holds here', (b: CircuitBreakers) => failTimes(b, 'e1', 3, T0 + 100), pause(T0), T0 + BREAKER_PAUSE_MS],
    ['a count stored later does not shorten the pause known here', (b: CircuitBreakers) => failTimes(b, 'e1', 10), { ...closure(T0 + 50), consecutiveFailures: 1 }, T0 + 9 + BREAKER_PAUSE_MS],
    ['a closure stored after the failures known here closes it', (b: CircuitBreakers) => failTimes(b, 'e1', 10), closure(T0 + 50), undefined],
    ['a pause stored before a success here is over', (b: CircuitBreakers) => (failTimes(b, 'e1', 3), b.record('e1', true, T0 + 100)), pause(T0 + 50), undefined],
    ['a pause is taken as it is by a replica that knew nothing of the endpoint', () => undefined, pause(T0), T0 + BREAKER_PAUSE_MS],
  ])('merges stored states: %s', (_case, local, stored, pausedUntil) => {
    const breakers = new CircuitBreakers();
    local(breakers);
    breakers.merge([stored]);
    expect(breakers.pausedUntil('e1', T0 + 200)).toBe(pausedUntil);
  });

  it('never stores a shorter pause than one taken in from another replica', () => {
    const breakers = new CircuitBreakers();
    failTimes(breakers, 'e1', 9); // attempts in flight when another replica's longer pause is read
    breakers.merge([pause(T0 + 30 * 60_000)]);
    expect(breakers.record('e1', false, T0 + 100)?.pausedUntil).toBe(T0 + 90 * 60_000);
  });
});
