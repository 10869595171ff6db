/**
 * Circuit breakers per endpoint (spec 6.5). Contract: after 10 consecutive failed attempts to one
 * endpoint, deliveries to it pause for 1 hour; the first attempt after the pause decides: a success
 * closes the breaker, a failure pauses it for another hour. Attempts in flight count toward the 10,
 * and after a pause one attempt at a time probes the endpoint. Pure bookkeeping over an injected
 * time; the caller persists the states `record` returns and merges in the stored ones now and then.
 *
 * Replicas share the stored states: only pauses and closures are stored. A count of failures below
 * the threshold stays with the replica that saw them: stored, it would write over another
 * replica's pause of the same endpoint (a row is rewritten whole, and the latest write wins).
 */
import type { BreakerState } from '../store/webhook-store.ts';

export const BREAKER_THRESHOLD = 10;
export const BREAKER_PAUSE_MS = 60 * 60_000;

interface Breaker extends BreakerState {
  /** When the endpoint last answered (here or, as stored, on another replica); 0 when unknown. */
  closedAt: number;
}

const isClosed = (state: BreakerState) => state.consecutiveFailures === 0 && state.pausedUntil === 0;

export class CircuitBreakers {
  private readonly states = new Map<string, Breaker>();

  constructor(
    private readonly threshold = BREAKER_THRESHOLD,
    private readonly pauseMs = BREAKER_PAUSE_MS,
  ) {}

  /**
   * Takes in stored states (this replica's or others'): the longer pause wins, unless a success
   * closed the breaker after it; a closure stored after the last failure known here closes it.
   */
  merge(stored: Iterable<BreakerState>): void {
    for (const state of stored) {
      const current = this.states.get(state.endpointId);
      if (!current) {
        this.states.set(state.endpointId, { ...state, closedAt: isClosed(state) ? state.updatedAt : 0 });
      } else if (isClosed(state)) {
        if (state.updatedAt > current.updatedAt) this.states.set(state.endpointId, { ...state, closedAt: state.updatedAt });
        else current.closedAt = Math.max(current.closedAt, state.updatedAt);
      } else if (state.updatedAt > current.closedAt) {
        this.states.set(state.endpointId, {
          endpointId: state.endpointId,
          consecutiveFailures: Math.max(current.consecutiveFailures, state.consecutiveFailures),
          pausedUntil: Math.max(current.pausedUntil, state.pausedUntil),
          updatedAt: Math.max(current.updatedAt, state.updatedAt),
          closedAt: current.closedAt,
        });
      }
    }
  }

  /** Undefined when the endpoint may be called now; else until when it is paused. */
  pausedUntil(endpointId: string, now: number): number | undefined {
    const state = this.states.get(endpointId);
    return state && state.pausedUntil > now ? state.pausedUntil : undefined;
  }

  /**
   * Whether the endpoint's breaker has opened and not closed since: paused, or its pause over and
   * the next attempt deciding (a success then closes it).
   */
  isOpen(endpointId: string): boolean {
    return (this.states.get(endpointId)?.consecutiveFailures ?? 0) >= this.threshold;
  }

  /**
   * How many attempts may be in flight to an endpoint that is not paused: as many as failures
   * short of the threshold, so the pause comes after 10 failures however many were sent at once;
   * after a pause, one (it decides).
   */
  allowedInFlight(endpointId: string): number {
    const failures = this.states.get(endpointId)?.consecutiveFailures ?? 0;
    return failures >= this.threshold ? 1 : this.threshold - failures;
  }

  /** Records an attempt's result; returns the new state when it is to be stored (a pause or a closure). */
  record(endpointId: string, succeeded: boolean, now: number): BreakerState | undefined {
    const current = this.states.get(endpointId);
    if (succeeded) {
      if (!current || isClosed(current)) return undefined;
      const closed = { endpointId, consecutiveFailures: 0, pausedUntil: 0, updatedAt: now };
      this.states.set(endpointId, { ...closed, closedAt: now });
      return closed;
    }
    const failures = (current?.consecutiveFailures ?? 0) + 1;
    const pauses = failures >= this.threshold;
    const pausedUntil = pauses ? Math.max(now + this.pauseMs, current?.pausedUntil ?? 0) : (current?.pausedUntil ?? 0);
    const state = { endpointId, consecutiveFailures: failures, pausedUntil, updatedAt: now };
    this.states.set(endpointId, { ...state, closedAt: current?.closedAt ?? 0 });
    return pauses ? state : undefined;
  }

  /** Endpoints paused at this time. */
  openCount(now: number): number {
    let count = 0;
    for (const state of this.states.values()) if (state.pausedUntil > now) count++;
    return count;
  }
}
