import { describe, expect, it } from 'vitest';
import { RecentEventIds } from './recent-event-ids.ts';

describe('RecentEventIds', () => {
  it('reports a repeated id as a duplicate', () => {
    const ids = new RecentEventIds(10);
    expect(ids.checkAndAdd('a')).toBe(false);
    expect(ids.checkAndAdd('b')).toBe(false);
    expect(ids.checkAndAdd('a')).toBe(true);
  });

  it('knows an id recorded as text when it comes as ASCII bytes, and the other way round', () => {
    const ids = new RecentEventIds(100);
    const bytes = new TextEncoder().encode('..evt_42..evt_43..');
    expect(ids.checkAndAdd('evt_42')).toBe(false);
    expect(ids.checkAndAddAscii(bytes, 2, 8)).toBe(true);
    expect(ids.checkAndAddAscii(bytes, 10, 16)).toBe(false);
    expect(ids.checkAndAdd('evt_43')).toBe(true);
    expect(ids.checkAndAddAscii(bytes, 2, 7)).toBe(false); // evt_4
  });

  it('remembers at least half its capacity of the most recent ids, and never more than its capacity', () => {
    const ids = new RecentEventIds(4);
    for (const id of ['a', 'b', 'c', 'd', 'e']) ids.checkAndAdd(id);
    expect(ids.size).toBeLessThanOrEqual(4);
    expect(ids.checkAndAdd('e')).toBe(true);
    expect(ids.checkAndAdd('d')).toBe(true);
    expect(ids.checkAndAdd('a')).toBe(false); // the oldest generation was dropped
  });

  it('tells whether an id is recorded without recording it', () => {
    const ids = new RecentEventIds(10);
    expect(ids.has('a')).toBe(false);
    expect(ids.checkAndAdd('a')).toBe(false); // has() did not record it
    expect(ids.has('a')).toBe(true);
    expect(new RecentEventIds(0).has('a')).toBe(false);
  });

  it('with capacity 0 never reports duplicates', () => {
    const ids = new RecentEventIds(0);
    expect(ids.checkAndAdd('a')).toBe(false);
    expect(ids.checkAndAdd('a')).toBe(false);
  });

  it('tells 200k similar ids apart, then knows each of them again', () => {
    const ids = new RecentEventIds(400_000);
    const names = Array.from({ length: 200_000 }, (_, i) => `evt_2026-11-21_${i}`);
    expect(names.filter((name) => ids.checkAndAdd(name))).toEqual([]);
    expect(names.every((name) => ids.checkAndAdd(name))).toBe(true);
    expect(ids.size).toBe(200_000);
  });

  it('keeps remembering across many generation changes', () => {
    const ids = new RecentEventIds(1000);
    for (let i = 0; i < 20_000; i++) {
      expect(ids.checkAndAdd(`id-${i}`)).toBe(false);
      // The id just before is always still remembered, whatever generation it went into.
      if (i > 0) expect(ids.checkAndAdd(`id-${i - 1}`)).toBe(true);
    }
    expect(ids.size).toBeLessThanOrEqual(1000);
    expect(ids.checkAndAdd('id-0')).toBe(false);
  });

  it('forgets the ids of partitions it no longer owns, in both generations, and keeps the rest', () => {
    const ids = new RecentEventIds(1000);
    for (let i = 0; i < 900; i++) ids.checkAndAdd(`id-${i}`, i % 3); // spans a generation change
    ids.keepPartitions(new Set([0, 2]));
    expect(ids.size).toBe(600);
    for (let i = 0; i < 900; i++) expect(ids.checkAndAdd(`id-${i}`, i % 3)).toBe(i % 3 !== 1);
    ids.keepPartitions(new Set());
    expect(ids.size).toBe(0);
  });
});
