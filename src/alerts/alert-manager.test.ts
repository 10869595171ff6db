import { describe, expect, it } from 'vitest';
import type { Finding, RecommendedAction, Severity } from '../detect/types.ts';
import { AlertManager, type RuleInfo } from './alert-manager.ts';
import { finding as makeFinding } from './test-findings.ts';

const T0 = Date.UTC(2026, 10, 20, 12, 0, 0);
const rule: RuleInfo = {
  id: 'velocity_attack',
  version: '1.0.0',
  actions: { low: 'monitor', medium: 'rate_limit', high: 'rate_limit', critical: 'block' } as Record<Severity, RecommendedAction>,
};

function finding(severity: Severity, at = T0, scope = 'pk_live_a'): Finding {
  return makeFinding(severity, at, scope);
}

function manager() {
  let now = T0;
  let ids = 0;
  const alerts = new AlertManager({ suppressionMs: 3_600_000, now: () => now, newId: () => `id-${++ids}` });
  return { alerts, advance: (ms: number) => (now += ms) };
}

describe('AlertManager', () => {
  it('creates one open alert, then counts repeats on it', () => {
    const { alerts, advance } = manager();
    const first = alerts.apply('m_1', rule, finding('medium'));
    expect(first.change).toBe('created');
    expect(first.alert).toMatchObject({ id: 'id-1', status: 'open', occurrences: 1, recommendedAction: 'rate_limit' });
    advance(30_000);
    const repeat = alerts.apply('m_1', rule, finding('medium', T0 + 30_000));
    expect(repeat.change).toBe('updated');
    expect(repeat.alert).toMatchObject({ id: 'id-1', occurrences: 2, lastSeenAt: new Date(T0 + 30_000).toISOString() });
  });

  it('escalates severity but never lowers it', () => {
    const { alerts } = manager();
    alerts.apply('m_1', rule, finding('medium'));
    const up = alerts.apply('m_1', rule, finding('critical'));
    expect(up.change).toBe('escalated');
    expect(up.alert).toMatchObject({ severity: 'critical', recommendedAction: 'block' });
    const down = alerts.apply('m_1', rule, finding('low'));
    expect(down.alert).toMatchObject({ severity: 'critical', title: 'critical finding' });
  });

  it('keeps separate alerts per merchant and per scope', () => {
    const { alerts } = manager();
    const a = alerts.apply('m_1', rule, finding('high'));
    const b = alerts.apply('m_2', rule, finding('high'));
    const c = alerts.apply('m_1', rule, finding('high', T0, 'pk_live_b'));
    expect(new Set([a.alert?.id, b.alert?.id, c.alert?.id]).size).toBe(3);
  });

  it('stays quiet after a dismissal for the suppression period, then alerts again', () => {
    const { alerts, advance } = manager();
    const created = alerts.apply('m_1', rule, finding('high')).alert!;
    alerts.remember({ ...created, status: 'dismissed', updatedAt: new Date(T0).toISOString() });
    advance(10 * 60_000);
    expect(alerts.apply('m_1', rule, finding('high')).change).toBe('suppressed');
    advance(60 * 60_000);
    const again = alerts.apply('m_1', rule, finding('high'));
    expect(again.change).toBe('created');
    expect(again.alert?.id).not.toBe(created.id);
  });

  it('reopens a resolved alert whose pattern recurs, recording why', () => {
    const { alerts, advance } = manager();
    const created = alerts.apply('m_1', rule, finding('high')).alert!;
    alerts.remember({ ...created, status: 'resolved' });
    advance(60_000);
    const reopened = alerts.apply('m_1', rule, finding('high'));
    expect(reopened.change).toBe('reopened');
    expect(reopened.alert).toMatchObject({ id: created.id, status: 'open' });
    expect(reopened.alert?.history.at(-1)).toMatchObject({ actor: 'system', from: 'resolved', to: 'open' });
  });
});
