/**
 * Building blocks for rule screens (RuleScreen in types.ts): running tallies of a key's window,
 * kept up to date as events enter it and leave it. Events leave oldest first, so a tally can count
 * an event out of its oldest minute, and the newest time it remembers for a value stays right until
 * the value's last event leaves.
 */

const MINUTE = 60_000;

/** The UTC clock minute of an epoch-ms timestamp, in minutes since the epoch. */
export function minuteOf(timestamp: number): number {
  return Math.floor(timestamp / MINUTE);
}

/** One UTC clock minute of a window: the caller's counters, and how many events fall in it. */
export interface MinuteBucket {
  readonly minute: number;
  events: number;
}

/** Counters per UTC clock minute over a key's window, oldest minute first; a minute without events has no bucket. */
export class MinuteBuckets<B extends MinuteBucket> {
  /** Oldest first. */
  readonly list: B[] = [];

  /** `create` makes the bucket of a minute with its counters at zero and `events: 0`. */
  constructor(private readonly create: (minute: number) => B) {}

  /** Counts an event in; returns its minute's bucket so the caller updates its own counters. */
  add(timestamp: number): B {
    const minute = minuteOf(timestamp);
    const list = this.list;
    let last = list.length - 1;
    if (last >= 0 && list[last]!.minute === minute) {
      list[last]!.events++;
      return list[last]!;
    }
    // A new minute, or an event out of order: walk back to its place.
    while (last >= 0 && list[last]!.minute > minute) last--;
    let bucket = list[last];
    if (bucket === undefined || bucket.minute !== minute) {
      bucket = this.create(minute);
      if (last === list.length - 1) list.push(bucket);
      else list.splice(last + 1, 0, bucket);
    }
    bucket.events++;
    return bucket;
  }

  /** Counts out the window's oldest event (it is in the first bucket); returns that bucket, dropped once empty. */
  removeOldest(): B {
    const bucket = this.list[0]!;
    if (--bucket.events === 0) this.list.shift();
    return bucket;
  }

  /** The index in `list` of the first bucket at or after `minute`. */
  indexFrom(minute: number): number {
    let index = this.list.length;
    while (index > 0 && this.list[index - 1]!.minute >= minute) index--;
    return index;
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

  /** The window's oldest event, carrying `value`, leaves it. */
  removeOldest(value: V): void {
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
