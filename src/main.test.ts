import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { capturedLogs } from '../test/support/logs.ts';
import { retryUntilDone, startKafkaIntake, storageCause } from './main.ts';

interface Line {
  level: number;
  msg: string;
  err?: { message: string };
  attempt?: number;
  occurrences?: number;
  failures?: number;
  setting?: string;
  brokers?: string[];
}

/** kafkajs's error when no broker can be reached. */
function unreachable(): Error {
  return Object.assign(new Error('Connection error: connect ECONNREFUSED 10.0.0.5:9092'), { name: 'KafkaJSConnectionError' });
}

describe('startKafkaIntake', () => {
  const brokers = ['10.0.0.5:9092', 'kafka-2.internal:9092'];

  it('logs failed starts as one failure naming KAFKA_BROKERS: the first at once, then once a minute with the count, then the start', async () => {
    const { logger, lines } = capturedLogs<Line>();
    // A start every 30 s (the backoff's cap), failing seven times while the brokers cannot be reached.
    let clock = 0;
    let starts = 0;
    const intake = {
      start: async () => {
        clock += 30_000;
        if (++starts <= 7) throw unreachable();
      },
    };
    await startKafkaIntake(intake, brokers, logger, new AbortController().signal, { backoffMs: () => 0, now: () => clock });
    expect(starts).toBe(8);
    expect(lines.map(({ level, msg, err, attempt, occurrences, failures, setting, brokers }) => ({ level, msg, err: err?.message, attempt, occurrences, failures, setting, brokers }))).toEqual([
      { level: 50, msg: 'starting kafka intake failed', err: 'Connection error: connect ECONNREFUSED 10.0.0.5:9092', attempt: 1, occurrences: 1, failures: undefined, setting: 'KAFKA_BROKERS', brokers },
      // 60 s after the first line: the attempts at 60 s and 90 s.
      { level: 50, msg: 'starting kafka intake failed (still; logged at most once a minute)', err: 'Connection error: connect ECONNREFUSED 10.0.0.5:9092', attempt: 3, occurrences: 2, failures: undefined, setting: 'KAFKA_BROKERS', brokers },
      { level: 50, msg: 'starting kafka intake failed (still; logged at most once a minute)', err: 'Connection error: connect ECONNREFUSED 10.0.0.5:9092', attempt: 5, occurrences: 2, failures: undefined, setting: 'KAFKA_BROKERS', brokers },
      { level: 50, msg: 'starting kafka intake failed (still; logged at most once a minute)', err: 'Connection error: connect ECONNREFUSED 10.0.0.5:9092', attempt: 7, occurrences: 2, failures: undefined, setting: 'KAFKA_BROKERS', brokers },
      { level: 30, msg: 'kafka intake started after failed starts', err: undefined, attempt: undefined, occurrences: undefined, failures: 7, setting: undefined, brokers: undefined },
    ]);
  });

  it('logs nothing of its own when the first start succeeds', async () => {
    const { logger, lines } = capturedLogs<Line>();
    await startKafkaIntake({ start: async () => {} }, brokers, logger, new AbortController().signal);
    expect(lines).toEqual([]);
  });
});

describe('retryUntilDone', () => {
  it('logs the failed attempts of other steps as one failure too, and hands each error to onFailure', async () => {
    const { logger, lines } = capturedLogs<Line>();
    const heard: unknown[] = [];
    let attempts = 0;
    const step = async () => {
      if (++attempts <= 3) throw new Error(`refused ${attempts}`);
    };
    await retryUntilDone('migrating storage', logger, new AbortController().signal, step, { backoffMs: () => 0, onFailure: (error) => heard.push(error) });
    // Within the minute: the first failure, then the step done after the three.
    expect(lines.map(({ level, msg, err, attempt, failures }) => ({ level, msg, err: err?.message, attempt, failures }))).toEqual([
      { level: 50, msg: 'migrating storage failed', err: 'refused 1', attempt: 1, failures: undefined },
      { level: 30, msg: 'migrating storage done after failed attempts', err: undefined, attempt: undefined, failures: 3 },
    ]);
    expect(heard.map((error) => (error as Error).message)).toEqual(['refused 1', 'refused 2', 'refused 3']);
  });

  it('ends when the signal aborts, without another attempt', async () => {
    const { logger } = capturedLogs<Line>();
    const abort = new AbortController();
    let attempts = 0;
    const step = async () => {
      attempts++;
      abort.abort();
      throw new Error('refused');
    };
    await expect(retryUntilDone('loading alerts', logger, abort.signal, step, { backoffMs: () => 60_000 })).rejects.toThrow('refused');
    expect(attempts).toBe(1);
  });
});

describe('storageCause', () => {
  const password = 'Hq7!xP2mZ9';
  it.each([
    ['a message as it is', new Error('connect ECONNREFUSED 10.0.0.7:8123'), 'connect ECONNREFUSED 10.0.0.7:8123'],
    ['its first line only', new Error('Code: 60. DB::Exception: Table sc.alerts does not exist.\nStack trace:\n0. DB::Exception'), 'Code: 60. DB::Exception: Table sc.alerts does not exist.'],
    ['without the credentials of a URL', new Error('request to https://worker:s3cr@t@ch.internal:8443/?query=1 failed'), 'request to https://ch.internal:8443/?query=1 failed'],
    ['without the ClickHouse password', new Error(`Authentication failed: password ${password} is incorrect`), 'Authentication failed: password [REDACTED] is incorrect'],
    ['the name of an error without a message', new TypeError(''), 'TypeError'],
    ['what is thrown that is no error', 'timed out', 'timed out'],
  ])('quotes %s', (_, error, cause) => {
    expect(storageCause(error, password)).toBe(cause);
  });

  it('cuts a long message short', () => {
    const cause = storageCause(new Error(`Code: 62. DB::Exception: Syntax error: ${'x'.repeat(1_000)}`), '');
    expect(cause).toHaveLength(301);
    expect(cause.endsWith('x…')).toBe(true);
  });
});

describe('the start commands', () => {
  const root = new URL('../', import.meta.url);
  const scripts = (JSON.parse(readFileSync(new URL('package.json', root), 'utf8')) as { scripts: Record<string, string> }).scripts;
  const dockerCommand = /^CMD (.*)$/m.exec(readFileSync(new URL('Dockerfile', root), 'utf8'))?.[1] ?? '';
  const semiSpace = (command: string) => /--max-semi-space-size=\d+/.exec(command)?.[0];

  it('give the worker the young generation it was measured with, in the image, under npm start and in bench:ingest alike', () => {
    // The main thread's scavenges copy the Kafka fetch in hand: 64 MB semi-spaces made Kafka intake
    // faster (README, Performance; the analysis thread's are set to 16 MB, startWorkerThread).
    // bench:ingest runs the worker in its own process, so it must start Node as npm start does.
    expect(semiSpace(scripts.start!)).toBe('--max-semi-space-size=64');
    expect(semiSpace(scripts['bench:ingest']!)).toBe(semiSpace(scripts.start!));
    expect(semiSpace(dockerCommand.replaceAll('"', ''))).toBe(semiSpace(scripts.start!));
  });
});
