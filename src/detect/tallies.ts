/**
 * Building blocks for rule screens (RuleScreen in types.ts): running tallies of a key's window,
 * kept up to date as events enter it and leave it. Events leave mostly oldest first, so the newest
 * time a tally remembers for a value stays right until the value's last event leaves (or, after a
 * thinning, may stay later than the window's: see RuleScreen in types.ts).
 */
import type { DroppedRequests, WindowEvent } from './types.ts';

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

  /** `initial` holds each counter's value for a minute without events; `slotMs` makes the ring's "minutes" shorter (DroppedRequestTally's 10-second steps). */
  constructor(
    readonly size: number,
    private readonly initial: readonly number[],
    private readonly slotMs = MINUTE,
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
    const minute = Math.floor(timestamp / this.slotMs);
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

  /** Sets the counter to `value` when that is higher. */
  raise(at: number, counter: number, value: number): void {
    if (value > this.slots[at + 1 + counter]!) this.slots[at + 1 + counter] = value;
  }

  private slotOf(minute: number): number {
    return (minute & this.mask) * this.stride;
  }
}

const STEP_MS = 10_000;
const STEPS_PER_MINUTE = MINUTE / STEP_MS;
/** 21 minutes of 10-second steps (a power of two): at least the 16 minutes DroppedRequests promises. */
const DROPPED_STEPS = 128;
const [REQUESTS, SERVER_ERRORS, HIGHEST_LIMIT, EARLIEST, LATEST, REFUSED] = [0, 1, 2, 3, 4, 5];

/**
 * The requests the engine's per-key cap dropped from a key's window (DroppedRequests in types.ts),
 * per 10-second step, for the latest 21 minutes it dropped any of. The cap drops the oldest events
 * first, so the steps arrive in order and an older one is never needed again.
 */
export class DroppedRequestTally implements DroppedRequests {
  private readonly ring = new MinuteRing(DROPPED_STEPS, [0, 0, 0, Infinity, -Infinity, 0], STEP_MS);

  add(event: WindowEvent): void {
    const at = this.ring.claim(event.timestamp);
    if (at === FORGOTTEN) return;
    this.ring.add(at, REQUESTS, 1);
    if (event.status === 401) this.ring.add(at, REFUSED, 1);
    // A request answered 5xx is no request of the client's rate (velocity_attack leaves them out,
    // limits included): it is counted apart, and says nothing of the limit or the times.
    if (event.status >= 500) {
      this.ring.add(at, SERVER_ERRORS, 1);
      return;
    }
    this.ring.raise(at, HIGHEST_LIMIT, event.rateLimitPerMinute);
    this.ring.lower(at, EARLIEST, event.timestamp);
    this.ring.raise(at, LATEST, event.timestamp);
  }

  count(minute: number): number {
    return this.overMinute(minute, REQUESTS, 0, (a, b) => a + b);
  }

  serverErrors(minute: number): number {
    return this.overMinute(minute, SERVER_ERRORS, 0, (a, b) => a + b);
  }

  highestLimit(minute: number): number {
    return this.overMinute(minute, HIGHEST_LIMIT, 0, Math.max);
  }

  earliest(minute: number): number {
    const earliest = this.overMinute(minute, EARLIEST, Infinity, Math.min);
    return earliest === Infinity ? Number.NaN : earliest;
  }

  latest(minute: number): number {
    const latest = this.overMinute(minute, LATEST, -Infinity, Math.max);
    return latest === -Infinity ? Number.NaN : latest;
  }

  answeredBetween(from: number, to: number): number {
    return this.answeredIn(from, to, false);
  }

  /** Whether any request it holds was answered 401. */
  holdsRefused(): boolean {
    for (let step = this.ring.newestMinute; step > this.ring.newestMinute - DROPPED_STEPS; step--) {
      const at = this.ring.find(step);
      if (at >= 0 && this.ring.get(at, REFUSED) > 0) return true;
    }
    return false;
  }

  /**
   * The same without the requests answered 401 (the engine's keyHolderSeverity judges a window
   * without them). Their limits and times stay in the minute's highest limit, earliest and latest,
   * which only bound the others'.
   */
  withoutRefused(): DroppedRequests {
    const refusedIn = (minute: number) => this.overMinute(minute, REFUSED, 0, (a, b) => a + b);
    return {
      count: (minute) => this.count(minute) - refusedIn(minute),
      serverErrors: (minute) => this.serverErrors(minute),
      highestLimit: (minute) => this.highestLimit(minute),
      earliest: (minute) => this.earliest(minute),
      latest: (minute) => this.latest(minute),
      answeredBetween: (from, to) => this.answeredIn(from, to, true),
    };
  }

  /** The requests not answered 5xx (nor 401, with `withoutRefused`) of the 10-second steps wholly within [from, to]. */
  private answeredIn(from: number, to: number, withoutRefused: boolean): number {
    let answered = 0;
    for (let step = Math.ceil(from / STEP_MS); (step + 1) * STEP_MS <= to; step++) {
      const at = this.ring.find(step);
      if (at >= 0) answered += this.ring.get(at, REQUESTS) - this.ring.get(at, SERVER_ERRORS) - (withoutRefused ? this.ring.get(at, REFUSED) : 0);
    }
    return answered;
  }

  /** A counter over the minute's steps, folded with `fold` from `none`. */
  private overMinute(minute: number, counter: number, none: number, fold: (a: number, b: number) => number): number {
    let value = none;
    for (let step = minute * STEPS_PER_MINUTE; step < (minute + 1) * STEPS_PER_MINUTE; step++) {
      const at = this.ring.find(step);
      if (at >= 0) value = fold(value, this.ring.get(at, counter));
    }
    return value;
  }
}

