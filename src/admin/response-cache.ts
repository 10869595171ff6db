/**
 * A short-lived cache for dashboard and metrics answers: dashboards are polled, and many admins of
 * one merchant watching the same range need one computation every few seconds, not one each.
 * Contract: concurrent requests for the same key share one computation (single flight); a failed
 * computation is not kept; entries live ttlMs; at most maxEntries are kept (the oldest go first).
 * Every entry belongs to a merchant (or to the all-merchants view): an answer is never shared across
 * merchants, and `invalidate` drops a merchant's answers when its alerts change.
 */
export class ResponseCache {
  private readonly entries = new Map<string, { expiresAt: number; value: Promise<unknown> }>();

  constructor(
    private readonly ttlMs: number,
    private readonly maxEntries = 10_000,
    private readonly now: () => number = Date.now,
  ) {}

  /** The answer for `key` within `merchantId`'s data (undefined: every merchant's). */
  get<T>(merchantId: string | undefined, key: string, compute: () => Promise<T>): Promise<T> {
    if (this.ttlMs <= 0) return compute();
    const entryKey = `${scopeOf(merchantId)}\u0000${key}`;
    const now = this.now();
    const entry = this.entries.get(entryKey);
    if (entry && entry.expiresAt > now) return entry.value as Promise<T>;
    const value = compute();
    this.entries.delete(entryKey); // re-inserted last, so insertion order stays oldest-first
    this.entries.set(entryKey, { expiresAt: now + this.ttlMs, value });
    value.catch(() => {
      if (this.entries.get(entryKey)?.value === value) this.entries.delete(entryKey);
    });
    while (this.entries.size > this.maxEntries) this.entries.delete(this.entries.keys().next().value!);
    return value;
  }

  /**
   * Drops the answers that may show a merchant's data: its own and the all-merchants view's. So an
   * admin who has just changed an alert sees the change on the next read, not a few seconds later.
   */
  invalidate(merchantId: string): void {
    const prefixes = [`${scopeOf(merchantId)}\u0000`, `${scopeOf(undefined)}\u0000`];
    for (const entryKey of this.entries.keys()) {
      if (prefixes.some((prefix) => entryKey.startsWith(prefix))) this.entries.delete(entryKey);
    }
  }
}

/**
 * An entry key's merchant part: quoted, so that no merchant id (a token's claim is free text) can
 * equal the all-merchants view or end early at the separator.
 */
function scopeOf(merchantId: string | undefined): string {
  return merchantId === undefined ? 'all' : JSON.stringify(merchantId);
}
