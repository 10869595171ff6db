/**
 * Building blocks for rule screens (RuleScreen in types.ts): running tallies of a key's window,
 * kept up to date as events enter it and leave it. Events leave mostly oldest first, so the newest
 * time a tally remembers for a value stays right until the value's last event leaves (or, after a
 * thinning, may stay later than the window's: see RuleScreen in types.ts).
 */

const MINUTE = 60_000;

/** The UTC clock minute of an epoch-ms timestamp, in minutes since the epoch. */
export function minuteOf(timestamp: number): number {
  return Math.floor(timestamp / MINUTE);
}

/** What MinuteRing.find says about a minute the ring holds no counters for. */
export const NO_EVENTS = -1;
export const FORGOTTEN = -2;

/**
 * Counters per UTC clock minute for a key's latest `size` minutes (a power of two), in one array of
 * numbers: a ring where minute m lives in slot m % size, so updating a minute or reading the last
 * few touches little memory. A slot is taken over by a later minute; reading a minute whose slot holds a later one
 * answers FORGOTTEN, and the rule must then assume the worst (the ring is too short for the
 * question). Counters are numbers the rule gives meaning to (an event count, a lowest limit, ...).
 */
export class MinuteRing {
  /** Per slot: its minute, then its counters. A plain array, kept next to the ring in memory (a typed array's data would not be). */
  private readonly slots: number[];
  private readonly stride: number;
  private readonly mask: number;
  /** The latest minute any event fell in (not lowered when events leave). */
  newestMinute = -Infinity;

  /** `initial` holds each counter's value for a minute without events. */
  constructor(
    readonly size: number,
    private readonly initial: readonly number[],
  ) {
    if (!(size > 0 && (size & (size - 1)) === 0)) throw new Error(`MinuteRing size must be a power of two, not ${size}`);
    this.stride = initial.length + 1;
    this.mask = size - 1;
    this.slots = [];
    for (let i = 0; i < size * this.stride; i++) this.slots.push(-Infinity);
  }

  /**
   * Where the counters of the event's minute are (an index for get, add and lower), the slot being
   * taken over when it holds an earlier minute; FORGOTTEN when it already holds a later one.
   */
  claim(timestamp: number): number {
    const minute = minuteOf(timestamp);
    const at = this.slotOf(minute);
    const held = this.slots[at]!;
    if (held === minute) return at;
    if (held > minute) return FORGOTTEN;
    this.slots[at] = minute;
    for (let k = 0; k < this.initial.length; k++) this.slots[at + 1 + k] = this.initial[k]!;
    if (minute > this.newestMinute) this.newestMinute = minute;
    return at;
  }

  /** Where the minute's counters are; NO_EVENTS when no event fell in it, FORGOTTEN when its slot holds a later minute. */
  find(minute: number): number {
    const at = this.slotOf(minute);
    const held = this.slots[at]!;
    return held === minute ? at : held > minute ? FORGOTTEN : NO_EVENTS;
  }

  get(at: number, counter: number): number {
    return this.slots[at + 1 + counter]!;
  }

  add(at: number, counter: number, delta: number): void {
    this.slots[at + 1 + counter]! += delta;
  }

  /** Sets the counter to `value` when that is lower. */
  lower(at: number, counter: number, value: number): void {
    if (value < this.slots[at + 1 + counter]!) this.slots[at + 1 + counter] = value;
  }

  private slotOf(minute: number): number {
    return (minute & this.mask) * this.stride;
  }
}

interface ValueTally {
  events: number;
  newest: number;
}

/** The distinct values of a key's window (networks, paths, ...), each with its event count and newest time. */
export class DistinctValues<V> {
  private readonly values = new Map<V, ValueTally>();
  // Consecutive events usually share a value: the last one looked up is kept at hand.
  private lastValue: V | undefined;
  private lastTally: ValueTally | undefined;

  get size(): number {
    return this.values.size;
  }

  add(value: V, timestamp: number): void {
    const tally = this.lookup(value);
    if (tally) {
      tally.events++;
      if (timestamp > tally.newest) tally.newest = timestamp;
    } else {
      this.remember(value, { events: 1, newest: timestamp });
      this.values.set(value, this.lastTally!);
    }
  }

  /** An event carrying `value` leaves the window. */
  remove(value: V): void {
    const tally = this.lookup(value);
    if (tally && --tally.events === 0) {
      this.values.delete(value);
      this.lastValue = undefined;
      this.lastTally = undefined;
    }
  }

  /** How many values have an event at or after `since`; counting stops at `enough`. */
  countSince(since: number, enough = Infinity): number {
    let count = 0;
    for (const tally of this.values.values()) {
      if (tally.newest >= since && ++count >= enough) break;
    }
    return count;
  }

  private lookup(value: V): ValueTally | undefined {
    if (this.lastTally && value === this.lastValue) return this.lastTally;
    const tally = this.values.get(value);
    if (tally) this.remember(value, tally);
    return tally;
  }

  private remember(value: V, tally: ValueTally): void {
    this.lastValue = value;
    this.lastTally = tally;
  }
}
