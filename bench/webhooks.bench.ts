/**
 * tsx bench/webhooks.bench.ts (npm run bench:webhooks) — a burst of critical alerts through the
 * webhook dispatcher: stored, attempted over TLS, results stored, on the embedded ClickHouse engine,
 * to an HTTPS receiver on loopback in the same process (so the receiver's TLS work is counted too).
 * Prints deliveries per second, the time to the last delivery, and the time spent in each storage
 * operation. Env: BENCH_ALERTS (1000), BENCH_CONCURRENCY (16), BENCH_MERCHANT_SHARE (0.2: the share of
 * alerts whose merchant registered an endpoint; each such alert is a second delivery).
 */
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Alert } from '../src/alerts/alert.ts';
import { createLogger } from '../src/logger.ts';
import { WorkerMetrics } from '../src/metrics.ts';
import { connectClickHouse } from '../src/store/clickhouse.ts';
import { migrate } from '../src/store/migrate.ts';
import { tablesIn } from '../src/store/tables.ts';
import { WebhookStore } from '../src/store/webhook-store.ts';
import { WebhookDispatcher } from '../src/webhooks/dispatcher.ts';
import { targetPolicy } from '../src/webhooks/target-policy.ts';
import { makeTestCertificates, startReceiver } from '../test/support/https-receiver.ts';

const ALERTS = Number(process.env.BENCH_ALERTS ?? 1_000);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 16);
const MERCHANT_SHARE = Number(process.env.BENCH_MERCHANT_SHARE ?? 0.2);
const MERCHANTS = 5;

const certs = makeTestCertificates();
const receiver = await startReceiver(certs.server);
const dataDir = mkdtempSync(join(tmpdir(), 'sc-bench-webhooks-'));
const db = connectClickHouse({ username: 'default', password: '', dataDir });
const tables = tablesIn('bench_webhooks');
const logger = createLogger('silent');
await migrate(db, { tables, eventsTtlDays: 30 }, logger);
const store = new WebhookStore(db, tables);

const timings = new Map<string, { calls: number; ms: number }>();
for (const name of ['pendingMessages', 'endpoints', 'saveMessages', 'saveBreakers'] as const) {
  const original = store[name].bind(store) as (...args: unknown[]) => Promise<unknown>;
  (store as unknown as Record<string, unknown>)[name] = async (...args: unknown[]) => {
    const started = performance.now();
    try {
      return await original(...args);
    } finally {
      const entry = timings.get(name) ?? { calls: 0, ms: 0 };
      entry.calls++;
      entry.ms += performance.now() - started;
      timings.set(name, entry);
    }
  };
}

const registered = Math.round(MERCHANTS * MERCHANT_SHARE);
for (let m = 0; m < registered; m++) {
  const now = Date.now();
  await store.putEndpoint({ merchantId: `m_${m}`, endpointId: randomUUID(), url: `${receiver.origin}/m_${m}`, secret: 's'.repeat(40), createdBy: 'bench', updatedBy: 'bench', createdAt: now, updatedAt: now });
}
const dispatcher = new WebhookDispatcher({
  store,
  oncall: { url: `${receiver.origin}/oncall`, secret: 'o'.repeat(40) },
  policy: targetPolicy({ allowPrivate: true }),
  ca: [certs.caPem],
  metrics: new WorkerMetrics({ defaultMetrics: false }),
  logger,
  concurrency: CONCURRENCY,
  maxUnsaved: Math.max(ALERTS, 5_000),
});
await dispatcher.start();

const expected = ALERTS + Math.floor((ALERTS * registered) / MERCHANTS);
const started = performance.now();
for (let i = 0; i < ALERTS; i++) {
  const at = new Date().toISOString();
  const alert: Alert = {
    id: randomUUID(), merchantId: `m_${i % MERCHANTS}`, apiKeyId: `pk_live_${i}`, type: 'bot_traffic', scope: `pk_live_${i}`,
    severity: 'critical', riskScore: 0.95, recommendedAction: 'block', status: 'open', title: `Attack tool on pk_live_${i}`,
    summary: 'sqlmap holds this key', evidence: { tools: { sqlmap: 1 }, sampleEventIds: ['e1', 'e2', 'e3'] }, ruleId: 'bot_traffic',
    ruleVersion: '1.0.0', firstSeenAt: at, lastSeenAt: at, occurrences: 1, createdAt: at, updatedAt: at,
    history: [{ at, actor: 'system', from: null, to: 'open', note: 'created by detection' }],
  };
  dispatcher.notify(alert);
}
while (receiver.received.length < expected) await new Promise((resolve) => setTimeout(resolve, 20));
const seconds = (performance.now() - started) / 1000;

console.log(`${expected} deliveries of ${ALERTS} critical alerts, concurrency ${CONCURRENCY}: ${seconds.toFixed(1)} s, ${Math.round(expected / seconds)} deliveries/s`);
console.log(`held in memory at most: ${dispatcher.stats().maxBusy} messages, ${dispatcher.stats().maxSending} attempts in flight`);
for (const [name, { calls, ms }] of timings) console.log(`  ${name}: ${calls} calls, ${Math.round(ms)} ms, ${(ms / calls).toFixed(1)} ms each`);

await dispatcher.stop();
await db.close();
await receiver.close();
certs.remove();
rmSync(dataDir, { recursive: true, force: true });
