/**
 * Webhook signing secrets at rest. With WEBHOOK_SECRET_KEY set, a merchant's secret is stored sealed
 * (AES-256-GCM, a random nonce per value) and bound to its merchant and endpoint, so a sealed value
 * copied into another row does not open. A stored value without the prefix was written before
 * sealing was configured and is read as it is; it is sealed when the merchant registers again.
 * Errors never quote the secret or the stored value.
 */
import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';

const PREFIX = 'sealed:v1:';
const NONCE_BYTES = 12;
const TAG_BYTES = 16;

export class SecretBox {
  /** @param key 32 bytes, or undefined to store secrets as they are. */
  constructor(private readonly key: Buffer | undefined) {
    if (key && key.length !== 32) throw new Error('the webhook secret key must be 32 bytes');
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

  /** The secret a stored value holds; throws when a sealed value cannot be opened with this key. */
  open(stored: string, boundTo: string): string {
    if (!stored.startsWith(PREFIX)) return stored;
    if (!this.key) throw new Error('a webhook secret is stored sealed, but WEBHOOK_SECRET_KEY is not set');
    const raw = Buffer.from(stored.slice(PREFIX.length), 'base64url');
    try {
      if (raw.length < NONCE_BYTES + TAG_BYTES) throw new Error('too short');
      const decipher = createDecipheriv('aes-256-gcm', this.key, raw.subarray(0, NONCE_BYTES));
      decipher.setAAD(Buffer.from(boundTo, 'utf8'));
      decipher.setAuthTag(raw.subarray(NONCE_BYTES, NONCE_BYTES + TAG_BYTES));
      return Buffer.concat([decipher.update(raw.subarray(NONCE_BYTES + TAG_BYTES)), decipher.final()]).toString('utf8');
    } catch {
      throw new Error('a sealed webhook secret does not open with WEBHOOK_SECRET_KEY (another key, or an altered row)');
    }
  }
}

/** Parses WEBHOOK_SECRET_KEY: 32 bytes as 64 hex digits or as base64. Throws naming what is wrong. */
export function parseSecretKey(text: string): Buffer {
  const trimmed = text.trim();
  const key = /^[0-9a-fA-F]{64}$/.test(trimmed) ? Buffer.from(trimmed, 'hex') : Buffer.from(trimmed, 'base64');
  if (key.length !== 32) throw new Error('must be 32 bytes, as 64 hex digits or base64 (openssl rand -base64 32)');
  return key;
}
