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
    // A full key glued to the key characters before it, or whose public part repeats its prefix.
    ['token-svc_live_pk_a.s3cr3t', true],
    ['svc_live_svc_live_pk.s3cr3t', true],
    // After an escape that stands for a separator, in a URL or in JSON text.
    ['/v1/cb?next=%2Fhook%3Fkey%3Dsk_live_x', true],
    ['{"userAgent":"a\\nsk_live_x"}', true],
    ['{"userAgent":"a\\u0020sk_live_x"}', true],
    // The underscore escaped.
    ['{"path":"/v1/sk\\u005flive_x"}', true],
    ['/v1/keys/sk%5Flive_x', true],
    // The `s` or the `k` escaped, in a URL (either case of hex) or in JSON text.
    ['/v1/keys/%73k_live_x', true],
    ['/v1/keys/s%6B_live_x', true],
    ['/v1/keys/s%6b_live_x', true],
    ['/v1/keys/%73%6B%5Flive_x', true],
    ['{"userAgent":"\\u0073k_live_x"}', true],
    ['{"userAgent":"s\\u006B_live_x"}', true],
    // A URL escape written with JSON escapes: JSON decoding gives `%73k_…`.
    ['{"path":"/v1/keys/\\u002573k_live_x"}', true],
    // A key character escaped right after what looks like the Slovak locale: a key, not a locale.
    ['sk_SK%41BCDEF', true],
    ['{"userAgent":"sk_SK\\u0041BCDEF"}', true],
    // Two capitals other than the locale's, or the locale's before base64's `+`, start a secret.
    ['sk_AB', true],
    ['sk_QR/abcdefSECRET', true],
    ['curl/8.0 sk_QR+f9aB3xYz', true],
    ['/v1/keys/sk_AB/cd3Ef/rotate', true],
    ['sk_SK+abc', true],
    ['sk_SK%2Babc', true],
    ['{"userAgent":"sk_SK\\u002babc"}', true],
    // A full key whose dot a URL or JSON text escaped.
    ['svc_live_pub123%2Es3cr3t', true],
    ['svc_live_pub123%2es3cr3t', true],
    ['{"path":"svc_live_pub123\\u002Es3cr3t"}', true],
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
    ['/docs/sk_SK/intro', false],
    // Escaped look-alikes: a word that ends in "sk" stays one when its letters or underscore are escapes.
    ['/v1/ta%73k_list', false],
    ['/v1/ri%73%6B_score', false],
    ['{"path":"/v1/ta\\u0073k_list"}', false],
    ['{"metric":"disk\\u005fusage"}', false],
    ['Desk_App/2.1 (Windows)', false],
    ['/v1/task_list?next=%2Fv1%2Frisk_score', false],
    // The locale followed by an escaped separator (`;`, a space) is still the locale.
    ['/v1/cb?lang=sk_SK%3B', false],
    ['{"userAgent":"FBLC/sk_SK\\u0020FBOP/5"}', false],
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

  it('keeps the public part of a full key glued to the text before it, and of one whose public part repeats the prefix', () => {
    expect(redactSecrets('token-svc_live_pk_a.s3cr3t;a_svc_test_pk.s3cr3t end')).toBe('token-svc_live_pk_a.[REDACTED];a_svc_test_pk.[REDACTED] end');
    expect(redactSecrets('svc_live_svc_live_pk.s3cr3t.svc_live_x')).toBe('svc_live_svc_live_pk.[REDACTED].svc_live_x');
    const long = `${'svc_live_'.repeat(2_000)}pk.s3cr3t`;
    expect(containsSecret(long)).toBe(true);
    expect(redactSecrets(long)).toBe(`${'svc_live_'.repeat(2_000)}pk.[REDACTED]`);
  });

  it('takes a secret in the standard base64 alphabet whole, bare or after a full key\'s dot', () => {
    expect(redactSecrets('key=sk_live_Ab+9/xQ+zZ== end')).toBe('key=sk_[REDACTED]== end');
    expect(redactSecrets('Bearer svc_live_pk_a1.sk_Ab+9/xQ+zZ==')).toBe('Bearer svc_live_pk_a1.[REDACTED]==');
    expect(redactSecrets('Bearer svc_live_pk_a1.Ab+9/xQ+zZ== x')).toBe('Bearer svc_live_pk_a1.[REDACTED]== x');
    expect(redactSecrets('{"u":"sk\\u005fAb+9/xQ\\u002bzZ"}')).toBe('{"u":"sk_[REDACTED]"}');
    // A lead followed by no key character is still no secret; the locale before a slash stays the locale.
    expect(containsSecret('a sk_/b sk_+c')).toBe(false);
    expect(redactSecrets('FBLC/sk_SK/FBAV')).toBe('FBLC/sk_SK/FBAV');
    // JSON text may escape the slash; a text that is no JSON is redacted as it stands, the escape with the rest.
    expect(redactSecrets('sk_live_Ab\\/9xQ end')).toBe('sk_[REDACTED] end');
    // The public part of a full key whose dot was escaped stays; the secret goes.
    expect(redactSecrets('key=svc_live_pk_a1%2Es3cr3t&x=1')).toBe('key=svc_live_pk_a1.[REDACTED]&x=1');
    // Its secret whole, whatever escapes write its characters (base64's `+` and `/` in a URL, `\/` in JSON text).
    expect(redactSecrets('key=svc_live_pk_a1%2EAb%2F9x%2Bq7ZzTAIL&x=1')).toBe('key=svc_live_pk_a1.[REDACTED]&x=1');
    expect(redactSecrets('svc_live_pk_a1.Ab\\/9xQ7Zz end')).toBe('svc_live_pk_a1.[REDACTED] end');
    expect(redactSecrets('key=svc_live_pk_a1.%41b9xQ7Zz end')).toBe('key=svc_live_pk_a1.[REDACTED] end');
    // A public id that ends a sentence is no key: what follows its dot is no key character.
    for (const text of ['key=svc_live_pk_a1.%20hello world', 'svc_live_bot.\\u00e9t\\u00e9 ok', 'see svc_live_pk_a1. Then']) {
      expect(containsSecret(text), text).toBe(false);
    }
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

/** Every way raw text may write `char` so that JSON decoding, URL decoding, or both in turn give it back. */
function writings(char: string): string[] {
  const hex = char.charCodeAt(0).toString(16).padStart(2, '0');
  const inUrl = [char, ...product(inJson('%'), inJsonEitherCase(hex[0]!), inJsonEitherCase(hex[1]!))];
  return [...new Set(inUrl.flatMap((form) => (form === char ? inJson(char) : [form])))];
}

/** `char` itself, or its JSON escape in either case of hex. */
function inJson(char: string): string[] {
  const hex = char.charCodeAt(0).toString(16).padStart(4, '0');
  return [...new Set([char, `\\u${hex}`, `\\u${hex.toUpperCase()}`])];
}

/** A hex digit as URL decoding reads it (either case), each written as JSON text may write it. */
function inJsonEitherCase(digit: string): string[] {
  return [...new Set([digit.toLowerCase(), digit.toUpperCase()])].flatMap(inJson);
}

function product(...parts: string[][]): string[] {
  return parts.reduce((heads, options) => heads.flatMap((head) => options.map((option) => head + option)), ['']);
}

/** What a reader gets back: JSON decoding of the text as a string's content, then URL decoding. */
function decoded(raw: string): string {
  return decodeURIComponent(JSON.parse(`"${raw}"`) as string);
}

describe('secrets written with escapes', () => {
  const leads = product(writings('s'), writings('k'), writings('_'));

  it('has every writing of the lead decode to `sk_` (the test data itself)', () => {
    expect(leads.length).toBe(10 * 19 * 19);
    for (const lead of leads) expect(decoded(lead)).toBe('sk_');
  });

  it('finds a secret whatever escapes write its lead, and redacts the whole escaped token', () => {
    const missed: string[] = [];
    for (const lead of leads) {
      const text = `{"path":"/v1/keys/${lead}live_x","status":201}`;
      if (!containsSecret(text) || redactSecrets(text) !== '{"path":"/v1/keys/sk_[REDACTED]","status":201}') missed.push(lead);
    }
    expect(missed).toEqual([]);
  });

  it('leaves a word that ends in "sk", and the Slovak locale, alone whatever escapes write them', () => {
    const flagged: string[] = [];
    for (const lead of leads) {
      for (const text of [`/v1/ta${lead}list`, `{"userAgent":"FBLC/${lead}SK;FBOP/5"}`]) if (containsSecret(text)) flagged.push(text);
    }
    expect(flagged).toEqual([]);
  });

  it('sees through URL escapes written again, as a URL encoded twice has them (`%` as `%25`)', () => {
    for (const text of ['/v1/cb?next=%2Fhook%253Fkey%253Dsk_live_x', '/v1/keys/%2573k_live_x', '/v1/keys/%252573k%25255Flive_x', '/v1/keys/sk%255Flive_x', '{"path":"/v1/keys/\\u00252573k_live_x"}']) {
      expect(containsSecret(text), text).toBe(true);
    }
    expect(redactSecrets('/v1/cb?next=%2Fhook%253Fkey%253Dsk_live_x&a=1')).toBe('/v1/cb?next=%2Fhook%253Fkey%253Dsk_[REDACTED]&a=1');
    expect(redactSecrets('/v1/keys/%2573k_live_ab%2563def "next"')).toBe('/v1/keys/sk_[REDACTED] "next"');
    // Still not a word that ends in "sk", nor the locale.
    for (const text of [
      '/v1/ta%2573k_list',
      '{"userAgent":"FBLC/%2573k_SK;FBOP/5"}',
      '/v1/ri%252573k%255Fscore',
      // The locale before a separator encoded twice.
      '/v1/login?next=%2Fhome%253Flocale%253Dsk_SK%2526tab%253D1',
      'Mozilla/5.0 [FBAN/FBIOS;FBLC%252Fsk_SK%253BFBOP/5]',
      'sk_SK%2520x',
    ]) {
      expect(containsSecret(text), text).toBe(false);
    }
    // The locale followed by a key character encoded twice is a key.
    expect(containsSecret('FBLC/sk_SK%2541b')).toBe(true);
  });

  it('keeps the public part of a full key whose underscores are escaped, and removes the secret', () => {
    expect(redactSecrets('/v1/keys/svc%5Flive_pk_abc.SECRETxyz123 end')).toBe('/v1/keys/svc%5Flive_pk_abc.[REDACTED] end');
    expect(redactSecrets('{"path":"svc\\u005ftest\\u005fpk_1.s3cr3t"}')).toBe('{"path":"svc\\u005ftest\\u005fpk_1.[REDACTED]"}');
    expect(redactSecrets('a=svc%255Flive%255Fpk_1%252Es3cr3t&b=1')).toBe('a=svc%255Flive%255Fpk_1.[REDACTED]&b=1');
  });

  it('redacts key characters written with escapes, URL escapes written with JSON escapes too', () => {
    expect(redactSecrets('/v1/keys/sk_li%76e_%\\u00341b "next"')).toBe('/v1/keys/sk_[REDACTED] "next"');
    expect(redactSecrets('/v1/cb?next=%\\u0032Fsk_live_x&a=1')).toBe('/v1/cb?next=%\\u0032Fsk_[REDACTED]&a=1');
  });
});

describe('secret scan cost', () => {
  const SIZE = 16 * 1024; // a user agent at Node's header limit: the API caller chooses it, and it is scanned before it is cut
  /** Scanning `text` both ways, five times: the least of several runs (a busy machine only adds time), within a second. */
  function scanMs(text: string): number {
    let least = Number.POSITIVE_INFINITY;
    const deadline = performance.now() + 1_000;
    for (let run = 0; run < 7 && (run === 0 || performance.now() < deadline); run++) {
      const started = performance.now();
      for (let i = 0; i < 5; i++) {
        containsSecret(text);
        redactSecrets(text);
      }
      least = Math.min(least, performance.now() - started);
    }
    return least;
  }

  // Benign text of the same size that the pre-check lets through too, so every regex scans it.
  const benign = 'Mozilla/5.0 (svc_live_a; FBLC/sk_SK) '.repeat(SIZE).slice(0, SIZE);

  it.each(['svc_live_', 'svc_test_', 'svc_live_a', 'svc%5Flive_', '%25', '%2525252525252525x', 'sk%2525252525252'])('scans 16 KiB repeating %j in time linear in its length, as it does benign text', (unit) => {
    const hostile = unit.repeat(SIZE).slice(0, SIZE);
    scanMs(benign); // compiled and warm, both
    const benignMs = scanMs(benign);
    const hostileMs = scanMs(hostile);
    // Linear: about 1 ms for these five scans, a few times benign text's. Quadratic (a match tried at
    // every `svc_<env>_`, each reading to the end of the run): about 500 ms, a thousand times it.
    const measured = JSON.stringify({ hostileMs, benignMs });
    expect(hostileMs, measured).toBeLessThan(50);
    expect(hostileMs / benignMs, measured).toBeLessThan(25);
  });
});
