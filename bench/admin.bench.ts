/**
 * npm run bench:admin — the admin API under load: 1M alerts and 30 days of per-minute rollups
 * stored, then 50 concurrent clients call the API over HTTP for a while per scenario. Prints p50,
 * p99 and the request rate of each scenario.
 * Data: 1M alerts over 50 merchants, a fifth of them (200k) belonging to the busy merchant the
 * clients are admins of; 30 days of per-minute rollups for the busy merchant (40 keys, every minute)
 * and for the 49 others (2 keys each), and the per-merchant quarter hours they add up to. All are
 * generated inside ClickHouse (INSERT ... SELECT), so loading takes seconds. The clients run in this process, beside the worker, on the same cores: the figures
 * include their own cost.
 * The dashboard is measured with FEATURE_AI_RISK_SCORING on, so it includes the insights' query.
 * Before the clients start, it times the two reads every replica repeats in the background over
 * the same alerts: the enforcement decisions' refresh (every 2 s) and the sync of alerts written by
 * other replicas (every 5 s).
 * Then it times the traffic reads behind metrics and dashboards, uncached (EventStore.trafficTotals
 * and trafficTrend), for the busy merchant and for the operators' all-merchants view.
 * Env: BENCH_ALERTS (1000000), BENCH_CLIENTS (50), BENCH_SECONDS (10 per scenario), BENCH_AI (true),
 * BENCH_BUSY_KEYS (40: the busy merchant's keys in the rollups, each active every minute).
 */
import { createLogger } from '../src/logger.ts';
import { startWorker } from '../src/main.ts';
import type { AlertStore } from '../src/store/alert-store.ts';
import type { EventStore } from '../src/store/event-store.ts';
import { tablesIn } from '../src/store/tables.ts';
import { startClickHouse } from '../test/services/clickhouse.ts';
import { ADMIN_ENV, token } from '../test/support/admin.ts';
import { testConfig, testNames } from '../test/support/worker.ts';

const ALERTS = Number(process.env.BENCH_ALERTS ?? 1_000_000);
const CLIENTS = Number(process.env.BENCH_CLIENTS ?? 50);
const SECONDS = Number(process.env.BENCH_SECONDS ?? 10);
const MERCHANTS = 50;
const BUSY = 'm_busy';
const BUSY_KEYS = Number(process.env.BENCH_BUSY_KEYS ?? 40);
const DAYS = 30;
const DAY_MS = 86_400_000;

interface Scenario {
  name: string;
  /** The path (under /admin/anomaly) of a client's next request; state carries a cursor along. */
  next(state: { cursor: string | null; i: number }): string;
  /** Reads the page's cursor, for scenarios that page. */
  onBody?(state: { cursor: string | null }, body: { data: { nextCursor?: string | null } }): void;
}

const FILTERS = ['', '&status=open,acknowledged', '&severity=critical', '&type=velocity_attack', `&apiKeyId=pk_live_${BUSY}_7`];

const SCENARIOS: Scenario[] = [
  { name: 'alerts list, first page (limit 50, filters varied)', next: ({ i }) => `/alerts?limit=50${FILTERS[i % FILTERS.length]}` },
  {
    name: 'alerts list, paging on with nextCursor',
    next: ({ cursor }) => `/alerts?limit=50${cursor ? `&cursor=${cursor}` : ''}`,
    onBody: (state, body) => {
      state.cursor = body.data.nextCursor ?? null;
    },
  },
  { name: 'dashboard, range 24h', next: () => '/dashboard?range=24h' },
  { name: 'dashboard, range 7d', next: () => '/dashboard?range=7d' },
];

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? Number.NaN;
}

/** The median of `rounds` timed calls, in ms, after one untimed. */
async function medianMs(rounds: number, call: () => Promise<unknown>): Promise<number> {
  await call();
  const times: number[] = [];
  for (let i = 0; i < rounds; i++) {
    const started = performance.now();
    await call();
    times.push(performance.now() - started);
  }
  return percentile(times.sort((a, b) => a - b), 50);
}

/** The reads each replica repeats on its own, whatever the clients do (as main.ts and alert-service.ts make them). */
async function timeBackgroundReads(alerts: AlertStore): Promise<void> {
  const enforcementTtlMs = 60 * 60_000;
  const syncOverlapMs = 65_000;
  const enforceable = await medianMs(10, () => alerts.enforceable(new Date(Date.now() - enforcementTtlMs)));
  const sync = await medianMs(10, () => alerts.changedSince(new Date(Date.now() - syncOverlapMs)));
  console.log(`background reads over ${ALERTS} alerts (median of 10): enforcement refresh ${enforceable.toFixed(0)} ms (every 2 s), sync with other replicas ${sync.toFixed(0)} ms (every 5 s)`);
}

