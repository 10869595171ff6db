/**
 * A bounded memory of recently accepted eventIds, so an event published twice (a producer retry,
 * an HTTP client retrying a timed-out post) is stored and counted once. Kafka redelivery after a
 * restart is handled by stored offsets, not by this set.
 *
 * Two generations of half the capacity each: ids go into the current one; when it is full it becomes
 * the previous one and the oldest generation is dropped whole. That remembers between capacity/2 and
 * capacity recent ids, at the cost of two Set lookups and no per-id eviction.
 */
export class RecentEventIds {
  private current = new Set<string>();
  private previous = new Set<string>();
  private readonly generationSize: number;

  constructor(capacity: number) {
    this.generationSize = Math.max(0, Math.ceil(capacity / 2));
  }

  /** Records the id; returns true when it was already recorded (a duplicate). */
  checkAndAdd(eventId: string): boolean {
    if (this.generationSize === 0) return false;
    if (this.current.has(eventId) || this.previous.has(eventId)) return true;
    if (this.current.size >= this.generationSize) {
      this.previous = this.current;
      this.current = new Set();
    }
    this.current.add(eventId);
    return false;
  }

  get size(): number {
    return this.current.size + this.previous.size;
  }
}
