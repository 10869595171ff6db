import { describe, expect, it } from 'vitest';
import { containsSecret, redactSecrets } from './secrets.ts';

describe('secrets', () => {
  it.each([
    ['Bearer svc_live_pk_abc123.sk_9f8e7d6c5b4a', true],
    ['sk_live_1234567890abcdef', true],
    ['{"userAgent":"x sk_ABCDEFGH12"}', true],
    // Short: test keys, and what a cut leaves of a secret.
    ['sk_live_x', true],
    ['sk_a1', true],
    ['sk_short', true],
    ['sk_0', true],
    ['sk_SKx', true],
    // Anywhere in a longer text: a user agent, a path, a query.
    ['curl/8.5 (key sk_live_x)', true],
    ['/v1/keys/sk_a1', true],
    ['/v1/verify?key=sk_live_x&next=1', true],
    ['svc_test_pk_1.sk_t', true],
    // After an escape that stands for a separator, in a URL or in JSON text.
    ['/v1/cb?next=%2Fhook%3Fkey%3Dsk_live_x', true],
    ['{"userAgent":"a\\nsk_live_x"}', true],
    ['{"userAgent":"a\\u0020sk_live_x"}', true],
    // The underscore escaped.
    ['{"path":"/v1/sk\\u005flive_x"}', true],
    ['/v1/keys/sk%5Flive_x', true],
    // Benign: words that end in "sk", public ids, and the Slovak locale in in-app browsers' user agents.
    ['/v1/task_list', false],
    ['risk_score', false],
    ['disk_usage=12', false],
    ['pk_live_abc123', false],
    ['plain text', false],
    ['sk_', false],
    ['sk-live-x', false],
    ['Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) [FBAN/FBIOS;FBLC/sk_SK;FBOP/5]', false],
    ['Instagram 330.0.0.31.109 (iPhone14,2; iOS 17_5; sk_SK; sk-SK; scale=3.00; 1170x2532)', false],
    ['{"userAgent":"lang=sk_SK"}', false],
  ])('containsSecret(%j) is %s, and redaction leaves none', (text, expected) => {
    expect(containsSecret(text)).toBe(expected);
    const redacted = redactSecrets(text);
    expect(containsSecret(redacted)).toBe(false);
    if (!expected) expect(redacted).toBe(text);
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

  it('redacts escaped secrets whole, escapes inside them included, and keeps what follows', () => {
    expect(redactSecrets('{"a":"sk\\u005flive_ab\\u0063def", "b":1}')).toBe('{"a":"sk_[REDACTED]", "b":1}');
    expect(redactSecrets('/v1/r?next=%3Dsk_live_ab%63def&x=1')).toBe('/v1/r?next=%3Dsk_[REDACTED]&x=1');
    expect(redactSecrets('{"a":"x\\nsk_live_abcdef"}')).toBe('{"a":"x\\nsk_[REDACTED]"}');
  });
});
