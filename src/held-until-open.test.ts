import { describe, expect, it } from 'vitest';
import { HeldUntilOpen } from './held-until-open.ts';

describe('HeldUntilOpen', () => {
  it('holds items in order until open, delivers them as one batch, then lets each batch through', () => {
    const delivered: number[][] = [];
    const gate = new HeldUntilOpen<number>(10, (items) => delivered.push(items));
    gate.take([1, 2]);
    gate.take([3]);
    expect(delivered).toEqual([]);
    expect(gate.open()).toEqual({ released: 3, dropped: 0 });
    gate.take([4]);
    gate.take([]);
    expect(delivered).toEqual([[1, 2, 3], [4]]);
  });

  it('holds the first maxHeld items and counts the rest as dropped', () => {
    const delivered: number[][] = [];
    const gate = new HeldUntilOpen<number>(3, (items) => delivered.push(items));
    gate.take([1, 2]);
    gate.take([3, 4, 5]);
    gate.take([6]);
    expect(gate.open()).toEqual({ released: 3, dropped: 3 });
    expect(delivered).toEqual([[1, 2, 3]]);
  });

  it('opened with nothing held delivers nothing', () => {
    const delivered: number[][] = [];
    const gate = new HeldUntilOpen<number>(3, (items) => delivered.push(items));
    expect(gate.open()).toEqual({ released: 0, dropped: 0 });
    expect(delivered).toEqual([]);
  });
});
