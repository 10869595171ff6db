import { describe, expect, it } from 'vitest';
import { containsSecret, redactSecrets } from './secrets.ts';

describe('secrets', () => {
  it.each([
    ['Bearer svc_live_pk_abc123.sk_9f8e7d6c5b4a', true],
    ['sk_live_1234567890abcdef', true],
    ['{"userAgent":"x sk_ABCDEFGH12"}', true],
    ['/v1/task_list', false],
    ['pk_live_abc123', false],
    ['sk_short', false],
    ['plain text', false],
  ])('containsSecret(%j) is %s', (text, expected) => {
    expect(containsSecret(text)).toBe(expected);
  });

  it('keeps the public part of a full key and removes the secret', () => {
    const redacted = redactSecrets('key=svc_live_pk_abc123.sk_9f8e7d6c5b4a3210 end');
    expect(redacted).toBe('key=svc_live_pk_abc123.[REDACTED] end');
    expect(redacted).not.toContain('9f8e7d6c');
  });

  it('redacts a bare secret wherever it appears, repeatedly', () => {
    const text = 'a sk_AAAAAAAAAA b sk_BBBBBBBBBB';
    expect(redactSecrets(text)).toBe('a sk_[REDACTED] b sk_[REDACTED]');
    // Regex state must not leak between calls (global regexes keep lastIndex).
    expect(containsSecret(text)).toBe(true);
    expect(containsSecret(text)).toBe(true);
  });
});
