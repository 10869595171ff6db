/**
 * The development scripts the README's hands-on walk-through uses, run as `npm run` runs them (tsx):
 * `token` mints a token the admin API accepts; a mistake in the options, or a worker that is not
 * there, is a one-line message and an exit code, not a stack trace.
 */
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { AdminAuthenticator } from '../src/admin/auth.ts';

const REPO_ROOT = fileURLToPath(new URL('../', import.meta.url));
const SECRET = 'a-test-admin-jwt-secret-of-at-least-32-chars';

function run(script: string, args: string[], env: Record<string, string> = {}): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, ['--import', 'tsx', `scripts/${script}`, ...args], { cwd: REPO_ROOT, env: { PATH: process.env.PATH ?? '', ...env } }, (error, stdout, stderr) =>
      resolve({ code: error ? Number(error.code) : 0, stdout, stderr }),
    );
  });
}

describe('npm run token', () => {
  it('mints a token the admin API accepts, with the merchant, role, plan and user asked for', async () => {
    const minted = await run('mint-token.ts', ['--merchant', 'm_7', '--role', 'operator', '--plan', 'enterprise', '--user', 'alice'], { ADMIN_JWT_SECRET: SECRET });
    expect(minted).toMatchObject({ code: 0, stderr: '' });
    const principal = await new AdminAuthenticator(SECRET, ['business', 'enterprise']).authenticate(`Bearer ${minted.stdout.trim()}`);
    expect(principal).toMatchObject({ userId: 'alice', merchantId: 'm_7', role: 'operator', plan: 'enterprise' });
  });

  it.each([
    ['an unknown option', ['--merchan', 'm_7'], /Unknown option '--merchan'/],
    ['no merchant', ['--role', 'admin'], /--merchant is required/],
    ['a role that is none of the three', ['--merchant', 'm_7', '--role', 'root'], /--role must be one of viewer, admin, operator/],
  ])('refuses %s with its reason and the usage, exit 2', async (_case, args, reason) => {
    const refused = await run('mint-token.ts', args, { ADMIN_JWT_SECRET: SECRET });
    expect(refused.code).toBe(2);
    expect(refused.stdout).toBe('');
    expect(refused.stderr).toMatch(reason);
    expect(refused.stderr).toMatch(/^usage: npm run token/m);
    expect(refused.stderr).not.toMatch(/\n\s+at /); // no stack trace
  });

  it('prints the usage for --help, exit 0', async () => {
    expect(await run('mint-token.ts', ['--help'])).toMatchObject({ code: 0, stdout: expect.stringMatching(/^usage: npm run token/) });
  });
});

describe('npm run demo:attack', () => {
  it('says it cannot reach a worker that is not there, exit 1', async () => {
    const failed = await run('demo-attack.ts', ['--url', 'http://127.0.0.1:9'], { INGEST_TOKEN: 'a-token' });
    expect(failed.code).toBe(1);
    expect(failed.stderr).toMatch(/^cannot reach the worker at http:\/\/127\.0\.0\.1:9: /);
    expect(failed.stderr).not.toMatch(/\n\s+at /);
  });

  it('refuses an unknown option with the usage, exit 2', async () => {
    const refused = await run('demo-attack.ts', ['--merchants', 'm_7'], { INGEST_TOKEN: 'a-token' });
    expect(refused.code).toBe(2);
    expect(refused.stderr).toMatch(/^usage: npm run demo:attack/m);
  });
});
