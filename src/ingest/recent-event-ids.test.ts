import { describe, expect, it } from 'vitest';
import { RecentEventIds } from './recent-event-ids.ts';

describe('RecentEventIds', () => {
  it('reports a repeated id as a duplicate', () => {
    const ids = new RecentEventIds(10);
    expect(ids.checkAndAdd('a')).toBe(false);
    expect(ids.checkAndAdd('b')).toBe(false);
    expect(ids.checkAndAdd('a')).toBe(true);
  });

  it('remembers at least half its capacity of the most recent ids, and never more than its capacity', () => {
    const ids = new RecentEventIds(4);
    for (const id of ['a', 'b', 'c', 'd', 'e']) ids.checkAndAdd(id);
    expect(ids.size).toBeLessThanOrEqual(4);
    expect(ids.checkAndAdd('e')).toBe(true);
    expect(ids.checkAndAdd('d')).toBe(true);
    expect(ids.checkAndAdd('a')).toBe(false); // the oldest generation was dropped
  });

  it('with capacity 0 never reports duplicates', () => {
    const ids = new RecentEventIds(0);
    expect(ids.checkAndAdd('a')).toBe(false);
    expect(ids.checkAndAdd('a')).toBe(false);
  });
});
