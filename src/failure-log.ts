/**
 * A failure that repeats per request or per retry (storage down, brokers unreachable, an endpoint
 * refusing), logged as a state rather than per occurrence: a line when it starts, then at most one
 * per interval with how many occurred since the last line, and one line when it ends. A line per
 * occurrence would bury the one that says what happened, just when on-call reads the log.
 */
import type { Logger } from './logger.ts';

export const FAILURE_LOG_INTERVAL_MS = 60_000;

export class FailureLog {
  private failing = false;
  private loggedAt = Number.NEGATIVE_INFINITY;
  /** Occurrences since the last line. */
  private unlogged = 0;
  private total = 0;

  /**
   * @param what the failure, as the start of its lines ("storing a flush failed")
   * @param recovery the line when it ends ("storage answers again")
   */
  constructor(
    private readonly logger: Logger,
    private readonly what: string,
    private readonly recovery: string,
    private readonly level: 'error' | 'warn' = 'error',
    private readonly intervalMs = FAILURE_LOG_INTERVAL_MS,
    private readonly now: () => number = Date.now,
  ) {}

  get isFailing(): boolean {
    return this.failing;
  }

  /** An occurrence, with what it says (an error as `err`): logged if it starts the failure or the interval has passed since the last line. */
  failed(fields: Record<string, unknown> = {}): void {
    this.unlogged++;
    this.total++;
    const now = this.now();
    if (this.failing && now - this.loggedAt < this.intervalMs) return;
    const message = this.failing ? `${this.what} (still; logged at most once a minute)` : this.what;
    this.logger[this.level]({ ...fields, occurrences: this.unlogged }, message);
    this.failing = true;
    this.loggedAt = now;
    this.unlogged = 0;
  }

  /** The failure is over (a success): logged once, with how many occurred while it lasted. */
  succeeded(fields: Record<string, unknown> = {}): void {
    if (!this.failing) return;
    this.logger.info({ ...fields, failures: this.total }, this.recovery);
    this.failing = false;
    this.loggedAt = Number.NEGATIVE_INFINITY;
    this.unlogged = 0;
    this.total = 0;
  }
}
