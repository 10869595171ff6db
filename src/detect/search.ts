/**
 * For rules reading a window: events are in time order, so the start of a time range is found by
 * binary search, reading a handful of events instead of every event after it.
 */
import type { WindowEvent } from './types.ts';

/** The index of the first event at or after `timestamp` (events.length when there is none). */
export function firstAtOrAfter(events: readonly WindowEvent[], timestamp: number): number {
  let low = 0;
  let high = events.length;
  while (low < high) {
    const middle = (low + high) >>> 1;
    if (events[middle]!.timestamp < timestamp) low = middle + 1;
    else high = middle;
  }
  return low;
}
