/**
 * A bounded memory of recently accepted eventIds, so an event published twice (a producer retry,
 * an HTTP client retrying a timed-out post) is stored and counted once. Oldest ids are forgotten
 * first. Kafka redelivery after a restart is handled by stored offsets, not by this set.
 */
export class RecentEventIds {
  private readonly ids = new Set<string>();
  private readonly ring: (string | undefined)[];
  private next = 0;

  constructor(private readonly capacity: number) {
    this.ring = new Array<string | undefined>(Math.max(capacity, 0));
  }

  /** Records the id; returns true when it was already recorded (a duplicate). */
  checkAndAdd(eventId: string): boolean {
    if (this.capacity === 0) return false;
    if (this.ids.has(eventId)) return true;
    const evicted = this.ring[this.next];
    if (evicted !== undefined) this.ids.delete(evicted);
    this.ring[this.next] = eventId;
    this.next = (this.next + 1) % this.capacity;
    this.ids.add(eventId);
    return false;
  }

  get size(): number {
    return this.ids.size;
  }
}
