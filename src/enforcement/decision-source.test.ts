import { describe, expect, it } from 'vitest';
import { makeAlert } from '../../test/support/admin.ts';
import type { Alert } from '../alerts/alert.ts';
import { DetectionConfig } from '../detect/detection-config.ts';
import { createLogger } from '../logger.ts';
import { WorkerMetrics } from '../metrics.ts';
import { EXPIRY_RECORD_STEP_MS, type DecisionRecord } from '../store/enforcement-history-store.ts';
import { DecisionSource } from './decision-source.ts';

const T0 = Date.UTC(2026, 10, 21, 12, 0, 0);
const MINUTE = 60_000;

/** A source over alerts the test sets (or a failing read), on a clock the test moves. */
function source(mode: 'shadow' | 'enforce' = 'enforce') {
  const state = { now: T0, alerts: [] as Alert[], failing: false, since: [] as number[], config: new DetectionConfig(), historyFailing: false, slowWrite: undefined as Promise<void> | undefined };
  const history: DecisionRecord[] = [];
  const lines: { level: number; msg: string; [field: string]: unknown }[] = [];
  const metrics = new WorkerMetrics({ defaultMetrics: false });
  const decisions = new DecisionSource({
    mode,
    policy: { blockMinRisk: 0.95, ttlMs: 30 * MINUTE },
    readAlerts: async (since) => {
      state.since.push(since.getTime());
      if (state.failing) throw new Error('injected: storage cannot be read');
      return state.alerts;
    },
    writeHistory: async (records) => {
      if (state.slowWrite) await state.slowWrite;
      if (state.historyFailing) throw new Error('injected: history cannot be written');
      history.push(...records);
    },
    config: () => state.config,
    metrics,
    logger: createLogger('info', { write: (line: string) => lines.push(JSON.parse(line)) }),
    staleAfterMs: 30_000,
    now: () => state.now,
  });
  const gauge = async (name: string, action?: string) =>
    (await metrics.registry.getSingleMetric(name)!.get()).values.find((value) => action === undefined || value.labels.action === action)?.value;
  return { state, lines, decisions, gauge, history };
}

const attack = (apiKeyId: string, overrides: Partial<Alert> = {}) =>
  makeAlert(0, { merchantId: 'm_1', createdAtMs: T0 - MINUTE, apiKeyId, severity: 'high', riskScore: 0.8, recommendedAction: 'rate_limit', ...overrides });

