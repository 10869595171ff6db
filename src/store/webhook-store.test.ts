import { describe, expect, it } from 'vitest';
import type { ClickHouse } from './clickhouse.ts';
import { tablesIn } from './tables.ts';
import { WebhookStore } from './webhook-store.ts';

describe('WebhookStore.putEndpoint', () => {
  it('keeps the secret out of the error when storage quotes the row back', async () => {
    const db = {
      insert: async (_table: string, _columns: readonly string[], body: Buffer) => {
        throw new Error(`Cannot parse input: expected '}' before: ${body.toString('utf8').slice(0, 400)}`);
      },
    } as unknown as ClickHouse;
    const secret = 'whsec_do_not_leak_0123456789abcdefghijklmnop';
    const store = new WebhookStore(db, tablesIn('sc'));
    const put = store.putEndpoint({ merchantId: 'm_1', endpointId: crypto.randomUUID(), url: 'https://hooks.example.com/a', secret, createdBy: 'u', createdAt: 0, updatedAt: 0 });
    await expect(put).rejects.toThrow(/storing a webhook endpoint failed: Cannot parse input.*\[REDACTED\]/);
    await expect(put).rejects.not.toThrow(secret);
  });
});
