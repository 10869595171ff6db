import { describe, expect, it } from 'vitest';
import { ResponseCache } from './response-cache.ts';

describe('ResponseCache', () => {
  it('shares one computation between concurrent and later requests until the entry expires', async () => {
    let clock = 0;
    let computations = 0;
    const cache = new ResponseCache(5_000, 100, () => clock);
    const compute = async () => ++computations;
    expect(await Promise.all([cache.get('m_1:dash', compute), cache.get('m_1:dash', compute)])).toEqual([1, 1]);
    clock = 4_999;
    expect(await cache.get('m_1:dash', compute)).toBe(1);
    clock = 5_000;
    expect(await cache.get('m_1:dash', compute)).toBe(2);
    expect(await cache.get('m_2:dash', compute)).toBe(3); // another key, another computation
  });

  it('does not keep a failure', async () => {
    const cache = new ResponseCache(5_000);
    await expect(cache.get('k', () => Promise.reject(new Error('storage down')))).rejects.toThrow('storage down');
    expect(await cache.get('k', async () => 'ok')).toBe('ok');
  });

  it('keeps at most maxEntries, dropping the oldest', async () => {
    let computations = 0;
    const cache = new ResponseCache(60_000, 2);
    const compute = async () => ++computations;
    await cache.get('a', compute);
    await cache.get('b', compute);
    await cache.get('c', compute);
    expect(await cache.get('b', compute)).toBe(2);
    expect(await cache.get('a', compute)).toBe(4); // 'a' was dropped
  });

  it('computes every time when the ttl is 0', async () => {
    let computations = 0;
    const cache = new ResponseCache(0);
    await cache.get('k', async () => ++computations);
    expect(await cache.get('k', async () => ++computations)).toBe(2);
  });
});
