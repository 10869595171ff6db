/**
 * Mints an admin API token from the configured ADMIN_JWT_SECRET, for development and tests:
 *
 *   npm run token -- --merchant m_1 --role admin [--plan business] [--user alice] [--ttl 3600]
 *
 * `npm run token` reads config/dev.env; a secret already in the environment wins. Prints the token only.
 */
import { ADMIN_ROLES, mintAdminToken, type AdminRole } from '../src/admin/auth.ts';
import { parseOptions, usageError } from './cli.ts';

const USAGE = 'usage: npm run token -- --merchant <merchantId> --role viewer|admin|operator [--plan business] [--user <id>] [--ttl <seconds>]';
function fail(message: string): never {
  usageError(message, USAGE);
}

const values = parseOptions(
  {
    merchant: { type: 'string' },
    role: { type: 'string', default: 'admin' },
    plan: { type: 'string', default: 'business' },
    user: { type: 'string', default: 'dev-admin' },
    ttl: { type: 'string', default: '3600' },
  },
  USAGE,
);

const secret = process.env.ADMIN_JWT_SECRET;
if (!secret) fail('ADMIN_JWT_SECRET is not set');
if (!values.merchant) fail('--merchant is required');
if (!(ADMIN_ROLES as readonly string[]).includes(values.role)) fail(`--role must be one of ${ADMIN_ROLES.join(', ')}`);
const ttlSeconds = Number(values.ttl);
if (!Number.isInteger(ttlSeconds) || ttlSeconds <= 0) fail('--ttl must be a positive number of seconds');

process.stdout.write(
  `${await mintAdminToken({ secret, userId: values.user, merchantId: values.merchant, role: values.role as AdminRole, plan: values.plan, ttlSeconds })}\n`,
);
