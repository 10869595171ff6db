/**
 * API key secrets (`sk_...`, or the part after the dot of `svc_<env>_<publicId>.<secret>`) must never
 * be stored, logged or dead-lettered. These helpers find and redact them in free text: event values,
 * and raw Kafka values as they arrived (JSON text with its escapes, or not JSON at all).
 *
 * The rule: a secret is `sk_` and at least one key character, at the start of a token.
 *  - Any length: a test key (`sk_live_x`, `sk_a1`) is a key, and so is what is left of a secret cut
 *    short (a dead letter keeps the first 16 KiB of a value). Benign text does not start a token
 *    with `sk_`, but for one thing: the Slovak locale, `sk_SK`, which user agents carry (Instagram's
 *    and Facebook's in-app browsers: `FBLC/sk_SK`). So `sk_SK` alone, or before a separator, is no
 *    secret. The locale is those two capitals only: `sk_QR/…` is a secret in base64 (as `sk_SK+…` is),
 *    and only one whose first characters are `SK/` or `SK` and a separator goes unseen.
 *  - At the start of a token: not glued to a letter or digit before it, or words that end in "sk"
 *    would be secrets (`/v1/task_list`, `risk_score`, `disk_usage`). A letter or digit that ends an
 *    escape is no word, though: `%3Dsk_…` in a URL (`=`), `\nsk_…` or `\u0020sk_…` in JSON text.
 *  - Escaped or not: any of its characters may be an escape, JSON's (`\u0073k_…`, `sk\u005f…`), a
 *    URL's in either case of hex (`%73k_…`, `s%6B_…`, `sk%5F…`), or a URL's written with JSON escapes
 *    (`\u002573k_…`, which JSON decoding turns into `%73k_…`), or a URL's encoded again, its `%` as
 *    `%25` (`key%253Dsk_…`, `%2573k_…`: a URL that a proxy or a client encoded twice). Whatever JSON
 *    decoding, URL decoding (repeated) or both in turn read as `sk_…` is a secret; a search of the
 *    raw text sees through them all, and redaction takes the whole escaped token. A full key's
 *    prefix and dot may be escaped the same ways (`svc%5Flive_…`).
 */

/**
 * `char` as raw text may write it so that JSON decoding, URL decoding, or both in that order give it
 * back: itself, `\u00hh` (JSON), `%hh` (URL), and the URL escape with any of its characters written
 * as JSON escapes (`\u0025hh`, `%\u0037\u0033`). URL decoding reads either case of hex digits.
 */
function written(char: string): string {
  const [high, low] = hexDigits(char.charCodeAt(0));
  return `(?:${inJson(char)}|${URL_ESCAPE_START}${inJson(high!)}${inJson(low!)})`;
}

/** One of `chars` as JSON text may write it: itself, or a `\u00hh` escape in either case of hex. */
function inJson(chars: string): string {
  const escapes = [...chars].map((char) => hexDigits(char.charCodeAt(0)).map(eitherCase).join(''));
  return String.raw`(?:[${chars}]|\\u00(?:${escapes.join('|')}))`;
}

/** The two hex digits of a code below 256, each as the characters URL decoding reads for it (`6`, `bB`). */
function hexDigits(code: number): string[] {
  return [...code.toString(16).padStart(2, '0')].map((digit) => (/[a-f]/.test(digit) ? digit + digit.toUpperCase() : digit));
}

function eitherCase(chars: string): string {
  return chars.length === 1 ? chars : `[${chars}]`;
}

/**
 * The `%` of a URL escape, itself escaped as `%25` any number of times (`%2573` is `s` URL-encoded
 * twice, as a proxy that encodes a URL again writes it), each character also as a JSON escape.
 */
const URL_ESCAPE_START = `${inJson('%')}(?:${inJson('2')}${inJson('5')})*`;
/** A hex digit, or a JSON escape of one (as in `%\u00373`). */
const HEX_DIGIT = String.raw`(?:[0-9A-Fa-f]|\\u00(?:3[0-9]|[46][1-6]))`;
/** A JSON escape of a character (`\u005f`), or a URL's (`%5F`, also with JSON escapes in it: `\u00255F`). */
const CHARACTER_ESCAPE = String.raw`\\u[0-9A-Fa-f]{4}|${URL_ESCAPE_START}${HEX_DIGIT}{2}`;
/** An escape that may stand for a key character (`+`, `-`, a digit, a letter, `_`), or start a URL escape of one. */
const KEY_CHARACTER_HEX = '(?:2[bBdD]|3[0-9]|4[1-9A-Fa-f]|5[0-9aAfF]|6[1-9A-Fa-f]|7[0-9aA])';
// A URL escape encoded again counts only with a key character's hex after its `%25`s: `sk_SK%2526`
// is the locale and a double-encoded `&`.
const KEY_CHARACTER_ESCAPE = String.raw`(?:\\u00|%(?:25)*)${KEY_CHARACTER_HEX}|\\u0025|%\\u`;
/**
 * What may stand before a secret: nothing, a character that is no letter or digit, or an escape
 * (which stands for a separator). Checked behind the lead, not in front of it: a look-behind tried at
 * every position of the text costs ten times more than one tried at each lead found (`task_`).
 */
