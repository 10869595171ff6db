/**
 * Webhook signing secrets at rest. With WEBHOOK_SECRET_KEY set, a merchant's secret is stored sealed
 * (AES-256-GCM, a random nonce per value) and bound to its merchant and endpoint, so a sealed value
 * copied into another row does not open. A stored value without the prefix was written before
 * sealing was configured and is read as it is, until `reseal` (at the worker's start) seals it.
 * Rotation: new values are sealed with the current key; values sealed with a previous key
 * (WEBHOOK_SECRET_KEY_PREVIOUS) still open, and `reseal` gives them (and values stored before
 * sealing) anew under the current key.
 * A value that opens with no key is reported as unreadable (undefined), never thrown: one merchant's
 * unreadable row must not stop deliveries to every other merchant and to on-call.
 */
import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';

const PREFIX = 'sealed:v1:';
const NONCE_BYTES = 12;
const TAG_BYTES = 16;

export class SecretBox {
  /**
   * @param key 32 bytes, or undefined to store secrets as they are.
   * @param previousKeys keys that sealed values stored before a rotation; used to open only.
   */
  constructor(
    private readonly key: Buffer | undefined,
    private readonly previousKeys: readonly Buffer[] = [],
  ) {
    for (const each of [...(key ? [key] : []), ...previousKeys]) if (each.length !== 32) throw new Error('a webhook secret key must be 32 bytes');
  }

  /** The value to store for a secret; `boundTo` names the row it belongs to. An empty secret stays empty. */
  seal(secret: string, boundTo: string): string {
    if (!this.key || secret === '') return secret;
    const nonce = randomBytes(NONCE_BYTES);
    const cipher = createCipheriv('aes-256-gcm', this.key, nonce);
    cipher.setAAD(Buffer.from(boundTo, 'utf8'));
    const sealed = Buffer.concat([cipher.update(secret, 'utf8'), cipher.final()]);
    return PREFIX + Buffer.concat([nonce, cipher.getAuthTag(), sealed]).toString('base64url');
  }

  /**
   * The secret a stored value holds; undefined when a sealed value opens with none of the keys
   * (another key, no key configured, or an altered or moved row).
   */
  open(stored: string, boundTo: string): string | undefined {
    if (!stored.startsWith(PREFIX)) return stored;
    return this.openWith([...(this.key ? [this.key] : []), ...this.previousKeys], stored, boundTo);
  }

  /**
   * The value to store instead, sealed with the current key, when the stored one opens but not with
   * it (a previous key, or stored before sealing); undefined when it is current already, opens with
   * no key, or no key is configured.
   */
  reseal(stored: string, boundTo: string): string | undefined {
    if (!this.key || stored === '') return undefined;
    if (stored.startsWith(PREFIX) && this.openWith([this.key], stored, boundTo) !== undefined) return undefined;
    const secret = this.open(stored, boundTo);
    return secret === undefined ? undefined : this.seal(secret, boundTo);
  }

  private openWith(keys: readonly Buffer[], stored: string, boundTo: string): string | undefined {
    const raw = Buffer.from(stored.slice(PREFIX.length), 'base64url');
    if (raw.length < NONCE_BYTES + TAG_BYTES) return undefined;
    for (const key of keys) {
      try {
        const decipher = createDecipheriv('aes-256-gcm', key, raw.subarray(0, NONCE_BYTES));
        decipher.setAAD(Buffer.from(boundTo, 'utf8'));
        decipher.setAuthTag(raw.subarray(NONCE_BYTES, NONCE_BYTES + TAG_BYTES));
        return Buffer.concat([decipher.update(raw.subarray(NONCE_BYTES + TAG_BYTES)), decipher.final()]).toString('utf8');
      } catch {
        // not this key: try the next
      }
    }
    return undefined;
  }
}

/** Parses WEBHOOK_SECRET_KEY: 32 bytes as 64 hex digits or as base64. Throws naming what is wrong. */
export function parseSecretKey(text: string): Buffer {
  const trimmed = text.trim();
  const key = /^[0-9a-fA-F]{64}$/.test(trimmed) ? Buffer.from(trimmed, 'hex') : Buffer.from(trimmed, 'base64');
  if (key.length !== 32) throw new Error('must be 32 bytes, as 64 hex digits or base64 (openssl rand -base64 32)');
  return key;
}
