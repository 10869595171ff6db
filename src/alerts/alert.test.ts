import { describe, expect, it } from 'vitest';
import { SEVERITIES } from '../detect/types.ts';
import { changeStatus, conflictingMove, higherSeverity, isAllowedTransition, isRepeatedChange, mergeCopies, mergeDetection, mergeLifecycle, riskScore, sprayKeptOver, toWireAlert, withDuplicateFindings, withoutEntry, type Alert } from './alert.ts';

describe('riskScore', () => {
  it.each([
    ['low', 0, 0.1],
    ['low', 1, 0.399],
    ['medium', 0, 0.4],
    ['medium', 1, 0.699],
    ['high', 0.5, 0.8],
    ['critical', 0, 0.9],
    ['critical', 1, 1],
  ] as const)('%s at confidence %d is %d', (severity, confidence, expected) => {
    expect(riskScore(severity, confidence)).toBeCloseTo(expected, 3);
  });

  it('keeps every score inside its band, whatever the confidence', () => {
    const bands = { low: [0, 0.4], medium: [0.4, 0.7], high: [0.7, 0.9], critical: [0.9, 1] } as const;
    for (const severity of SEVERITIES) {
      for (const confidence of [-1, 0, 0.3, 0.99, 1, 7, Number.NaN]) {
        const score = riskScore(severity, confidence);
        expect(score).toBeGreaterThanOrEqual(bands[severity][0]);
        expect(score).toBeLessThanOrEqual(bands[severity][1]);
        if (severity !== 'critical') expect(score).toBeLessThan(bands[severity][1]);
      }
    }
  });
});

describe('lifecycle', () => {
  it.each([
    ['open', 'acknowledged', true],
    ['open', 'dismissed', true],
    ['acknowledged', 'resolved', true],
    ['acknowledged', 'dismissed', true],
    ['open', 'resolved', false],
    ['resolved', 'open', false],
    ['dismissed', 'open', false],
    ['acknowledged', 'open', false],
    ['open', 'open', false],
  ] as const)('%s -> %s allowed: %s', (from, to, allowed) => {
    expect(isAllowedTransition(from, to)).toBe(allowed);
  });

  it('never lowers severity', () => {
    expect(higherSeverity('high', 'medium')).toBe('high');
    expect(higherSeverity('medium', 'critical')).toBe('critical');
  });
});

/** An open high alert, as detection stored it. */
const base: Alert = {
  id: '6f1c1a8e-3a52-4a3e-9a4e-1d2f3b4c5d6e',
  merchantId: 'm_1',
  apiKeyId: 'pk_live_1',
  type: 'velocity_attack',
  scope: 'pk_live_1',
  severity: 'high',
  riskScore: 0.8,
  recommendedAction: 'rate_limit',
  status: 'open',
  title: 't',
  summary: 's',
  evidence: {},
  ruleId: 'velocity_attack',
  ruleVersion: '1.0.0',
  firstSeenAt: '2026-11-20T12:00:00.000Z',
  lastSeenAt: '2026-11-20T12:05:00.000Z',
  occurrences: 3,
  createdAt: '2026-11-20T12:05:00.000Z',
  updatedAt: '2026-11-20T12:06:00.000Z',
  history: [{ at: '2026-11-20T12:05:00.000Z', actor: 'system', from: null, to: 'open', note: 'created by detection' }],
};

