/**
 * API key secrets (`sk_...`, or the part after the dot of `svc_<env>_<publicId>.<secret>`) must never
 * be stored, logged or dead-lettered. These helpers find and redact them in free text.
 */

// A secret is `sk_` plus at least 8 key characters, not glued to a preceding word ("task_list" is not one).
const BARE_SECRET = /(?<![A-Za-z0-9])sk_[A-Za-z0-9_-]{8,}/g;
// A whole key: keep the safe public part, drop what follows the dot.
const FULL_KEY = /(svc_(?:test|live)_[A-Za-z0-9_-]+)\.[A-Za-z0-9_-]+/g;

export const REDACTED = '[REDACTED]';

/** True when the text carries something that looks like an API key secret. */
export function containsSecret(text: string): boolean {
  // Cheap pre-check first: this runs on every event.
  if (!text.includes('sk_') && !text.includes('svc_')) return false;
  BARE_SECRET.lastIndex = 0;
  FULL_KEY.lastIndex = 0;
  return BARE_SECRET.test(text) || FULL_KEY.test(text);
}

/** Replaces every secret-looking substring with a redaction marker. */
export function redactSecrets(text: string): string {
  if (!text.includes('sk_') && !text.includes('svc_')) return text;
  return text.replace(FULL_KEY, `$1.${REDACTED}`).replace(BARE_SECRET, `sk_${REDACTED}`);
}
