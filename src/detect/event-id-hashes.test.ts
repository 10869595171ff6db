import { describe, expect, it } from 'vitest';
import { EventIdHashes, eventIdHash } from './event-id-hashes.ts';

describe('EventIdHashes', () => {
  it('holds a multiset of hashes through growth and removals, colliding ones included', () => {
    const hashes = new EventIdHashes();
    const reference = new Map<number, number>();
    // Hashes that crowd a few home slots, so probe runs wrap around and removals shift entries back.
    const pool = Array.from({ length: 40 }, (_, i) => ((i % 5) << 20) | (1 + (i % 7)) | (i % 3 === 0 ? 1024 : 0));
    let seed = 7;
    const next = () => (seed = (seed * 1103515245 + 12345) & 0x7fffffff);
    for (let step = 0; step < 5000; step++) {
      const hash = pool[next() % pool.length]!;
      if (next() % 3 === 0 && (reference.get(hash) ?? 0) > 0) {
        hashes.delete(hash);
        reference.set(hash, reference.get(hash)! - 1);
      } else {
        hashes.add(hash);
        reference.set(hash, (reference.get(hash) ?? 0) + 1);
      }
      for (const candidate of pool) expect(hashes.has(candidate)).toBe((reference.get(candidate) ?? 0) > 0);
    }
  });

  it('hashes ids to small non-zero integers, equal ids alike', () => {
    for (const id of ['', 'evt_1', 'evt_2', '5b2f5d7e-8c1a-4b8e-9a43-0d6f0e1c2a7b', 'é'.repeat(300)]) {
      const hash = eventIdHash(id);
      expect(Number.isInteger(hash) && hash > 0 && hash < 2 ** 30).toBe(true);
      expect(eventIdHash(`${id}`)).toBe(hash);
    }
    expect(eventIdHash('evt_1')).not.toBe(eventIdHash('evt_2'));
  });
});