describe('changeStatus', () => {
  const later = Date.parse('2026-11-20T13:00:00.000Z');

  it('records who moved the alert, when, from where to where, and why', () => {
    const outcome = changeStatus(base, 'acknowledged', 'alice', 'checking', later);
    expect(outcome).toEqual({
      ok: true,
      alert: {
        ...base,
        status: 'acknowledged',
        updatedAt: '2026-11-20T13:00:00.000Z',
        history: [...base.history, { at: '2026-11-20T13:00:00.000Z', actor: 'alice', from: 'open', to: 'acknowledged', note: 'checking' }],
      },
    });
    expect(base.status).toBe('open'); // the input is not changed
  });

  it('records a change without a note with note null: every entry has all five fields', () => {
    const outcome = changeStatus(base, 'acknowledged', 'alice', undefined, later);
    expect(outcome.ok && outcome.alert.history.at(-1)).toStrictEqual({ at: '2026-11-20T13:00:00.000Z', actor: 'alice', from: 'open', to: 'acknowledged', note: null });
  });

  it('refuses moves the lifecycle does not allow, and a dismissal without a note', () => {
    expect(changeStatus(base, 'resolved', 'alice', undefined, later)).toEqual({ ok: false, reason: 'not_allowed' });
    expect(changeStatus(base, 'open', 'alice', undefined, later)).toEqual({ ok: false, reason: 'not_allowed' });
    expect(changeStatus(base, 'dismissed', 'alice', undefined, later)).toEqual({ ok: false, reason: 'note_required' });
    expect(changeStatus(base, 'dismissed', 'alice', 'our load test', later).ok).toBe(true);
  });

  it('never moves updatedAt backwards when the clock is behind the last change', () => {
    const outcome = changeStatus(base, 'acknowledged', 'alice', undefined, Date.parse('2026-11-20T12:00:00.000Z'));
    expect(outcome.ok && outcome.alert.updatedAt).toBe('2026-11-20T12:06:00.001Z');
  });

  it('stamps a change after the entries it was made on, even by a clock behind the replica that made them', () => {
    // Acknowledged through a replica whose clock is 5 s ahead; resolved 0.5 s later through one on time.
    const acknowledged = changeStatus(base, 'acknowledged', 'alice', undefined, later + 5_000);
    if (!acknowledged.ok) throw new Error('refused');
    const resolved = changeStatus(acknowledged.alert, 'resolved', 'bob', undefined, later + 500);
    if (!resolved.ok) throw new Error('refused');
    expect(resolved.alert.history.slice(1).map((entry) => [entry.at, entry.to])).toEqual([
      ['2026-11-20T13:00:05.000Z', 'acknowledged'],
      ['2026-11-20T13:00:05.001Z', 'resolved'],
    ]);
    expect(resolved.alert.updatedAt).toBe('2026-11-20T13:00:05.001Z');
    // Merged with a copy that has the acknowledgement only, the resolution still comes last.
    expect(mergeLifecycle(acknowledged.alert, resolved.alert).status).toBe('resolved');
    expect(mergeLifecycle({ ...base, occurrences: 9 }, resolved.alert).status).toBe('resolved');
  });

  it('takes a retry of the latest move by the same actor as a repeat, and nothing else', () => {
    const dismissed = changeStatus(base, 'dismissed', 'alice', 'our load test', later);
    if (!dismissed.ok) throw new Error('refused');
    expect(isRepeatedChange(dismissed.alert, 'dismissed', 'alice', 'our load test')).toBe(true);
    // Another note is another move, not a retry: answered as a repeat, the note would be lost.
    expect(isRepeatedChange(dismissed.alert, 'dismissed', 'alice', 'a partner\'s load test')).toBe(false);
    expect(isRepeatedChange(dismissed.alert, 'dismissed', 'bob', 'our load test')).toBe(false);
    expect(isRepeatedChange(dismissed.alert, 'acknowledged', 'alice', 'our load test')).toBe(false);
    expect(isRepeatedChange(base, 'open', 'system', 'created by detection')).toBe(false); // creation is no admin's move
    const acknowledged = changeStatus(base, 'acknowledged', 'alice', undefined, later);
    if (!acknowledged.ok) throw new Error('refused');
    expect(isRepeatedChange(acknowledged.alert, 'acknowledged', 'alice', null)).toBe(true);
    expect(isRepeatedChange(acknowledged.alert, 'acknowledged', 'alice', 'looking')).toBe(false);
    const resolved = changeStatus(acknowledged.alert, 'resolved', 'bob', undefined, later + 1);
    if (!resolved.ok) throw new Error('refused');
    expect(isRepeatedChange(resolved.alert, 'acknowledged', 'alice', null)).toBe(false); // moved on since
  });

  it('finds a conflicting move: one from the same status, unknown to our copy', () => {
    const ours = changeStatus(base, 'dismissed', 'alice', 'fp', later);
    const theirs = changeStatus(base, 'acknowledged', 'bob', undefined, later + 1);
    if (!ours.ok || !theirs.ok) throw new Error('refused');
    const ourEntry = ours.alert.history.at(-1)!;
    expect(conflictingMove(theirs.alert, ours.alert, ourEntry)).toEqual(theirs.alert.history.at(-1));
    expect(conflictingMove(ours.alert, ours.alert, ourEntry)).toBeUndefined();
    // A later move made on top of ours is no conflict.
    const resolvedOnTop = changeStatus(theirs.alert, 'resolved', 'carol', undefined, later + 2);
    if (!resolvedOnTop.ok) throw new Error('refused');
    expect(conflictingMove(resolvedOnTop.alert, theirs.alert, theirs.alert.history.at(-1)!)).toBeUndefined();
  });

  describe('mergeLifecycle (two replicas\' copies of one alert)', () => {
    const dismissedElsewhere = changeStatus(base, 'dismissed', 'alice', 'our load test', later);
    if (!dismissedElsewhere.ok) throw new Error('dismissal refused');
    // The owner's copy: counted two more repeats after the dismissal, without knowing of it.
    const ownersRepeat: Alert = { ...base, occurrences: 5, lastSeenAt: '2026-11-20T13:01:00.000Z', updatedAt: '2026-11-20T13:01:00.000Z' };

    it('keeps our detection fields and takes the status change made elsewhere', () => {
      const merged = mergeLifecycle(ownersRepeat, dismissedElsewhere.alert);
      expect(merged).toEqual({ ...ownersRepeat, status: 'dismissed', history: dismissedElsewhere.alert.history });
    });

    it('returns our copy itself when theirs adds nothing, and ignores a different alert', () => {
      expect(mergeLifecycle(dismissedElsewhere.alert, ownersRepeat)).toBe(dismissedElsewhere.alert);
      expect(mergeLifecycle(ownersRepeat, { ...dismissedElsewhere.alert, id: 'another' })).toBe(ownersRepeat);
    });

    it('lets the latest entry decide: a recurrence after a resolution elsewhere reopens', () => {
      const acknowledged = changeStatus(base, 'acknowledged', 'alice', undefined, later);
      if (!acknowledged.ok) throw new Error('refused');
      const resolved = changeStatus(acknowledged.alert, 'resolved', 'alice', undefined, later + 60_000);
      if (!resolved.ok) throw new Error('refused');
      const reopenedHere: Alert = {
        ...acknowledged.alert,
        status: 'open',
        updatedAt: '2026-11-20T13:05:00.000Z',
        history: [...acknowledged.alert.history, { at: '2026-11-20T13:05:00.000Z', actor: 'system', from: 'resolved', to: 'open', note: 'the pattern recurred' }],
      };
      const merged = mergeLifecycle(reopenedHere, resolved.alert);
      expect(merged.history.map((entry) => entry.to)).toEqual(['open', 'acknowledged', 'resolved', 'open']);
      expect(merged.status).toBe('open');
      expect(mergeLifecycle(resolved.alert, reopenedHere).status).toBe('open');
    });

    it('orders entries stamped at the same millisecond alike on every replica', () => {
      const acknowledged = changeStatus(base, 'acknowledged', 'alice', undefined, later);
      const dismissed = changeStatus(base, 'dismissed', 'bob', 'fp', later);
      if (!acknowledged.ok || !dismissed.ok) throw new Error('refused');
      const one = mergeLifecycle(acknowledged.alert, dismissed.alert);
      const other = mergeLifecycle(dismissed.alert, acknowledged.alert);
      expect(one.history).toEqual(other.history);
      expect(one.status).toBe(other.status);
    });
  });
});

