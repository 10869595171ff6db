/**
 * Items that arrive before their consumer can take them wait, in order and bounded, until open()
 * hands them over; from then on each batch goes straight through. Past the bound, later items are
 * dropped (counted): what waits is the first of a start-up, never an unbounded backlog.
 */
export class HeldUntilOpen<T> {
  private held: T[] | undefined = [];
  private dropped = 0;

  constructor(
    private readonly maxHeld: number,
    private readonly deliver: (items: T[]) => void,
  ) {}

  /** Delivers the items now when open; else holds as many as there is room for. Returns the items it held. */
  take(items: T[]): readonly T[] {
    if (this.held === undefined) {
      if (items.length > 0) this.deliver(items);
      return [];
    }
    const kept = items.slice(0, Math.max(this.maxHeld - this.held.length, 0));
    this.held.push(...kept);
    this.dropped += items.length - kept.length;
    return kept;
  }

  /** Delivers what was held, as one batch, and lets everything through from now on; says how many were held and dropped. */
  open(): { released: number; dropped: number } {
    const held = this.held ?? [];
    this.held = undefined;
    if (held.length > 0) this.deliver(held);
    return { released: held.length, dropped: this.dropped };
  }
}
