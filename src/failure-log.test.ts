import { describe, expect, it } from 'vitest';
import { FailureLog } from './failure-log.ts';
import { createLogger } from './logger.ts';

function logged() {
  const lines: { level: number; msg: string; occurrences?: number; failures?: number; err?: { message: string } }[] = [];
  const logger = createLogger('info', { write: (line: string) => void lines.push(JSON.parse(line)) });
  let clock = 0;
  const log = new FailureLog(logger, 'storing failed', 'storage answers again', 'error', 60_000, () => clock);
  const summary = () => lines.map(({ level, msg, occurrences, failures, err }) => ({ level, msg, occurrences, failures, err: err?.message }));
  return { summary, log, advance: (ms: number) => (clock += ms) };
}

describe('FailureLog', () => {
  it('logs a failure when it starts, then at most once a minute with the occurrences since, and its end once', () => {
    const { summary, log, advance } = logged();
    // 130 failures 500 ms apart: at 0 s, and again at 60 s (the 121st, 120 since the first line).
    for (let i = 0; i < 130; i++, advance(500)) log.failed({ err: new Error('connection refused') });
    log.succeeded();
    log.succeeded();
    expect(summary()).toEqual([
      { level: 50, msg: 'storing failed', occurrences: 1, failures: undefined, err: 'connection refused' },
      { level: 50, msg: 'storing failed (still; logged at most once a minute)', occurrences: 120, failures: undefined, err: 'connection refused' },
      { level: 30, msg: 'storage answers again', occurrences: undefined, failures: 130, err: undefined },
    ]);
    expect(log.isFailing).toBe(false);
  });

  it('logs a failure that starts again after its end at once, as a new one', () => {
    const { summary, log, advance } = logged();
    log.failed();
    advance(1_000);
    log.succeeded();
    advance(1_000);
    log.failed();
    expect(summary().map(({ msg, occurrences }) => [msg, occurrences])).toEqual([
      ['storing failed', 1],
      ['storage answers again', undefined],
      ['storing failed', 1],
    ]);
    expect(log.isFailing).toBe(true);
  });

  it('says nothing of an end without a failure', () => {
    const { summary, log } = logged();
    log.succeeded();
    expect(summary()).toEqual([]);
  });
});