describe('mergeDetection (two replicas\' copies of one alert, their detection fields)', () => {
  const high: Alert = { ...base, title: 'high title', summary: 'high summary', evidence: { observed: 300 } };
  // The owner escalated its copy; another replica's copy (an admin's change) was made from an older one.
  const escalated: Alert = {
    ...high,
    severity: 'critical',
    riskScore: 0.95,
    recommendedAction: 'block',
    title: 'critical title',
    summary: 'critical summary',
    evidence: { observed: 900 },
    aiInsights: ['900 requests a minute'],
    lastSeenAt: '2026-11-20T12:07:00.000Z',
    occurrences: 5,
    updatedAt: '2026-11-20T12:07:00.000Z',
  };
  const acknowledged = changeStatus({ ...high, occurrences: 2, firstSeenAt: '2026-11-20T11:59:00.000Z' }, 'acknowledged', 'alice', undefined, Date.parse('2026-11-20T12:08:00.000Z'));
  if (!acknowledged.ok) throw new Error('refused');
  const stale = acknowledged.alert;

  it('never lowers the severity: the higher one with what describes it, the highest counters, the earliest start', () => {
    const merged = mergeCopies(stale, escalated);
    const { severity, riskScore, recommendedAction, title, summary, evidence, aiInsights, lastSeenAt, occurrences } = escalated;
    const described = { severity, riskScore, recommendedAction, title, summary, evidence, aiInsights, lastSeenAt, occurrences };
    expect(merged).toEqual({ ...stale, ...described, firstSeenAt: '2026-11-20T11:59:00.000Z' });
    // Either way round.
    expect({ ...mergeCopies(escalated, stale), updatedAt: merged.updatedAt }).toEqual(merged);
  });

  it('keeps the stronger recommended action: a copy raised by requests answered 401 does not take away what the key\'s holders earned', () => {
    const throttled: Alert = { ...high, recommendedAction: 'rate_limit' };
    const byStrangers: Alert = { ...escalated, recommendedAction: 'investigate' };
    expect(mergeDetection(throttled, byStrangers)).toMatchObject({ severity: 'critical', title: 'critical title', recommendedAction: 'rate_limit' });
    expect(mergeDetection(byStrangers, throttled)).toMatchObject({ severity: 'critical', recommendedAction: 'rate_limit' });
  });

  it('keeps the later time the key\'s holders earned the action (actionSeenAt), whichever copy describes the alert', () => {
    const earnedEarly: Alert = { ...high, recommendedAction: 'rate_limit', actionSeenAt: '2026-11-20T12:01:00.000Z' };
    const earnedLater: Alert = { ...high, recommendedAction: 'rate_limit', actionSeenAt: '2026-11-20T12:04:00.000Z' };
    const byStrangers: Alert = { ...escalated, recommendedAction: 'investigate' };
    expect(mergeDetection(earnedEarly, earnedLater).actionSeenAt).toBe('2026-11-20T12:04:00.000Z');
    expect(mergeDetection(earnedLater, earnedEarly).actionSeenAt).toBe('2026-11-20T12:04:00.000Z');
    // The stranger-raised copy describes the alert; the holders' time stays, in either order.
    expect(mergeDetection(earnedEarly, byStrangers)).toMatchObject({ severity: 'critical', actionSeenAt: '2026-11-20T12:01:00.000Z' });
    expect(mergeDetection(byStrangers, earnedEarly)).toMatchObject({ severity: 'critical', actionSeenAt: '2026-11-20T12:01:00.000Z' });
    expect('actionSeenAt' in mergeDetection({ ...high, occurrences: 9 }, byStrangers)).toBe(false);
  });

  it('keeps the later time the key\'s holders earned a block (blockSeenAt), and none when neither copy has one', () => {
    const blocked: Alert = { ...escalated, recommendedAction: 'block', actionSeenAt: '2026-11-20T12:04:00.000Z', blockSeenAt: '2026-11-20T12:01:00.000Z' };
    const blockedLater: Alert = { ...blocked, blockSeenAt: '2026-11-20T12:03:00.000Z' };
    expect(mergeDetection(blocked, blockedLater).blockSeenAt).toBe('2026-11-20T12:03:00.000Z');
    expect(mergeDetection(blockedLater, blocked).blockSeenAt).toBe('2026-11-20T12:03:00.000Z');
    const throttled: Alert = { ...high, recommendedAction: 'rate_limit', actionSeenAt: '2026-11-20T12:05:00.000Z', occurrences: 9 };
    expect(mergeDetection(throttled, blocked)).toMatchObject({ recommendedAction: 'block', actionSeenAt: '2026-11-20T12:05:00.000Z', blockSeenAt: '2026-11-20T12:01:00.000Z' });
    expect('blockSeenAt' in mergeDetection(throttled, { ...throttled, occurrences: 10 })).toBe(false);
    expect('blockSeenAt' in toWireAlert(blocked)).toBe(false);
    // During a rolling deploy: a copy of a replica still on the code before blockSeenAt gives when its block was earned (its actionSeenAt).
    const { blockSeenAt: _none, ...oldReplica } = { ...blocked, actionSeenAt: '2026-11-20T12:06:00.000Z' };
    expect(mergeDetection(blocked, oldReplica).blockSeenAt).toBe('2026-11-20T12:06:00.000Z');
    expect(mergeDetection(oldReplica, blocked).blockSeenAt).toBe('2026-11-20T12:06:00.000Z');
    // Two copies of the code before it stay without one.
    expect('blockSeenAt' in mergeDetection(oldReplica, { ...oldReplica, occurrences: 20 })).toBe(false);
  });

  it('gives the alert kept for a pattern the later time its duplicate\'s holders earned the action, within the kept alert\'s span', () => {
    // Strangers opened the alert kept (investigate); the key's holders opened the duplicate (rate_limit).
    const byStrangers: Alert = { ...high, id: 'kept', recommendedAction: 'investigate', lastSeenAt: '2026-11-20T12:10:00.000Z' };
    const earned: Alert = { ...high, id: 'dup', recommendedAction: 'rate_limit', lastSeenAt: '2026-11-20T12:06:00.000Z', actionSeenAt: '2026-11-20T12:06:00.000Z' };
    const now = Date.parse('2026-11-20T12:11:00.000Z');
    expect(withDuplicateFindings(byStrangers, earned, now)).toMatchObject({ recommendedAction: 'rate_limit', actionSeenAt: '2026-11-20T12:06:00.000Z', lastSeenAt: '2026-11-20T12:10:00.000Z' });
    // Never past the kept alert's lastSeenAt, which enforcement reads alerts by.
    const earnedLater: Alert = { ...earned, lastSeenAt: '2026-11-20T12:12:00.000Z', actionSeenAt: '2026-11-20T12:12:00.000Z' };
    expect(withDuplicateFindings(byStrangers, earnedLater, now).actionSeenAt).toBe('2026-11-20T12:10:00.000Z');
    // The same for the time a block was earned.
    const blocked: Alert = { ...earnedLater, severity: 'critical', riskScore: 0.97, recommendedAction: 'block', blockSeenAt: '2026-11-20T12:11:00.000Z' };
    expect(withDuplicateFindings(byStrangers, blocked, now)).toMatchObject({ recommendedAction: 'block', blockSeenAt: '2026-11-20T12:10:00.000Z' });
    expect(withDuplicateFindings(byStrangers, { ...blocked, blockSeenAt: '2026-11-20T12:02:00.000Z' }, now).blockSeenAt).toBe('2026-11-20T12:02:00.000Z');
  });

  it('keeps the risk score in the band of the severity kept', () => {
    // A high copy's score at the top of its band never carries over to a critical one, nor the reverse.
    const strongHigh: Alert = { ...high, riskScore: 0.899, occurrences: 9 };
    const weakCritical: Alert = { ...escalated, riskScore: 0.9 };
    expect(mergeDetection(strongHigh, weakCritical)).toMatchObject({ severity: 'critical', riskScore: 0.9, occurrences: 9 });
    expect(mergeDetection(weakCritical, strongHigh)).toMatchObject({ severity: 'critical', riskScore: 0.9, occurrences: 9 });
    // Of one severity, the higher score; a difference below the stored precision (Float32, 3 decimals) is none.
    expect(mergeDetection(high, { ...high, riskScore: 0.85 }).riskScore).toBe(0.85);
    expect(mergeDetection(high, { ...high, riskScore: 0.8000001 })).toBe(high);
  });

  it('gives the alert kept for a pattern what its duplicate saw: the higher severity, both spans, the findings of both', () => {
    // The duplicate, escalated to critical by the key's previous owner; the alert kept, opened high by its new owner.
    const duplicate: Alert = { ...escalated, id: 'dup', firstSeenAt: '2026-11-20T11:58:00.000Z', lastSeenAt: '2026-11-20T12:03:00.000Z', occurrences: 4 };
    const kept: Alert = { ...high, id: 'kept', firstSeenAt: '2026-11-20T12:02:00.000Z', lastSeenAt: '2026-11-20T12:04:00.000Z', occurrences: 2 };
    const now = Date.parse('2026-11-20T12:10:00.000Z');
    const carried = withDuplicateFindings(kept, duplicate, now);
    const { severity, riskScore, recommendedAction, title, summary, evidence, aiInsights } = duplicate;
    expect(carried).toEqual({ ...kept, severity, riskScore, recommendedAction, title, summary, evidence, aiInsights, firstSeenAt: duplicate.firstSeenAt, occurrences: 6, updatedAt: new Date(now).toISOString() });
    // A lower duplicate gives its first sighting and findings only; a later last sighting is not
    // taken (beside an admin's resolution made meanwhile, it would pass for a recurrence).
    const lower = withDuplicateFindings({ ...duplicate, firstSeenAt: kept.firstSeenAt }, kept, now);
    expect(lower).toMatchObject({ id: 'dup', severity: 'critical', title: 'critical title', firstSeenAt: kept.firstSeenAt, lastSeenAt: duplicate.lastSeenAt, occurrences: 6 });
    // An alert kept that was closed, or reopened since (a later episode), takes nothing.
    for (const closed of ['resolved', 'dismissed'] as const) expect(withDuplicateFindings({ ...kept, status: closed }, duplicate, now)).toEqual({ ...kept, status: closed });
    const reopened: Alert = { ...kept, history: [...kept.history, { at: '2026-11-20T12:05:00.000Z', actor: 'alice', from: 'open', to: 'resolved', note: null }, { at: '2026-11-20T12:06:00.000Z', actor: 'system', from: 'resolved', to: 'open', note: 'the pattern recurred' }] };
    expect(withDuplicateFindings(reopened, duplicate, now)).toBe(reopened);
  });

  it('of one severity, takes the description of the copy seen later', () => {
    const later: Alert = { ...high, title: 'later', evidence: { observed: 400 }, lastSeenAt: '2026-11-20T12:06:00.000Z' };
    expect(mergeDetection(high, later)).toMatchObject({ title: 'later', evidence: { observed: 400 }, lastSeenAt: later.lastSeenAt });
    expect(mergeDetection(later, high)).toBe(later);
  });

  it('returns our copy itself when theirs adds nothing, and ignores a different alert', () => {
    expect(mergeDetection(escalated, high)).toBe(escalated);
    expect(mergeDetection(stale, { ...escalated, id: 'another' })).toBe(stale);
    expect(mergeCopies(mergeCopies(stale, escalated), escalated)).toEqual(mergeCopies(stale, escalated));
  });

  it('does not bring an episode back after a reopen: the later episode\'s copy wins whole', () => {
    const ack = changeStatus(escalated, 'acknowledged', 'alice', undefined, Date.parse('2026-11-20T12:10:00.000Z'));
    if (!ack.ok) throw new Error('refused');
    const resolved = changeStatus(ack.alert, 'resolved', 'alice', undefined, Date.parse('2026-11-20T12:11:00.000Z'));
    if (!resolved.ok) throw new Error('refused');
    // Reopened by a weaker recurrence, described by it alone.
    const reopened: Alert = {
      ...resolved.alert,
      status: 'open',
      severity: 'medium',
      riskScore: 0.5,
      recommendedAction: 'rate_limit',
      title: 'medium title',
      summary: 'medium summary',
      evidence: { observed: 120 },
      firstSeenAt: '2026-11-20T12:11:30.000Z',
      lastSeenAt: '2026-11-20T12:12:00.000Z',
      occurrences: 1,
      updatedAt: '2026-11-20T12:12:00.000Z',
      history: [...resolved.alert.history, { at: '2026-11-20T12:12:00.000Z', actor: 'system', from: 'resolved', to: 'open', note: 'the pattern recurred' }],
    };
    delete reopened.aiInsights;
    const description = (alert: Alert) => ({
      severity: alert.severity,
      riskScore: alert.riskScore,
      recommendedAction: alert.recommendedAction,
      title: alert.title,
      evidence: alert.evidence,
      firstSeenAt: alert.firstSeenAt,
      lastSeenAt: alert.lastSeenAt,
      occurrences: alert.occurrences,
      insights: 'aiInsights' in alert,
    });
    // A copy from before the reopen, with its critical evidence, adds nothing to the reopened alert...
    expect(mergeDetection(reopened, resolved.alert)).toBe(reopened);
    expect(description(mergeCopies(reopened, escalated))).toEqual(description(reopened));
    // ...and a copy from before it takes the reopened one's description whole.
    const merged = mergeCopies(escalated, reopened);
    expect(description(merged)).toEqual(description(reopened));
    expect(merged.status).toBe('open');
  });

  it('keeps the whole of a credential-stuffing spray over a replica\'s share of it seen later, with the later sighting', () => {
    const spray = (keys: number, at: string, judgedFrom = keys > 6 ? 'all_partitions' : 'own_partitions') => ({
      judgedBy: 'network_across_keys',
      judgedFrom,
      merchantKeys: Array.from({ length: keys }, (_, k) => `pk_live_${k}`),
      merchantKeyCount: keys,
      lastFailureAt: at,
      windowMs: 600_000,
      sampleEventIds: [],
    });
    const whole: Alert = { ...high, title: '12 of them yours', evidence: spray(12, '2026-11-20T12:00:00.000Z'), lastSeenAt: '2026-11-20T12:00:00.000Z', updatedAt: '2026-11-20T12:00:01.000Z' };
    // Another replica applied its share of 6 (one of them a key the whole does not name) before it read the whole.
    const share: Alert = { ...high, title: '6 of them yours', evidence: { ...spray(6, '2026-11-20T12:00:05.000Z'), merchantKeys: ['pk_live_new'] }, lastSeenAt: '2026-11-20T12:00:05.000Z', updatedAt: '2026-11-20T12:00:06.000Z' };
    for (const merged of [mergeDetection(share, whole), mergeDetection(whole, share)]) {
      expect(merged).toMatchObject({ title: '12 of them yours', evidence: whole.evidence, lastSeenAt: '2026-11-20T12:00:05.000Z' });
    }
    // Two readings of one time and count: one of them, the same whichever copy is ours.
    const other: Alert = { ...whole, title: 'the same, otherwise described', evidence: { ...whole.evidence, ips: ['203.0.113.9'] } };
    expect(mergeDetection(whole, other).title).toBe(mergeDetection(other, whole).title);
    // Any other alert is described by the copy seen later.
    expect(mergeDetection({ ...whole, evidence: { observed: 12 } }, { ...share, evidence: { observed: 6 } })).toMatchObject({ title: '6 of them yours' });
  });

  it('orders credential-stuffing descriptions: never both ways, and never in a cycle, so copies end alike in any order', () => {
    const description = (judgedFrom: string, minutes: number, keys: number): Record<string, unknown> => ({
      judgedBy: 'network_across_keys',
      judgedFrom,
      lastFailureAt: new Date(Date.parse('2026-11-20T12:00:00.000Z') + minutes * 60_000).toISOString(),
      windowMs: 600_000,
      merchantKeyCount: keys,
      merchantKeys: [`k${keys}`],
      sampleEventIds: [],
    });
    // Readings and shares of 1-3 keys with newest 401s over 25 minutes: every pair and triple.
    const descriptions = ['own_partitions', 'all_partitions'].flatMap((judgedFrom) => [0, 5, 9, 10, 11, 15, 20, 25].flatMap((minutes) => [1, 2, 3].map((keys) => description(judgedFrom, minutes, keys))));
    const kept = sprayKeptOver;
    for (const a of descriptions) {
      for (const b of descriptions) {
        if (a !== b) expect(kept(a, b)).not.toBe(kept(b, a));
        for (const c of descriptions) if (kept(a, b) && kept(b, c)) expect(kept(a, c)).toBe(true);
      }
    }
    // The reading of every partition is kept over a share less than a window (10 minutes) later, not over one more than a window later.
    expect(kept(description('all_partitions', 0, 1), description('own_partitions', 9, 3))).toBe(true);
    expect(kept(description('own_partitions', 11, 1), description('all_partitions', 0, 3))).toBe(true);
    // Not such descriptions: the caller's own rule.
    expect(kept({ observed: 1 }, descriptions[0]!)).toBeUndefined();
    expect(kept({ ...descriptions[0]!, judgedFrom: 'elsewhere' }, descriptions[1]!)).toBeUndefined();
  });

  it('forgets an entry (a change that lost): the status is then the latest remaining entry\'s', () => {
    const entry = stale.history.at(-1)!;
    expect(withoutEntry(stale, entry)).toMatchObject({ status: 'open', history: high.history });
    expect(withoutEntry(high, entry)).toBe(high);
  });
});
