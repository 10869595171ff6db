import { describe, expect, it } from 'vitest';
import { BacklogWatch } from './kafka-consumer.ts';

describe('BacklogWatch', () => {
  it('says the replica caught up on the batch that ends the last partition behind, once', () => {
    const watch = new BacklogWatch();
    expect(watch.note(0, 5000)).toBe(false);
    expect(watch.note(1, 2000)).toBe(false);
    expect(watch.note(0, 0)).toBe(false); // partition 1 is still behind
    expect(watch.note(1, 0)).toBe(true);
    expect(watch.note(1, 0)).toBe(false); // already caught up: no backlog ended
  });

  it('never reports a backlog on a consumer that was never behind', () => {
    const watch = new BacklogWatch();
    for (let i = 0; i < 5; i++) expect(watch.note(i % 2, 0)).toBe(false);
  });

  it('forgets partitions behind before a rebalance', () => {
    const watch = new BacklogWatch();
    watch.note(3, 100);
    watch.reset();
    expect(watch.note(0, 10)).toBe(false);
    expect(watch.note(0, 0)).toBe(true); // partition 3 went elsewhere; it does not hold the backlog open
  });
});