interface ValueTally {
  events: number;
  newest: number;
}

/** For a screen's add: 1 when the value's tally that DistinctValues.add returned is new (its first event), else 0. */
export function entryAdded(tally: ValueTally): number {
  return tally.events === 1 ? 1 : 0;
}

/** For a screen's remove: 1 when the value's last event left (DistinctValues.remove returned a tally at 0 events), else 0. */
export function entryRemoved(tally: ValueTally | undefined): number {
  return tally?.events === 0 ? 1 : 0;
}

/** The distinct values of a key's window (networks, paths, ...), each with its event count and newest time. */
export class DistinctValues<V, T extends ValueTally = ValueTally> {
  protected readonly values = new Map<V, T>();
  // Consecutive events usually share a value: the last one looked up is kept at hand.
  private lastValue: V | undefined;
  private lastTally: T | undefined;

  get size(): number {
    return this.values.size;
  }

  /** An event carrying `value` enters the window; returns the value's tally. */
  add(value: V, timestamp: number): T {
    let tally = this.lookup(value);
    if (tally) {
      tally.events++;
      if (timestamp > tally.newest) tally.newest = timestamp;
    } else {
      tally = this.newTally(timestamp);
      this.remember(value, tally);
      this.values.set(value, tally);
    }
    return tally;
  }

  /** An event carrying `value`, dated `timestamp`, leaves the window; returns the value's tally (gone from the values at 0 events). */
  remove(value: V, _timestamp: number): T | undefined {
    const tally = this.lookup(value);
    if (tally && --tally.events === 0) {
      this.values.delete(value);
      this.lastValue = undefined;
      this.lastTally = undefined;
    }
    return tally;
  }

  /** How many values have an event at or after `since`; counting stops at `enough`. */
  countSince(since: number, enough = Infinity): number {
    let count = 0;
    for (const tally of this.values.values()) {
      if (tally.newest >= since && ++count >= enough) break;
    }
    return count;
  }

  /** The tally of a value's first event. */
  protected newTally(timestamp: number): T {
    return { events: 1, newest: timestamp } as T;
  }

  private lookup(value: V): T | undefined {
    if (this.lastTally && value === this.lastValue) return this.lastTally;
    const tally = this.values.get(value);
    if (tally) this.remember(value, tally);
    return tally;
  }

  private remember(value: V, tally: T): void {
    this.lastValue = value;
    this.lastTally = tally;
  }
}

interface SeenValue extends ValueTally {
  /** The clock minutes the value was seen in, each with its events: [minute, events, minute, events, ...], in minute order. */
  minutes: number[];
}

/**
 * DistinctValues that also know the clock minutes each value was seen in: enough to say, for any
 * span of time, how many values were surely seen in it (those seen in a minute wholly inside it)
 * and whether any may have been (a minute that overlaps it). A value is seen in few minutes, or
 * in consecutive ones, so its list stays short and is mostly added to at its end.
 */
export class ValueMinutes<V> extends DistinctValues<V, SeenValue> {
  override add(value: V, timestamp: number): SeenValue {
    const tally = super.add(value, timestamp);
    addToMinutes(tally.minutes, timestamp);
    return tally;
  }

  override remove(value: V, timestamp: number): SeenValue | undefined {
    const tally = super.remove(value, timestamp);
    if (tally) removeFromMinutes(tally.minutes, timestamp);
    return tally;
  }

  /** Each value's minutes ([minute, events, ...], in minute order). */
  minuteLists(): IterableIterator<SeenValue> {
    return this.values.values();
  }

  protected override newTally(timestamp: number): SeenValue {
    return { events: 1, newest: timestamp, minutes: [] };
  }
}

const ONE_EVENT: readonly number[] = [1];

/**
 * Counts an event in a list of the clock minutes something was seen in, [minute, events, ...] in
 * minute order: a few numbers for a few minutes, where a MinuteRing holds its whole span. A list may
 * keep more counters per minute, [minute, events, c1, ..., minute, ...]: `counts` is what the event
 * adds to each, the events first (1).
 */
export function addToMinutes(minutes: number[], timestamp: number, counts: readonly number[] = ONE_EVENT): void {
  const stride = counts.length + 1;
  const minute = minuteOf(timestamp);
  let at = minutes.length - stride;
  while (at >= 0 && minutes[at]! > minute) at -= stride; // a late event: walk back to its minute
  if (at >= 0 && minutes[at] === minute) {
    for (let k = 0; k < counts.length; k++) minutes[at + 1 + k]! += counts[k]!;
  } else {
    minutes.splice(at + stride, 0, minute, ...counts);
  }
}

/** Takes an event out of such a list (`counts` as it was added); a minute left without events goes. */
export function removeFromMinutes(minutes: number[], timestamp: number, counts: readonly number[] = ONE_EVENT): void {
  const stride = counts.length + 1;
  const minute = minuteOf(timestamp);
  let at = 0;
  while (at < minutes.length && minutes[at]! < minute) at += stride; // usually the first: the oldest event leaves
  if (minutes[at] !== minute) return;
  for (let k = 0; k < counts.length; k++) minutes[at + 1 + k]! -= counts[k]!;
  if (minutes[at + 1] === 0) minutes.splice(at, stride);
}

/** Whether such a list (of events alone) has events in a minute from `first` to `last` (inclusive). */
export function seenInMinutes(minutes: readonly number[], first: number, last: number): boolean {
  for (let at = 0; at < minutes.length && minutes[at]! <= last; at += 2) if (minutes[at]! >= first) return true;
  return false;
}
