/**
 * API key secrets (`sk_...`, or the part after the dot of `svc_<env>_<publicId>.<secret>`) must never
 * be stored, logged or dead-lettered. These helpers find and redact them in free text: event values,
 * and raw Kafka values as they arrived (JSON text with its escapes, or not JSON at all).
 *
 * The rule: a secret is `sk_` and at least one key character, at the start of a token.
 *  - Any length: a test key (`sk_live_x`, `sk_a1`) is a key, and so is what is left of a secret cut
 *    short (a dead letter keeps the first 16 KiB of a value). Benign text does not start a token
 *    with `sk_`, but for one thing: the Slovak locale, `sk_SK`, which user agents carry (Instagram's
 *    and Facebook's in-app browsers: `FBLC/sk_SK`). So `sk_` and two capitals alone are no secret.
 *  - At the start of a token: not glued to a letter or digit before it, or words that end in "sk"
 *    would be secrets (`/v1/task_list`, `risk_score`, `disk_usage`). A letter or digit that ends an
 *    escape is no word, though: `%3Dsk_…` in a URL (`=`), `\nsk_…` or `\u0020sk_…` in JSON text.
 *  - Escaped or not: the underscore and the key characters may be escapes (`sk\u005f…` in JSON
 *    text, `sk%5F…` in a URL), which a search of the raw text must see through.
 */

/** A JSON escape of a character (`\u005f`), or a URL's (`%5F`). */
const CHARACTER_ESCAPE = String.raw`\\u[0-9A-Fa-f]{4}|%[0-9A-Fa-f]{2}`;
/** Preceded by no letter or digit, or by an escape (which stands for a separator). */
const TOKEN_START = String.raw`(?:(?<![A-Za-z0-9])|(?<=${CHARACTER_ESCAPE}|\\[bfnrt]))`;
const LEAD = String.raw`sk(?:_|\\u005[fF]|%5[fF])`;
const LOCALE = String.raw`[A-Z]{2}(?![A-Za-z0-9_-])`;
const KEY_CHARACTERS = String.raw`(?:[A-Za-z0-9_-]|${CHARACTER_ESCAPE})+`;
const BARE_SECRET = new RegExp(`${TOKEN_START}${LEAD}(?!${LOCALE})${KEY_CHARACTERS}`, 'g');
/** Cheap pre-check (this runs on every event): text without a match holds no secret. One regex scans faster than four searches. */
const SECRET_HINT = /sk(?:_|\\u005|%5)|svc_/;
// A whole key: keep the safe public part, drop what follows the dot.
const FULL_KEY = /(svc_(?:test|live)_[A-Za-z0-9_-]+)\.[A-Za-z0-9_-]+/g;

export const REDACTED = '[REDACTED]';

/** True when the text carries something that looks like an API key secret. */
export function containsSecret(text: string): boolean {
  if (!SECRET_HINT.test(text)) return false;
  BARE_SECRET.lastIndex = 0;
  FULL_KEY.lastIndex = 0;
  return BARE_SECRET.test(text) || FULL_KEY.test(text);
}

/** Replaces every secret-looking substring with a redaction marker. */
export function redactSecrets(text: string): string {
  if (!SECRET_HINT.test(text)) return text;
  return text.replace(FULL_KEY, `$1.${REDACTED}`).replace(BARE_SECRET, `sk_${REDACTED}`);
}
