/**
 * One key's recent events in time order, as a queue: new events go at the end (or walk back to
 * their place when they arrive late), old ones leave from the front without moving the rest.
 * The oldest and newest times are kept at hand, so appending and checking the age of the window
 * read no event (each event is its own object, somewhere in memory).
 */
import type { WindowEvent } from './types.ts';

export class EventWindow {
  private events: WindowEvent[] = [];
  /** events[head] is the oldest event still in the window; the ones before it have left. */
  private head = 0;
  /** The oldest event's time (Infinity when empty). */
  oldestTime = Infinity;
  /** The latest time the window has held (-Infinity before its first event). */
  newestTime = -Infinity;

  get size(): number {
    return this.events.length - this.head;
  }

  /** Events arrive nearly in order: append, or walk back to the right place. */
  insert(event: WindowEvent): void {
    const events = this.events;
    if (event.timestamp < this.oldestTime) this.oldestTime = event.timestamp;
    if (event.timestamp >= this.newestTime) {
      events.push(event);
      this.newestTime = event.timestamp;
      return;
    }
    let index = events.length;
    while (index > this.head && events[index - 1]!.timestamp > event.timestamp) index--;
    events.splice(index, 0, event);
  }

  /** Takes the oldest event out. */
  dropOldest(): WindowEvent {
    const event = this.events[this.head]!;
    this.events[this.head++] = undefined as unknown as WindowEvent; // let it be collected
    this.oldestTime = this.head < this.events.length ? this.events[this.head]!.timestamp : Infinity;
    // Reclaim the front once it is most of the array: amortized O(1) per event.
    if (this.head >= 64 && this.head * 2 >= this.events.length) this.compact();
    return event;
  }

  /** Whether an event with this id is in the window (a walk over it). */
  includes(eventId: string): boolean {
    for (let i = this.head; i < this.events.length; i++) if (this.events[i]!.eventId === eventId) return true;
    return false;
  }

  /** The events, oldest first, as an array (valid until the window changes). */
  toArray(): WindowEvent[] {
    if (this.head > 0) this.compact();
    return this.events;
  }

  private compact(): void {
    this.events = this.events.slice(this.head);
    this.head = 0;
  }
}
