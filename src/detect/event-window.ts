/**
 * One key's recent events in time order, as a queue: new events go at the end (or walk back to
 * their place when they arrive late), old ones leave from the front without moving the rest.
 * The oldest and newest times are kept at hand, so appending and checking the age of the window
 * read no event (each event is its own object, somewhere in memory).
 */
import type { WindowEvent } from './types.ts';

const MINUTE = 60_000;

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

  /**
   * Thins the events dated in [from, to) (whole minutes) down to the first and the last of each
   * group in each minute, `groupOf` naming an event's group; the rest leave the window, and are
   * returned. The events kept stay in time order.
   */
  thin(from: number, to: number, groupOf: (event: WindowEvent) => string): WindowEvent[] {
    const events = this.events;
    const start = this.firstAtOrAfter(from);
    const end = this.firstAtOrAfter(to);
    if (end - start < 3) return [];
    const kept: WindowEvent[] = [];
    const removed: WindowEvent[] = [];
    // Per group of the minute in hand: where its last event so far sits in `kept`, when that is not also its first.
    let lastOf = new Map<string, number>();
    let minute = NaN;
    for (let i = start; i < end; i++) {
      const event = events[i]!;
      const eventMinute = Math.floor(event.timestamp / MINUTE);
      if (eventMinute !== minute) {
        minute = eventMinute;
        lastOf = new Map();
      }
      const group = groupOf(event);
      const last = lastOf.get(group);
      if (last === undefined) {
        // The group's first event of the minute; -1 until a second one comes.
        lastOf.set(group, -1);
        kept.push(event);
      } else if (last === -1) {
        lastOf.set(group, kept.push(event) - 1);
      } else {
        // A later last: the one kept so far leaves, and this one takes its place at the end.
        removed.push(kept[last]!);
        kept[last] = undefined as unknown as WindowEvent;
        lastOf.set(group, kept.push(event) - 1);
      }
    }
    if (removed.length === 0) return removed;
    const stayed = kept.filter((event) => event !== undefined);
    // The first event of [from, to) stays, so the oldest time does not change.
    this.events = events.slice(this.head, start).concat(stayed, events.slice(end));
    this.head = 0;
    return removed;
  }

  /** The position of the window's first event dated at or after `time` (binary search: events are in time order). */
  private firstAtOrAfter(time: number): number {
    let low = this.head;
    let high = this.events.length;
    while (low < high) {
      const middle = (low + high) >>> 1;
      if (this.events[middle]!.timestamp < time) low = middle + 1;
      else high = middle;
    }
    return low;
  }

  /** Whether an event with this id is in the window (a walk over it). */
  includes(eventId: string): boolean {
    for (let i = this.head; i < this.events.length; i++) if (this.events[i]!.eventId === eventId) return true;
    return false;
  }

  /** Visits the events at or after `since`, newest first. */
  forEachSince(since: number, visit: (event: WindowEvent) => void): void {
    for (let i = this.events.length - 1; i >= this.head; i--) {
      const event = this.events[i]!;
      if (event.timestamp < since) return;
      visit(event);
    }
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
