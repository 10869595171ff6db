/**
 * A failure that repeats per request or per retry (storage down, brokers unreachable, an endpoint
 * refusing), logged as a state rather than per occurrence: a line when it starts, then at most one
 * per interval with how many occurred since the last line, and one line when it ends. A line per
 * occurrence would bury the one that says what happened, just when on-call reads the log.
 */
import type { Logger } from './logger.ts';

const FAILURE_LOG_INTERVAL_MS = 60_000;
/** quietMs for failures that successes can interleave with: ended by a success 10 s after the last failure. */
export const INTERLEAVED_QUIET_MS = 10_000;

export interface FailureLogOptions {
  level?: 'error' | 'warn';
  /** At most one line per this while the failure lasts; an occurrence ten times this long after the previous one starts a new failure. */
  intervalMs?: number;
  /**
   * A success ends the failure only this long after its last occurrence: where successes and
   * failures interleave (some partitions refusing, a cached answer among failing ones), the failure
   * has not ended, and a line for each flip would be the flood this avoids. 0: at the first success.
   */
  quietMs?: number;
  now?: () => number;
}

const STALE_AFTER_INTERVALS = 10;

export class FailureLog {
  private failing = false;
  private loggedAt = Number.NEGATIVE_INFINITY;
  private lastFailureAt = Number.NEGATIVE_INFINITY;
  /** Occurrences since the last line. */
  private unlogged = 0;
  private total = 0;
  private readonly level: 'error' | 'warn';
  private readonly intervalMs: number;
  private readonly quietMs: number;
  private readonly now: () => number;

  /**
   * @param what the failure, as the start of its lines ("storing a flush failed")
   * @param recovery the line when it ends ("storage answers again")
   */
  constructor(
    private readonly logger: Logger,
    private readonly what: string,
    private readonly recovery: string,
    options: FailureLogOptions = {},
  ) {
    this.level = options.level ?? 'error';
    this.intervalMs = options.intervalMs ?? FAILURE_LOG_INTERVAL_MS;
    this.quietMs = options.quietMs ?? 0;
    this.now = options.now ?? Date.now;
  }

  get isFailing(): boolean {
    return this.failing;
  }

  /** An occurrence, with what it says (an error as `err`): logged if it starts a failure or the interval has passed since the last line. */
  failed(fields: Record<string, unknown> = {}): void {
    this.unlogged++;
    this.total++;
    const now = this.now();
    // Long after the previous occurrence (no success came to end it: a rare retry loop, kafkajs's
    // lines): a new failure, said as one.
    const continuing = this.failing && now - this.lastFailureAt < STALE_AFTER_INTERVALS * this.intervalMs;
    this.lastFailureAt = now;
    if (continuing && now - this.loggedAt < this.intervalMs) return;
    const message = continuing ? `${this.what} (still; logged at most once a minute)` : this.what;
    this.logger[this.level]({ ...fields, occurrences: this.unlogged }, message);
    this.failing = true;
    this.loggedAt = now;
    this.unlogged = 0;
  }

  /** A success: it ends the failure (logged once, with how many occurred) once quietMs have passed since its last occurrence. */
  succeeded(fields: Record<string, unknown> = {}): void {
    if (!this.failing || this.now() - this.lastFailureAt < this.quietMs) return;
    this.logger.info({ ...fields, failures: this.total }, this.recovery);
    this.failing = false;
    this.loggedAt = Number.NEGATIVE_INFINITY;
    this.unlogged = 0;
    this.total = 0;
  }
}
