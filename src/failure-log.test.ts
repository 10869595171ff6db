import { describe, expect, it } from 'vitest';
import { FailureLog } from './failure-log.ts';
import { createLogger } from './logger.ts';

function logged(quietMs?: number) {
  const lines: { level: number; msg: string; occurrences?: number; failures?: number; err?: { message: string } }[] = [];
  const logger = createLogger('info', { write: (line: string) => void lines.push(JSON.parse(line)) });
  let clock = 0;
  const log = new FailureLog(logger, 'storing failed', 'storage answers again', { intervalMs: 60_000, quietMs, now: () => clock });
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

  it('with quietMs, takes successes among the failures for no end: one failure line, and its end once the failures stop', () => {
    const { summary, log, advance } = logged(10_000);
    // Some partitions refusing, others not: failures and successes alternate for 30 s.
    for (let i = 0; i < 60; i++, advance(500)) i % 2 ? log.succeeded() : log.failed();
    expect(summary().map(({ msg }) => msg)).toEqual(['storing failed']);
    advance(10_000);
    log.succeeded();
    expect(summary().map(({ msg, failures }) => [msg, failures])).toEqual([
      ['storing failed', undefined],
      ['storage answers again', 30],
    ]);
  });

  it('takes an occurrence ten intervals after the previous one, with no success between, for a new failure', () => {
    const { summary, log, advance } = logged();
    log.failed();
    advance(9 * 60_000 + 59_999); // still the same failure
    log.failed();
    advance(10 * 60_000); // ten minutes later, and no success was ever reported
    log.failed();
    expect(summary().map(({ msg, occurrences }) => [msg, occurrences])).toEqual([
      ['storing failed', 1],
      ['storing failed (still; logged at most once a minute)', 1],
      ['storing failed', 1],
    ]);
  });

  it('says nothing of an end without a failure', () => {
    const { summary, log } = logged();
    log.succeeded();
    expect(summary()).toEqual([]);
  });
});
