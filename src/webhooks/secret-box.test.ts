import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { parseSecretKey, SecretBox } from './secret-box.ts';

const SECRET = 'whsec_0123456789abcdefghijklmnopqrstuv';
const ROW = 'm_1/ep_1';

describe('SecretBox', () => {
  const box = new SecretBox(randomBytes(32));

  it('seals a secret so the stored value does not show it, and opens it again', () => {
    const stored = box.seal(SECRET, ROW);
    expect(stored).toMatch(/^sealed:v1:/);
    expect(stored).not.toContain(SECRET);
    expect(box.open(stored, ROW)).toBe(SECRET);
    expect(box.seal(SECRET, ROW)).not.toBe(stored); // a fresh nonce every time
  });

  it('reports a sealed value moved to another row, altered, or opened with another key as unreadable', () => {
    const stored = box.seal(SECRET, ROW);
    expect(box.open(stored, 'm_2/ep_1')).toBeUndefined();
    const altered = `${stored.slice(0, -2)}${stored.endsWith('AA') ? 'BB' : 'AA'}`;
    expect(box.open(altered, ROW)).toBeUndefined();
    expect(new SecretBox(randomBytes(32)).open(stored, ROW)).toBeUndefined();
    expect(box.open('sealed:v1:abc', ROW)).toBeUndefined();
  });

  it('reads values stored before sealing as they are, and needs a key for sealed ones', () => {
    expect(box.open(SECRET, ROW)).toBe(SECRET);
    const plain = new SecretBox(undefined);
    expect(plain.seal(SECRET, ROW)).toBe(SECRET);
    expect(plain.open(box.seal(SECRET, ROW), ROW)).toBeUndefined();
    expect(box.seal('', ROW)).toBe(''); // a removed endpoint's blanked secret
  });

  it('opens values sealed with a previous key after a rotation, and seals new ones with the current key', () => {
    const oldKey = randomBytes(32);
    const sealedBefore = new SecretBox(oldKey).seal(SECRET, ROW);
    const rotated = new SecretBox(randomBytes(32), [oldKey]);
    expect(rotated.open(sealedBefore, ROW)).toBe(SECRET);
    const sealedAfter = rotated.seal(SECRET, ROW);
    expect(new SecretBox(oldKey).open(sealedAfter, ROW)).toBeUndefined(); // not sealed with the old key
    expect(rotated.open(sealedAfter, ROW)).toBe(SECRET);
    expect(() => new SecretBox(randomBytes(32), [randomBytes(16)])).toThrow(/32 bytes/);
  });

  it('reseals values sealed with a previous key, or stored before sealing, under the current key only', () => {
    const oldKey = randomBytes(32);
    const newKey = randomBytes(32);
    const rotated = new SecretBox(newKey, [oldKey]);
    const onlyNew = new SecretBox(newKey);
    for (const before of [new SecretBox(oldKey).seal(SECRET, ROW), SECRET]) {
      const resealed = rotated.reseal(before, ROW)!;
      expect(resealed).toMatch(/^sealed:v1:/);
      expect(onlyNew.open(resealed, ROW)).toBe(SECRET); // the old key is no longer needed
      expect(rotated.reseal(resealed, ROW)).toBeUndefined(); // current already
    }
    expect(rotated.reseal(new SecretBox(randomBytes(32)).seal(SECRET, ROW), ROW)).toBeUndefined(); // opens with no key
    expect(rotated.reseal('', ROW)).toBeUndefined(); // a removed endpoint's blanked secret
    expect(new SecretBox(undefined).reseal(SECRET, ROW)).toBeUndefined(); // no key: stored as it is
  });
});

describe('parseSecretKey', () => {
  it('takes 32 bytes as hex or base64 and refuses anything else', () => {
    const key = randomBytes(32);
    expect(parseSecretKey(key.toString('hex'))).toEqual(key);
    expect(parseSecretKey(` ${key.toString('base64')}\n`)).toEqual(key);
    expect(() => parseSecretKey(randomBytes(16).toString('base64'))).toThrow(/32 bytes/);
    expect(() => parseSecretKey('not a key')).toThrow(/32 bytes/);
  });
});