const BEFORE_TOKEN = String.raw`(?:^|[^A-Za-z0-9]|${CHARACTER_ESCAPE}|\\[bfnrt])`;
const LEAD = `${written('s')}${written('k')}${written('_')}`;
// The Slovak locale is `SK` and no key character after it, escaped or not (`sk_SK%41…` is a key); a
// slash may follow it, as the separator of a user agent's or a path's next part (`FBLC/sk_SK/FBAV`).
const LOCALE = String.raw`SK(?![A-Za-z0-9_+-]|${KEY_CHARACTER_ESCAPE})`;
/**
 * A secret's characters: after the lead, a key character (or an escape), then base64's `+` and `/` as
 * well (`/` also as JSON text may escape it, `\/`), so that a secret in the standard base64 alphabet is taken whole. What follows a secret in a
 * path (`sk_…/rotate`) goes with it: more is redacted than needed, never less.
 */
const SECRET_TAIL = String.raw`(?:[A-Za-z0-9_+/-]|\\/|${CHARACTER_ESCAPE})*`;
const KEY_CHARACTERS = String.raw`(?:[A-Za-z0-9_-]|${CHARACTER_ESCAPE})${SECRET_TAIL}`;
const BARE_SECRET = new RegExp(`${LEAD}(?<=${BEFORE_TOKEN}${LEAD})(?!${LOCALE})${KEY_CHARACTERS}`, 'g');
/**
 * Cheap pre-check (this runs on every event): text that fails it holds no secret. A lead (see written)
 * is `sk` and then `_` or the start of an escape, or it holds an escape itself; a full key starts
 * `svc_`. One search for one character (`%`, `\`) costs a fifth of the regex's scan: added to the
 * regex, they would slow its scan down, as it could no longer skip to each `s`.
 */
const PLAIN_HINT = /sk[_%\\]|svc_/;

function mayHoldSecret(text: string): boolean {
  return PLAIN_HINT.test(text) || text.includes('%') || text.includes('\\');
}

/** A full key's prefix, its underscores also escaped (`svc%5Flive_`), as a lead's characters may be. */
const KEY_PREFIX = `svc${written('_')}(?:test|live)${written('_')}`;
/** The dot between a key's public part and its secret, also as a URL or JSON text may escape it (`%2E`, `%252E`, `\u002e`). */
const KEY_DOT = String.raw`(?:\.|${URL_ESCAPE_START}2[eE]|\\u002[eE])`;
/**
 * A whole key: keep the safe public part, drop what follows the dot (a secret's characters, escapes
 * included, as after a lead; but it starts with a key character, as a dot that ends a sentence is
 * followed by a space, `%20`). It is tried only at the first
 * `svc_<env>_` of a run of key characters, where the leftmost match starts anyway (so it matches
 * what it would without the check, a key glued to the text before it included). Tried at every
 * one, each try would read to the end of the run looking for the dot: text that repeats
 * `svc_live_` (a user agent is the API caller's to choose) would cost time quadratic in its length.
 * The check comes after the prefix, so that the regex still skips from `svc_` to `svc_`, and reads
 * back only to the previous prefix or the start of the run: linear time.
 */
const FULL_KEY = new RegExp(
  String.raw`(${KEY_PREFIX}(?<!${KEY_PREFIX}[A-Za-z0-9_-]*?${KEY_PREFIX})[A-Za-z0-9_-]+)${KEY_DOT}(?:[A-Za-z0-9_-]|${KEY_CHARACTER_ESCAPE})${SECRET_TAIL}`,
  'g',
);

export const REDACTED = '[REDACTED]';

/** The error of a field that carries an API key secret (never quoting it): the field is refused, not stored. */
export const CARRIES_SECRET = 'must not carry an API key secret (sk_…); name the key by its public id';

/** True when the text carries something that looks like an API key secret. */
export function containsSecret(text: string): boolean {
  if (!mayHoldSecret(text)) return false;
  BARE_SECRET.lastIndex = 0;
  FULL_KEY.lastIndex = 0;
  return BARE_SECRET.test(text) || FULL_KEY.test(text);
}

/** Replaces every secret-looking substring with a redaction marker. */
export function redactSecrets(text: string): string {
  if (!mayHoldSecret(text)) return text;
  return text.replace(FULL_KEY, `$1.${REDACTED}`).replace(BARE_SECRET, `sk_${REDACTED}`);
}
