import { describe, expect, it } from 'vitest';
import { ResponseCache } from './response-cache.ts';

describe('ResponseCache', () => {
  it('shares one computation between concurrent and later requests until the entry expires', async () => {
    let clock = 0;
    let computations = 0;
    const cache = new ResponseCache(5_000, 100, () => clock);
    const compute = async () => ++computations;
    expect(await Promise.all([cache.get('m_1', 'dash', compute), cache.get('m_1', 'dash', compute)])).toEqual([1, 1]);
    clock = 4_999;
    expect(await cache.get('m_1', 'dash', compute)).toBe(1);
    clock = 5_000;
    expect(await cache.get('m_1', 'dash', compute)).toBe(2);
    expect(await cache.get('m_2', 'dash', compute)).toBe(3); // another key, another computation
  });

  it('does not keep a failure', async () => {
    const cache = new ResponseCache(5_000);
    await expect(cache.get(undefined, 'k', () => Promise.reject(new Error('storage down')))).rejects.toThrow('storage down');
    expect(await cache.get(undefined, 'k', async () => 'ok')).toBe('ok');
  });

  it('keeps at most maxEntries, dropping the oldest', async () => {
    let computations = 0;
    const cache = new ResponseCache(60_000, 2);
    const compute = async () => ++computations;
    await cache.get(undefined, 'a', compute);
    await cache.get(undefined, 'b', compute);
    await cache.get(undefined, 'c', compute);
    expect(await cache.get(undefined, 'b', compute)).toBe(2);
    expect(await cache.get(undefined, 'a', compute)).toBe(4); // 'a' was dropped
  });

  it('computes every time when the ttl is 0', async () => {
    let computations = 0;
    const cache = new ResponseCache(0);
    await cache.get(undefined, 'k', async () => ++computations);
    expect(await cache.get(undefined, 'k', async () => ++computations)).toBe(2);
  });

  it('never shares an answer across merchants, nor with the all-merchants view', async () => {
    const cache = new ResponseCache(60_000);
    expect(await cache.get('m_1', 'dash', async () => 'm_1')).toBe('m_1');
    expect(await cache.get('all', 'dash', async () => 'a merchant named all')).toBe('a merchant named all');
    expect(await cache.get(undefined, 'dash', async () => 'every merchant')).toBe('every merchant');
    expect(await cache.get('m_1\u0000dash', '', async () => 'a merchant id with the separator')).toBe('a merchant id with the separator');
    expect(await cache.get('m_1', 'dash', async () => 'recomputed')).toBe('m_1');
  });

  it("drops a merchant's answers and the all-merchants view's on invalidate, and no other merchant's", async () => {
    let computations = 0;
    const cache = new ResponseCache(60_000);
    const compute = async () => ++computations;
    for (const merchantId of ['m_1', 'm_2', undefined]) await cache.get(merchantId, 'dash', compute);
    await cache.get('m_1', 'metrics', compute);
    cache.invalidate('m_1');
    expect(await cache.get('m_1', 'dash', compute)).toBe(5);
    expect(await cache.get('m_1', 'metrics', compute)).toBe(6);
    expect(await cache.get(undefined, 'dash', compute)).toBe(7);
    expect(await cache.get('m_2', 'dash', compute)).toBe(2); // kept
  });
});
