/**
 * A short-lived cache for dashboard and metrics answers: dashboards are polled, and many admins of
 * one merchant watching the same range need one computation every few seconds, not one each.
 * Contract: concurrent requests for the same key share one computation (single flight); a failed
 * computation is not kept; entries live ttlMs; at most maxEntries are kept (the oldest go first).
 * Keys must include the merchant scope: an answer is never shared across merchants.
 */
export class ResponseCache {
  private readonly entries = new Map<string, { expiresAt: number; value: Promise<unknown> }>();

  constructor(
    private readonly ttlMs: number,
    private readonly maxEntries = 10_000,
    private readonly now: () => number = Date.now,
  ) {}

  get<T>(key: string, compute: () => Promise<T>): Promise<T> {
    if (this.ttlMs <= 0) return compute();
    const now = this.now();
    const entry = this.entries.get(key);
    if (entry && entry.expiresAt > now) return entry.value as Promise<T>;
    const value = compute();
    this.entries.delete(key); // re-inserted last, so insertion order stays oldest-first
    this.entries.set(key, { expiresAt: now + this.ttlMs, value });
    value.catch(() => {
      if (this.entries.get(key)?.value === value) this.entries.delete(key);
    });
    while (this.entries.size > this.maxEntries) this.entries.delete(this.entries.keys().next().value!);
    return value;
  }
}
