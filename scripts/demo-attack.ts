/**
 * Posts a velocity attack to a running worker over HTTP ingest, for trying the admin API by hand:
 * three minutes of 200 requests a minute from one key against a limit of 60.
 *
 *   npm run demo:attack [-- --merchant m_demo --key pk_live_demo --url http://127.0.0.1:8080]
 *
 * Uses INGEST_TOKEN from the environment or config/dev.env.
 */
import { randomUUID } from 'node:crypto';
import { parseOptions, usageError } from './cli.ts';

const USAGE = 'usage: npm run demo:attack [-- --merchant <merchantId> --key <apiKeyId> --url <worker URL>]';

const values = parseOptions(
  {
    merchant: { type: 'string', default: 'm_demo' },
    key: { type: 'string', default: 'pk_live_demo' },
    url: { type: 'string', default: `http://127.0.0.1:${process.env.PORT ?? 8080}` },
  },
  USAGE,
);
const token = process.env.INGEST_TOKEN;
if (!token) usageError('INGEST_TOKEN is not set', USAGE);

const MINUTE = 60_000;
const currentMinute = Math.floor(Date.now() / MINUTE) * MINUTE;
const events = [3, 2, 1].flatMap((ago) =>
  Array.from({ length: 200 }, (_, i) => ({
    eventId: `evt_demo_${randomUUID()}`,
    timestamp: new Date(currentMinute - ago * MINUTE + i * 300).toISOString(),
    merchantId: values.merchant,
    plan: 'business',
    apiKeyId: values.key,
    environment: 'live',
    ip: '198.51.100.7',
    userAgent: 'python-requests/2.32.3',
    method: 'POST',
    path: '/v1/verify/sessions',
    status: 201,
    responseTimeMs: 45,
    rateLimitPerMinute: 60,
  })),
);
const response = await fetch(`${values.url}/v1/ingest/events`, {
  method: 'POST',
  headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
  body: JSON.stringify(events),
}).catch((error: unknown) => {
  // fetch says only "fetch failed"; its cause names the connection's error (ECONNREFUSED: no worker there).
  const cause = error instanceof Error && error.cause instanceof Error ? error.cause.message : String(error);
  process.stderr.write(`cannot reach the worker at ${values.url}: ${cause}\n`);
  process.exit(1);
});
process.stdout.write(`${response.status} ${await response.text()}\n`);
if (!response.ok) process.exitCode = 1;
