import { describe, expect, it } from 'vitest';
import { RecentEventIds } from './recent-event-ids.ts';

describe('RecentEventIds', () => {
  it('reports a repeated id as a duplicate', () => {
    const ids = new RecentEventIds(10);
    expect(ids.checkAndAdd('a')).toBe(false);
    expect(ids.checkAndAdd('b')).toBe(false);
    expect(ids.checkAndAdd('a')).toBe(true);
  });

  it('forgets the oldest ids beyond its capacity, and stays bounded', () => {
    const ids = new RecentEventIds(3);
    for (const id of ['a', 'b', 'c', 'd']) ids.checkAndAdd(id);
    expect(ids.size).toBe(3);
    expect(ids.checkAndAdd('d')).toBe(true);
    expect(ids.checkAndAdd('a')).toBe(false); // evicted, so new again
  });

  it('with capacity 0 never reports duplicates', () => {
    const ids = new RecentEventIds(0);
    expect(ids.checkAndAdd('a')).toBe(false);
    expect(ids.checkAndAdd('a')).toBe(false);
  });
});