/**
 * The traffic reads of metrics and dashboards, uncached, as the admin API makes them: the ranges end
 * now, and a dashboard's starts at the start of a chart bucket (alert-routes.ts).
 */
async function timeTrafficReads(events: EventStore): Promise<void> {
  const now = Date.now();
  const dashboard = (rangeMs: number, bucketSeconds: number, merchantId?: string) => {
    const bucketMs = bucketSeconds * 1000;
    const range = { from: new Date(Math.floor((now - rangeMs) / bucketMs) * bucketMs), to: new Date(now), merchantId };
    return () => Promise.all([events.trafficTotals(range), events.trafficTrend({ ...range, bucketSeconds })]);
  };
  const metrics = (rangeMs: number, merchantId?: string) => () => events.trafficTotals({ from: new Date(now - rangeMs), to: new Date(now), merchantId });
  const reads: [string, () => Promise<unknown>][] = [
    [`dashboard 24h, ${BUSY}`, dashboard(DAY_MS, 900, BUSY)],
    ['dashboard 24h, all merchants', dashboard(DAY_MS, 900)],
    [`dashboard 7d, ${BUSY}`, dashboard(7 * DAY_MS, 3600, BUSY)],
    ['dashboard 7d, all merchants', dashboard(7 * DAY_MS, 3600)],
    [`metrics ${DAYS}d, ${BUSY}`, metrics(DAYS * DAY_MS, BUSY)],
    [`metrics ${DAYS}d, all merchants`, metrics(DAYS * DAY_MS)],
  ];
  console.log('traffic reads, uncached (median of 5, ms):');
  for (const [name, read] of reads) console.log(`  ${name}: ${(await medianMs(5, read)).toFixed(0)}`);
}

