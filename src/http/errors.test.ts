import { afterEach, describe, expect, it } from 'vitest';
import { createLogger } from '../logger.ts';
import { WorkerMetrics } from '../metrics.ts';
import { HttpError } from './errors.ts';
import { createHttpServer } from './server.ts';

const closers: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0)) await close();
});

/** A server whose routes throw what the test names, and the log lines it writes. */
function server() {
  const lines: { level: number; msg: string; err?: { stack?: string }; refused?: number; code?: string }[] = [];
  const logger = createLogger('info', { write: (line: string) => void lines.push(JSON.parse(line)) });
  const app = createHttpServer({ logger, metrics: new WorkerMetrics({ defaultMetrics: false }), version: 'test', bodyLimit: 1024, notReadyReason: () => undefined });
  app.get('/refused', async () => {
    throw new HttpError(503, 'STORAGE_UNAVAILABLE', 'Storage is unavailable; retry later', undefined, { 'retry-after': '5' });
  });
  app.get('/internal', async () => {
    throw new HttpError(500, 'INTERNAL_ERROR', 'Internal error');
  });
  app.get('/bug', async () => {
    throw new TypeError("Cannot read properties of undefined (reading 'x')");
  });
  closers.push(() => app.close());
  const get = async (url: string) => {
    const response = await app.inject({ method: 'GET', url });
    return { status: response.statusCode, headers: response.headers, body: response.json() as { error: { code: string; message: string } } };
  };
  return { get, errors: () => lines.filter((line) => line.level >= 50), warnings: () => lines.filter((line) => line.level === 40) };
}

describe('the error handler', () => {
  it('answers a deliberate 503 as it says, and logs it no louder than one warning without a stack, however many there are', async () => {
    const { get, errors, warnings } = server();
    for (let i = 0; i < 5; i++) {
      const answer = await get('/refused');
      expect({ status: answer.status, retryAfter: answer.headers['retry-after'], code: answer.body.error.code }).toEqual({ status: 503, retryAfter: '5', code: 'STORAGE_UNAVAILABLE' });
    }
    expect(errors()).toEqual([]);
    expect(warnings()).toHaveLength(1);
    expect(warnings()[0]).toMatchObject({ code: 'STORAGE_UNAVAILABLE', refused: 1 });
    expect(warnings()[0]!.err).toBeUndefined();
  });

  it('logs each unexpected error, and each deliberate 500, at error level with its stack, and answers 500 without its message', async () => {
    const { get, errors } = server();
    const bug = await get('/bug');
    expect(bug).toMatchObject({ status: 500, body: { error: { code: 'INTERNAL_ERROR', message: 'Internal error' } } });
    expect(JSON.stringify(bug.body)).not.toContain('undefined');
    expect((await get('/internal')).status).toBe(500);
    expect(errors()).toHaveLength(2);
    expect(errors().map((line) => line.err?.stack?.split('\n')[0])).toEqual(["TypeError: Cannot read properties of undefined (reading 'x')", 'HttpError: Internal error']);
  });
});
