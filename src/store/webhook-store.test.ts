import { describe, expect, it } from 'vitest';
import type { ClickHouse } from './clickhouse.ts';
import { tablesIn } from './tables.ts';
import { WebhookStore, type PendingMessage } from './webhook-store.ts';

describe('WebhookStore.putEndpoint', () => {
  it('keeps the secret out of the error when storage quotes the row back', async () => {
    const db = {
      insert: async (_table: string, _columns: readonly string[], body: Buffer) => {
        throw new Error(`Cannot parse input: expected '}' before: ${body.toString('utf8').slice(0, 400)}`);
      },
    } as unknown as ClickHouse;
    const secret = 'whsec_do_not_leak_0123456789abcdefghijklmnop';
    const store = new WebhookStore(db, tablesIn('sc'));
    const put = store.putEndpoint({ merchantId: 'm_1', endpointId: crypto.randomUUID(), url: 'https://hooks.example.com/a', secret, createdBy: 'u', updatedBy: 'u', createdAt: 0, updatedAt: 0 });
    await expect(put).rejects.toThrow(/storing a webhook endpoint failed: Cannot parse input.*\[REDACTED\]/);
    await expect(put).rejects.not.toThrow(secret);
  });
});

describe('WebhookStore claims', () => {
  const at = Date.UTC(2026, 10, 21, 10, 0, 0);
  const pending: PendingMessage = {
    id: '00000000-0000-4000-8000-000000000001',
    alertId: '00000000-0000-4000-8000-000000000002',
    merchantId: 'm_1',
    destination: 'oncall',
    endpointId: 'oncall:abc',
    target: 'https://oncall.example.com',
    body: '{"event":"anomaly.alert.critical"}',
    status: 'pending',
    owner: 'replica-a',
    attempts: 1,
    nextAttemptAt: at - 60_000,
    lastOutcome: 'http_error',
    lastError: 'HTTP 503',
    attemptLog: [{ attempt: 1, at: at - 120_000, outcome: 'http_error', statusCode: 503, error: 'HTTP 503', durationMs: 12 }],
    createdAt: at - 120_000,
    updatedAt: at - 120_000,
    dueAt: at,
    storedVersion: 1_795_000_000_000_000,
    endpoint: undefined,
  };

  it('writes the message as read, owned by the claimer until its lease ends, with the version just above the one read', async () => {
    const inserted: Record<string, unknown>[] = [];
    const db = {
      insert: async (_table: string, _columns: readonly string[], body: Buffer) => {
        inserted.push(...body.toString('utf8').trim().split('\n').map((line) => JSON.parse(line)));
      },
    } as unknown as ClickHouse;
    const store = new WebhookStore(db, tablesIn('sc'));
    store.nextVersion(); // a much higher version is at hand: the claim does not take it
    expect(await store.claimMessage(pending, 'replica-b', at + 20_000, at)).toBe(pending.storedVersion + 1);
    expect(inserted).toEqual([
      expect.objectContaining({
        id: pending.id,
        owner: 'replica-b',
        status: 'pending',
        attempts: 1,
        next_attempt_at: '2026-11-21 10:00:20.000',
        last_outcome: 'http_error',
        attempt_log: JSON.stringify(pending.attemptLog),
        body: pending.body,
        created_at: '2026-11-21 09:58:00.000',
        updated_at: '2026-11-21 10:00:00.000',
        version: pending.storedVersion + 1,
      }),
    ]);
  });

  it.each([
    ['no row (gone)', [], 'taken'],
    ['another replica\'s claim or outcome', [{ owner: 'replica-c', version: '1795000000000001', seen_at: '1970-01-01 00:00:00.000' }], 'taken'],
    ['a later write by the previous owner', [{ owner: 'replica-a', version: '1795000000000900', seen_at: '1970-01-01 00:00:00.000' }], 'taken'],
    ['the claim, its owner heard from 59 s ago', [{ owner: 'replica-b', version: '1795000000000001', seen_at: '2026-11-21 09:59:01.000' }], 'owner_alive'],
    ['the claim, its owner silent for a minute', [{ owner: 'replica-b', version: '1795000000000001', seen_at: '2026-11-21 09:59:00.000' }], 'claimed'],
    ['the claim, its owner never heard from', [{ owner: 'replica-b', version: '1795000000000001', seen_at: '1970-01-01 00:00:00.000' }], 'claimed'],
  ])('reads a claim back: %s', async (_case, rows, verdict) => {
    const db = { queryRows: async () => rows } as unknown as ClickHouse;
    const store = new WebhookStore(db, tablesIn('sc'));
    expect(await store.claimStands(pending, { owner: 'replica-b', version: pending.storedVersion + 1 }, 'replica-a', at, 60_000)).toBe(verdict);
  });
});
