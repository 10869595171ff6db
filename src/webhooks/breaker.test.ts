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
    failTimes(breakers, 'e1', BREAKER_THRESHOLD - 1);
    expect(breakers.pausedUntil('e1', T0 + 100)).toBeUndefined();
    const state = breakers.record('e1', false, T0 + 100);
    expect(state).toEqual({ endpointId: 'e1', consecutiveFailures: 10, pausedUntil: T0 + 100 + BREAKER_PAUSE_MS, updatedAt: T0 + 100 });
    expect(breakers.pausedUntil('e1', T0 + 100 + BREAKER_PAUSE_MS - 1)).toBe(T0 + 100 + BREAKER_PAUSE_MS);
    expect(breakers.pausedUntil('e1', T0 + 100 + BREAKER_PAUSE_MS)).toBeUndefined();
    expect(breakers.openCount(T0 + 200)).toBe(1);
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

  it('resumes from stored states (the latest per endpoint wins)', () => {
    const breakers = new CircuitBreakers();
    breakers.load([
      { endpointId: 'e1', consecutiveFailures: 10, pausedUntil: T0 + 1000, updatedAt: T0 },
      { endpointId: 'e1', consecutiveFailures: 3, pausedUntil: 0, updatedAt: T0 - 5000 },
    ]);
    expect(breakers.pausedUntil('e1', T0 + 10)).toBe(T0 + 1000);
  });
});
