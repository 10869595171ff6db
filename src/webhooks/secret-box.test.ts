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

  it('refuses a sealed value moved to another row, altered, or opened with another key, without quoting it', () => {
    const stored = box.seal(SECRET, ROW);
    expect(() => box.open(stored, 'm_2/ep_1')).toThrow(/does not open/);
    const altered = `${stored.slice(0, -2)}${stored.endsWith('AA') ? 'BB' : 'AA'}`;
    expect(() => box.open(altered, ROW)).toThrow(/does not open/);
    expect(() => new SecretBox(randomBytes(32)).open(stored, ROW)).toThrow(/does not open/);
    expect(() => box.open('sealed:v1:abc', ROW)).toThrow(/does not open/);
    try {
      box.open(altered, ROW);
    } catch (error) {
      expect(String(error)).not.toContain(stored);
    }
  });

  it('reads values stored before sealing as they are, and needs the key for sealed ones', () => {
    expect(box.open(SECRET, ROW)).toBe(SECRET);
    const plain = new SecretBox(undefined);
    expect(plain.seal(SECRET, ROW)).toBe(SECRET);
    expect(() => plain.open(box.seal(SECRET, ROW), ROW)).toThrow(/WEBHOOK_SECRET_KEY is not set/);
    expect(box.seal('', ROW)).toBe(''); // a removed endpoint's blanked secret
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