describe('DecisionSource', () => {
  it('has no answer until storage was read, then serves the decisions of alerts seen within the TTL', async () => {
    const { state, decisions, gauge } = source();
    expect(decisions.current()).toBeUndefined();
    expect(await gauge('security_center_enforcement_decisions_fresh')).toBe(0);
    state.alerts = [attack('pk_live_a')];
    await decisions.refresh();
    expect(state.since).toEqual([T0 - 30 * MINUTE]);
    expect(decisions.current()).toMatchObject({ generatedAt: T0, staleAfter: T0 + 30_000, decisions: [{ apiKeyId: 'pk_live_a', action: 'throttle' }] });
    expect(await gauge('security_center_enforcement_decisions', 'throttle')).toBe(1);
    expect(await gauge('security_center_enforcement_decisions', 'block')).toBe(0);
    expect(await gauge('security_center_enforcement_decisions_fresh')).toBe(1);
  });

  it('serves a key\'s next strongest decision when its strongest expires before the next read', async () => {
    const { state, decisions } = source();
    const block = attack('pk_live_a', { severity: 'critical', riskScore: 0.97, recommendedAction: 'block', lastSeenAt: new Date(T0 - 30 * MINUTE + 10_000).toISOString() });
    const throttle = attack('pk_live_a', { type: 'high_failure_rate', lastSeenAt: new Date(T0).toISOString() });
    state.alerts = [block, throttle];
    await decisions.refresh();
    expect(decisions.current()?.decisions).toEqual([expect.objectContaining({ action: 'block', alertId: block.id })]);
    state.now = T0 + 10_001; // the block expired; no read since
    expect(decisions.current()?.decisions).toEqual([expect.objectContaining({ action: 'throttle', alertId: throttle.id })]);
  });

  it('serves, when one alert\'s block lapses before the next read, the throttle its holders earned since, and records the change', async () => {
    const { state, decisions, history } = source();
    const iso = (ms: number) => new Date(ms).toISOString();
    // Block earned 29 min 50 s ago (TTL 30 min); throttle-level evidence of the holders until a minute ago.
    const blocked = attack('pk_live_a', { severity: 'critical', riskScore: 0.97, recommendedAction: 'block', lastSeenAt: iso(T0), actionSeenAt: iso(T0 - MINUTE), blockSeenAt: iso(T0 - 30 * MINUTE + 10_000) });
    state.alerts = [blocked];
    await decisions.refresh();
    expect(decisions.current()?.decisions).toEqual([expect.objectContaining({ action: 'block', alertId: blocked.id, expiresAt: iso(T0 + 10_000) })]);
    state.now = T0 + 10_001;
    expect(decisions.current()?.decisions).toEqual([expect.objectContaining({ action: 'throttle', alertId: blocked.id, expiresAt: iso(T0 + 29 * MINUTE) })]);
    await decisions.refresh();
    expect(history.map(({ action, endedAt }) => [action, endedAt])).toEqual([['block', null], ['block', T0 + 10_000], ['throttle', null]]);
  });

  it('keeps serving while reads fail, until the answer is stale: then none (the fleet lets traffic through)', async () => {
    const { state, decisions, lines } = source();
    state.alerts = [attack('pk_live_a')];
    await decisions.refresh();
    state.failing = true;
    state.now = T0 + 20_000;
    await decisions.refresh();
    await decisions.refresh();
    expect(decisions.current()?.decisions).toHaveLength(1);
    state.now = T0 + 30_001;
    expect(decisions.current()).toBeUndefined();
    // One warning for the outage, one note for the recovery.
    state.failing = false;
    await decisions.refresh();
    expect(decisions.current()?.generatedAt).toBe(T0 + 30_001);
    expect(lines.filter((line) => line.level >= 40).map((line) => line.msg.slice(0, 40))).toEqual(['reading enforcement decisions failed; th']);
    expect(lines.at(-1)?.msg).toBe('enforcement decisions can be read again');
  });

  it('drops a decision from its answer once it expires, between reads', async () => {
    const { state, decisions } = source();
    state.alerts = [attack('pk_live_a', { lastSeenAt: new Date(T0 - 30 * MINUTE + 10_000).toISOString() }), attack('pk_live_b')];
    await decisions.refresh();
    expect(decisions.current()?.decisions.map((decision) => decision.apiKeyId)).toEqual(['pk_live_a', 'pk_live_b']);
    state.now = T0 + 10_000;
    expect(decisions.current()?.decisions.map((decision) => decision.apiKeyId)).toEqual(['pk_live_b']);
  });

  it('records each decision as it starts, changes or ends, saying in shadow mode that it is not applied', async () => {
    const { state, decisions, lines } = source('shadow');
    const records = () => lines.map((line) => [line.msg, line.apiKeyId, line.action]);
    const first = attack('pk_live_a');
    state.alerts = [first];
    await decisions.refresh();
    await decisions.refresh();
    expect(records()).toEqual([['enforcement (shadow, not applied): would throttle key', 'pk_live_a', 'throttle']]);
    // Escalated to a critical alert of high risk: a block.
    state.alerts = [{ ...first, severity: 'critical', riskScore: 0.97, recommendedAction: 'block' }];
    await decisions.refresh();
    expect(records().at(-1)).toEqual(['enforcement (shadow, not applied): would block key', 'pk_live_a', 'block']);
    expect(lines.at(-1)).toMatchObject({ mode: 'shadow', previous: 'throttle', alertId: first.id });
    expect(lines.at(-1)).not.toHaveProperty('exemptIps');
    // Dismissed (or allowlisted): it ends.
    state.alerts = [];
    await decisions.refresh();
    expect(records().at(-1)).toEqual(['enforcement decision ended', 'pk_live_a', 'block']);
    expect(lines).toHaveLength(3);
  });

  it('follows the allowlists as they are reloaded', async () => {
    const { state, decisions } = source();
    state.alerts = [attack('pk_live_a')];
    await decisions.refresh();
    state.config = DetectionConfig.parse(JSON.stringify({ allowlist: { keys: ['pk_live_a'] } }));
    await decisions.refresh();
    expect(decisions.current()?.decisions).toEqual([]);
  });

  it('writes each decision to the history as it starts and ends; a change of action ends one and starts another', async () => {
    const { state, decisions, history } = source('shadow');
    const first = attack('pk_live_a');
    state.alerts = [first, attack('pk_live_b')];
    await decisions.refresh();
    state.now = T0 + 2_000;
    await decisions.refresh();
    state.now = T0 + 4_000;
    state.alerts = [{ ...first, severity: 'critical', riskScore: 0.97, recommendedAction: 'block' }];
    await decisions.refresh();
    await decisions.stop();
    const brief = history.map(({ apiKeyId, action, mode, startedAt, endedAt, alertId }) => ({ apiKeyId, action, mode, startedAt, endedAt, alertId }));
    expect(brief).toEqual([
      { apiKeyId: 'pk_live_a', action: 'throttle', mode: 'shadow', startedAt: T0, endedAt: null, alertId: first.id },
      { apiKeyId: 'pk_live_b', action: 'throttle', mode: 'shadow', startedAt: T0, endedAt: null, alertId: expect.any(String) },
      { apiKeyId: 'pk_live_a', action: 'throttle', mode: 'shadow', startedAt: T0, endedAt: T0 + 4_000, alertId: first.id },
      { apiKeyId: 'pk_live_a', action: 'block', mode: 'shadow', startedAt: T0 + 4_000, endedAt: null, alertId: first.id },
      { apiKeyId: 'pk_live_b', action: 'throttle', mode: 'shadow', startedAt: T0, endedAt: T0 + 4_000, alertId: expect.any(String) },
    ]);
    expect(history[3]).toMatchObject({ merchantId: 'm_1', reason: expect.stringContaining('critical, risk 0.97'), expiresAt: new Date(Date.parse(first.lastSeenAt) + 30 * MINUTE).toISOString() });
    expect(history[0]).not.toHaveProperty('exemptIps');
  });

  it('records a decision again once new evidence has moved its expiry a step, not on every read', async () => {
    const { state, decisions, history } = source('shadow');
    const alert = attack('pk_live_a', { lastSeenAt: new Date(T0).toISOString() });
    state.alerts = [alert];
    await decisions.refresh();
    const seenAt = (ms: number) => {
      state.now = ms;
      state.alerts = [{ ...alert, lastSeenAt: new Date(ms).toISOString() }];
      return decisions.refresh();
    };
    await seenAt(T0 + EXPIRY_RECORD_STEP_MS - 1_000); // less than a step: the history's expiry stands
    await seenAt(T0 + EXPIRY_RECORD_STEP_MS); // a step past the recorded expiry
    await seenAt(T0 + EXPIRY_RECORD_STEP_MS + 1_000);
    await decisions.stop();
    expect(history.map(({ startedAt, endedAt, expiresAt }) => ({ startedAt, endedAt, expiresAt }))).toEqual([
      { startedAt: T0, endedAt: null, expiresAt: new Date(T0 + 30 * MINUTE).toISOString() },
      { startedAt: T0, endedAt: null, expiresAt: new Date(T0 + EXPIRY_RECORD_STEP_MS + 30 * MINUTE).toISOString() },
    ]);
  });

  it('logs and records a decision kept while its alert escalates (a throttle under the block risk threshold), once', async () => {
    const { state, decisions, history, lines } = source();
    const alert = attack('pk_live_a', { lastSeenAt: new Date(T0).toISOString() });
    state.alerts = [alert];
    await decisions.refresh();
    // Critical, recommending a block, but under ENFORCEMENT_BLOCK_MIN_RISK (0.95): still a throttle.
    state.now = T0 + 2_000;
    state.alerts = [{ ...alert, severity: 'critical', riskScore: 0.9, recommendedAction: 'block', lastSeenAt: new Date(T0 + 1_000).toISOString() }];
    await decisions.refresh();
    state.now = T0 + 4_000;
    await decisions.refresh(); // nothing new
    await decisions.stop();
    expect(decisions.current()?.decisions).toEqual([expect.objectContaining({ action: 'throttle', alertId: alert.id })]);
    expect(history.map(({ action, startedAt, endedAt, reason }) => ({ action, startedAt, endedAt, reason }))).toEqual([
      { action: 'throttle', startedAt: T0, endedAt: null, reason: expect.stringContaining(', high, risk 0.8') },
      { action: 'throttle', startedAt: T0, endedAt: null, reason: expect.stringMatching(/, critical, risk 0\.9: .*under the block risk threshold, so throttled/) },
    ]);
    const kept = lines.filter((line) => line.msg.startsWith('enforcement decision kept'));
    expect(kept).toEqual([expect.objectContaining({ msg: 'enforcement decision kept: its alert is now critical', apiKeyId: 'pk_live_a', action: 'throttle', severity: 'critical', previousSeverity: 'high' })]);
  });

  it('dates an end seen late when it happened: at the decision\'s expiry, or when the last answer went stale', async () => {
    const { state, decisions, history } = source();
    const lapsing = attack('pk_live_a', { lastSeenAt: new Date(T0 - 30 * MINUTE + 5_000).toISOString() });
    const dismissed = attack('pk_live_b', { lastSeenAt: new Date(T0).toISOString() });
    state.alerts = [lapsing, dismissed];
    await decisions.refresh();
    // Storage fails for a minute; meanwhile one decision expires and the other's alert is dismissed.
    state.failing = true;
    state.now = T0 + 2_000;
    await decisions.refresh();
    state.failing = false;
    state.alerts = [];
    state.now = T0 + MINUTE;
    await decisions.refresh();
    await decisions.stop();
    expect(history.filter((record) => record.endedAt !== null).map(({ apiKeyId, endedAt }) => ({ apiKeyId, endedAt }))).toEqual([
      { apiKeyId: 'pk_live_a', endedAt: T0 + 5_000 }, // its expiry
      { apiKeyId: 'pk_live_b', endedAt: T0 + 30_000 }, // nothing was served after the answer went stale
    ]);
  });

  it('keeps serving decisions while the history cannot be written, and writes what it kept once it can', async () => {
    const { state, decisions, history, lines } = source();
    state.historyFailing = true;
    state.alerts = [attack('pk_live_a')];
    await decisions.refresh();
    state.now = T0 + 2_000;
    state.alerts = [];
    await decisions.refresh();
    expect(decisions.current()?.decisions).toEqual([]);
    expect(history).toEqual([]);
    state.historyFailing = false;
    state.now = T0 + 4_000;
    await decisions.refresh();
    await decisions.stop();
    expect(history.map(({ apiKeyId, startedAt, endedAt }) => ({ apiKeyId, startedAt, endedAt }))).toEqual([
      { apiKeyId: 'pk_live_a', startedAt: T0, endedAt: null },
      { apiKeyId: 'pk_live_a', startedAt: T0, endedAt: T0 + 2_000 },
    ]);
    expect(lines.filter((line) => line.level >= 40).map((line) => line.msg)).toEqual(['writing enforcement history failed; its records are kept (up to 10000) and written after the next read']);
    expect(lines.at(-1)?.msg).toBe('enforcement history can be written again');
  });

  describe('on a graceful stop, writes what its history lacks', () => {
    const written = (history: DecisionRecord[]) => history.map(({ apiKeyId, endedAt }) => ({ apiKeyId, endedAt }));
    const startAndEnd = (endedAt: number) => [
      { apiKeyId: 'pk_live_a', endedAt: null },
      { apiKeyId: 'pk_live_a', endedAt },
    ];

    it('the records it kept after failed writes', async () => {
      const { state, decisions, history } = source();
      state.historyFailing = true;
      state.alerts = [attack('pk_live_a', { lastSeenAt: new Date(T0).toISOString() })];
      await decisions.refresh();
      state.now = T0 + 2_000;
      state.alerts = [];
      await decisions.refresh();
      state.historyFailing = false;
      await decisions.stop();
      expect(written(history)).toEqual(startAndEnd(T0 + 2_000));
    });

    it('an end queued while another write was in flight', async () => {
      const { state, decisions, history } = source();
      let release!: () => void;
      state.slowWrite = new Promise<void>((resolve) => (release = resolve));
      state.alerts = [attack('pk_live_a', { lastSeenAt: new Date(T0).toISOString() })];
      await decisions.refresh(); // the start's write hangs
      state.now = T0 + 2_000;
      state.alerts = []; // dismissed: the end waits for the next write
      await decisions.refresh();
      state.slowWrite = undefined;
      release();
      await decisions.stop();
      expect(written(history)).toEqual(startAndEnd(T0 + 2_000));
    });

    it('the end of a decision that lapsed since the last read', async () => {
      const { state, decisions, history } = source();
      state.alerts = [attack('pk_live_a', { lastSeenAt: new Date(T0 - 30 * MINUTE + 1_000).toISOString() })];
      await decisions.refresh();
      state.now = T0 + 1_500; // lapsed at T0 + 1 s, the next read not yet due
      expect(decisions.current()?.decisions).toEqual([]);
      await decisions.stop();
      expect(written(history)).toEqual(startAndEnd(T0 + 1_000));
    });
  });
});