async function main(): Promise<void> {
  const clickhouse = await startClickHouse();
  const config = testConfig({
    clickhouse,
    names: testNames('benchadmin'),
    extra: { ...ADMIN_ENV, FEATURE_ANOMALY_DETECTION: 'false', FEATURE_AI_RISK_SCORING: process.env.BENCH_AI ?? 'true', ADMIN_RATE_LIMIT_PER_MINUTE: '1000000' },
  });
  const worker = await startWorker(config, { logger: createLogger('warn') });
  try {
    await worker.ready;
    const db = worker.clickhouse;
    const tables = tablesIn(clickhouse.database);

    let started = performance.now();
    await db.command(`
      INSERT INTO ${tables.alerts}
      SELECT
        generateUUIDv4(number) AS id,
        if(number % 5 = 0, '${BUSY}', concat('m_', toString(number % ${MERCHANTS - 1}))) AS merchant_id,
        concat('pk_live_', merchant_id, '_', toString(intDiv(number, 7) % ${BUSY_KEYS})) AS api_key_id,
        arrayElement(['velocity_attack', 'impossible_travel', 'high_failure_rate', 'bot_traffic', 'credential_sharing'], number % 5 + 1) AS type,
        api_key_id AS scope,
        arrayElement(['low', 'medium', 'high', 'critical'], intDiv(number, 5) % 4 + 1) AS severity,
        [0.3, 0.55, 0.8, 0.95][intDiv(number, 5) % 4 + 1] AS risk_score,
        arrayElement(['monitor', 'rate_limit', 'investigate', 'block'], intDiv(number, 5) % 4 + 1) AS recommended_action,
        multiIf(number % 10 < 6, 'resolved', number % 10 < 8, 'dismissed', number % 10 < 9, 'acknowledged', 'open') AS status,
        concat('Anomaly on ', api_key_id) AS title,
        'A synthetic alert of the admin benchmark, as long as a real summary would be: what happened and what to do.' AS summary,
        '{"observed":840,"threshold":90,"windowMs":300000,"distinctIps":["203.0.113.7","203.0.113.9"],"sampleEventIds":["evt_1","evt_2","evt_3"]}' AS evidence,
        type AS rule_id,
        '1.0.0' AS rule_version,
        created_at - toIntervalMinute(5) AS first_seen_at,
        created_at AS last_seen_at,
        1 + number % 40 AS occurrences,
        now64(3) - toIntervalMillisecond(number * ${Math.floor((DAYS * 86_400_000) / ALERTS)}) AS created_at,
        created_at AS updated_at,
        '[{"at":"2026-11-01T00:00:00.000Z","actor":"system","from":null,"to":"open","note":"created by detection"}]' AS history,
        [] AS ai_insights,
        1 AS version
      FROM numbers(${ALERTS})`);
    console.log(`loaded ${ALERTS} alerts (${ALERTS / 5} of ${BUSY}) in ${((performance.now() - started) / 1000).toFixed(1)} s`);

    started = performance.now();
    const minutes = DAYS * 1440;
    await db.command(`
      INSERT INTO ${tables.requestRollup1m}
      SELECT merchant_id, api_key_id, minute, requests, successes, requests - successes - server_errors AS client_errors, server_errors,
             intDiv(client_errors, 2) AS auth_failures, 0 AS not_found, 0 AS rate_limited,
             requests * 80.0 AS response_time_sum, 900 AS response_time_max,
             arrayReduce('uniqState', [toIPv6(IPv4NumToString(toUInt32(3405803776 + (number % 13))))]) AS unique_ips
      FROM (
        SELECT number,
               if(number < ${minutes * BUSY_KEYS}, '${BUSY}', concat('m_', toString(intDiv(number - ${minutes * BUSY_KEYS}, ${minutes * 2})))) AS merchant_id,
               concat('pk_live_', merchant_id, '_', toString(intDiv(number, ${minutes}) % ${BUSY_KEYS})) AS api_key_id,
               toStartOfMinute(now()) - toIntervalMinute(number % ${minutes}) AS minute,
               toUInt64(20 + number % 50) AS requests,
               toUInt64(requests - number % 4) AS successes,
               toUInt64(number % 2) AS server_errors
        FROM numbers(${minutes * BUSY_KEYS + minutes * 2 * (MERCHANTS - 1)})
      )`);
    // The per-merchant quarter hours, as merchant_rollup_15m's view would have written them from the events.
    await db.command(`
      INSERT INTO ${tables.merchantRollup15m}
      SELECT merchant_id, toStartOfFifteenMinutes(minute) AS quarter_hour, sum(requests), sum(successes), sum(client_errors),
             sum(server_errors), sum(auth_failures), sum(not_found), sum(rate_limited), sum(response_time_sum),
             max(response_time_max), uniqMergeState(unique_ips)
      FROM ${tables.requestRollup1m}
      GROUP BY merchant_id, quarter_hour`);
    const rollupRows = minutes * BUSY_KEYS + minutes * 2 * (MERCHANTS - 1);
    console.log(`loaded ${rollupRows} rollup rows (${DAYS} days) in ${((performance.now() - started) / 1000).toFixed(1)} s`);

    await timeBackgroundReads(worker.alertStore);
    await timeTrafficReads(worker.store);

    const tokens = await Promise.all(Array.from({ length: CLIENTS }, (_, i) => token(BUSY, 'admin', { userId: `bench_${i}` })));
    // Warm up: one round of every scenario, so first-query costs do not count.
    for (const scenario of SCENARIOS) await fetch(`${worker.url}/admin/anomaly${scenario.next({ cursor: null, i: 0 })}`, { headers: { authorization: `Bearer ${tokens[0]}` } });

    console.log(`\n${CLIENTS} concurrent clients, ${SECONDS} s per scenario (${clickhouse.kind} ClickHouse)`);
    console.log('| scenario | requests | req/s | p50 ms | p99 ms | errors |');
    console.log('|---|---|---|---|---|---|');
    for (const scenario of SCENARIOS) {
      const latencies: number[] = [];
      let errors = 0;
      const deadline = performance.now() + SECONDS * 1000;
      const begun = performance.now();
      await Promise.all(
        tokens.map(async (bearer, client) => {
          const state = { cursor: null as string | null, i: client };
          while (performance.now() < deadline) {
            const sent = performance.now();
            const response = await fetch(`${worker.url}/admin/anomaly${scenario.next(state)}`, { headers: { authorization: `Bearer ${bearer}` } });
            const body = (await response.json()) as { data: { nextCursor?: string | null } };
            latencies.push(performance.now() - sent);
            if (response.status !== 200) errors++;
            else scenario.onBody?.(state, body);
            state.i++;
          }
        }),
      );
      const elapsed = (performance.now() - begun) / 1000;
      latencies.sort((a, b) => a - b);
      console.log(
        `| ${scenario.name} | ${latencies.length} | ${Math.round(latencies.length / elapsed)} | ${percentile(latencies, 50).toFixed(0)} | ${percentile(latencies, 99).toFixed(0)} | ${errors} |`,
      );
    }
    console.log(`peak RSS: ${Math.round(process.resourceUsage().maxRSS / 1024)} MiB`);
  } finally {
    await worker.stop();
    await clickhouse.stop();
  }
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
