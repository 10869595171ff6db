/**
 * Circuit breakers per endpoint (spec 6.5). Contract: after 10 consecutive failed attempts to one
 * endpoint, deliveries to it pause for 1 hour; the first attempt after the pause decides: a success
 * closes the breaker, a failure pauses it for another hour. Pure bookkeeping over an injected time;
 * the caller persists the states `record` returns.
 */
import type { BreakerState } from '../store/webhook-store.ts';

export const BREAKER_THRESHOLD = 10;
export const BREAKER_PAUSE_MS = 60 * 60_000;

export class CircuitBreakers {
  private readonly states = new Map<string, BreakerState>();

  constructor(
    private readonly threshold = BREAKER_THRESHOLD,
    private readonly pauseMs = BREAKER_PAUSE_MS,
  ) {}

  load(states: Iterable<BreakerState>): void {
    for (const state of states) {
      const current = this.states.get(state.endpointId);
      if (!current || current.updatedAt <= state.updatedAt) this.states.set(state.endpointId, state);
    }
  }

  /** Undefined when the endpoint may be called now; else until when it is paused. */
  pausedUntil(endpointId: string, now: number): number | undefined {
    const state = this.states.get(endpointId);
    return state && state.pausedUntil > now ? state.pausedUntil : undefined;
  }

  /** Records an attempt's result; returns the new state when it changed (to be stored). */
  record(endpointId: string, succeeded: boolean, now: number): BreakerState | undefined {
    const current = this.states.get(endpointId);
    if (succeeded) {
      if (!current || (current.consecutiveFailures === 0 && current.pausedUntil === 0)) return undefined;
      const closed = { endpointId, consecutiveFailures: 0, pausedUntil: 0, updatedAt: now };
      this.states.delete(endpointId); // closed breakers need no memory
      return closed;
    }
    const failures = (current?.consecutiveFailures ?? 0) + 1;
    const pausedUntil = failures >= this.threshold ? now + this.pauseMs : (current?.pausedUntil ?? 0);
    const state = { endpointId, consecutiveFailures: failures, pausedUntil, updatedAt: now };
    this.states.set(endpointId, state);
    return state;
  }

  /** Endpoints paused at this time. */
  openCount(now: number): number {
    let count = 0;
    for (const state of this.states.values()) if (state.pausedUntil > now) count++;
    return count;
  }
}
