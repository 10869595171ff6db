/**
 * Turns the engine's findings into stored alerts. Contract: findings are applied in the order they
 * arrive; new, escalated and reopened alerts are written to ClickHouse within about a tenth of a
 * second, a repeat's counters (occurrences, lastSeenAt) within 5 seconds, and a failed
 * write is retried (the latest state of each alert wins) until it succeeds or the service stops.
 * An admin's change is different: it is answered once stored, and a failed write is not retried but
 * reported (the admin sees it fail, and the change is not made behind their back).
 *
 * Several replicas share the alerts: an admin's change may be made on any of them, while the alert
 * is updated by the replica that owns its key (and, around a rebalance, by its previous owner too).
 * So every write first merges the stored copy (AlertManager.merge: its lifecycle, so a status set
 * elsewhere is never written back over, and its detection fields, so a severity, a count or a
 * lastSeenAt is never lowered by a copy that did not know them), and every few seconds each replica
 * learns what the others wrote (a dismissal silences the key everywhere; a stored copy weaker than
 * what the replica knows is written again), and again before it judges a partition a rebalance
 * brought it (an alert created before the rebalance is continued, not duplicated, by the key's new
 * owner).
 *
 * Replicas' clocks differ by seconds, so no order is taken from them. Invariant: every write (a
 * detection update, an admin's change, the re-write of a change written over) is made from the
 * stored copy read just before it, and replaces that copy: its version is above the copy's
 * (AlertStore.save), and a change's history entry is stamped after the copy's entries (stampAfter).
 * What a clock says only orders writes made at the same time from the same copy; of two admin's
 * changes made from the same copy, the first stored stands (a compare-and-set: AlertStore.save with
 * `decidedOn`), and the other is refused.
 */
import { ENGINE_ERROR, type AnyRule, type EngineFinding } from '../detect/engine.ts';
import { FailureLog } from '../failure-log.ts';
import type { Detection } from '../ingest/analysis-thread.ts';
import { HeldUntilOpen } from '../held-until-open.ts';
import type { Logger } from '../logger.ts';
import type { WorkerMetrics } from '../metrics.ts';
import type { AlertStore, StoredAlert } from '../store/alert-store.ts';
import { changeStatus, conflictingMove, duplicateResolution, isRepeatedChange, latestEntry, mergeCopies, mergeLifecycle, withDuplicateFindings, withoutEntry, type Alert, type AlertStatus, type HistoryEntry, type StatusChange } from './alert.ts';
import { laterCreatedFirst, type AlertChange, type AlertManager, type Duplicate, type RuleInfo } from './alert-manager.ts';

export interface AlertServiceHooks {
  /**
   * A critical alert is news: it was created critical, escalated to critical, or reopened while
   * critical (on-call wants to hear that the attack is back). Called once the alert so changed is
   * stored (a webhook never names an alert that a crash kept from storage), with the stored copy;
   * not when that copy is no longer critical and open or acknowledged (dismissed meanwhile through
   * another replica), nor when the copy read before the write was critical and open or acknowledged
   * already, stored so by another replica (which told). It must not block, and what it throws is
   * logged, never passed on to detection.
   */
  onCritical?(alert: Alert, change: CriticalChange): void;
}

type CriticalChange = Extract<AlertChange, 'created' | 'escalated' | 'reopened'>;

export interface AlertServiceOptions extends AlertServiceHooks {
  /** This replica's clock (tests give replicas clocks apart), also of the once-a-minute failure lines; timers run on real time. */
  now?: () => number;
}

/** New, escalated and reopened alerts are written at once; a repeat only bumps counters, so it waits. */
const FLUSH_DELAY_MS = 50;
const REPEAT_FLUSH_DELAY_MS = 5_000;
const RETRY_DELAY_MS = 1_000;
/** How often a replica reads the alerts the others wrote, and how far back (clock skew, slow inserts). */
const SYNC_INTERVAL_MS = 5_000;
const SYNC_OVERLAP_MS = 60_000;
/**
 * An admin's change is read back after this long; if a racing write dropped it, it is written again
 * and read back again (the owner may race again before it syncs), up to this many times.
 */
const VERIFY_DELAY_MS = 2_000;
const MAX_VERIFICATIONS = 5;
/**
 * Most findings held while the open alerts are not loaded yet (see handle). An attack that goes on
 * is found again in its next batches, so the ones beyond are dropped, not queued without bound.
 */
export const MAX_HELD_FINDINGS = 10_000;

export class AlertService {
  private readonly rules: Map<string, RuleInfo>;
  private readonly unsaved = new Map<string, Alert>();
  /** Critical news (hooks.onCritical) by alert id, waiting for the alert's next write. */
  private readonly newsUnsaved = new Map<string, CriticalChange>();
  /** Alerts whose critical copy a failed write may have stored all the same (its answer lost), untold. */
  private readonly newsMaybeStoredUntold = new Set<string>();
  private timer: NodeJS.Timeout | undefined;
  private timerDueAt = Number.POSITIVE_INFINITY;
  /** The writes of this replica, one after the other (see serially); never rejects. */
  private saving: Promise<void> = Promise.resolve();
  private syncTimer: NodeJS.Timeout | undefined;
  private syncedUpTo = 0;
  private readonly verifyTimers = new Set<NodeJS.Timeout>();
  /** Our alerts found to be duplicates, by id, until resolved (resolveDuplicates), and those being resolved. */
  private readonly duplicates = new Map<string, Duplicate>();
  private readonly resolving = new Set<string>();
  /** Reads started by timers (syncs, read-backs) still running: stop waits for them before storage closes. */
  private readonly reading = new Set<Promise<void>>();
  private stopped = false;
  /** Findings handed over before start() loaded the open alerts wait for it. */
  private readonly findings = new HeldUntilOpen<EngineFinding>(MAX_HELD_FINDINGS, (findings) => this.apply(findings));
  private readonly now: () => number;
  /** The background writes' and reads' failures, each logged when it starts, once a minute while it lasts, and when it ends. */
  private readonly storing: FailureLog;
  private readonly syncing: FailureLog;

  constructor(
    private readonly manager: AlertManager,
    private readonly store: AlertStore,
    rules: readonly AnyRule[],
    private readonly metrics: WorkerMetrics,
    private readonly logger: Logger,
    private readonly hooks: AlertServiceOptions = {},
  ) {
    this.rules = new Map(rules.map((rule) => [rule.id, { id: rule.id, version: rule.version, actions: rule.actions }]));
    this.now = hooks.now ?? Date.now;
    this.storing = new FailureLog(logger, 'storing alerts failed; retrying', 'alerts are stored again', { now: this.now });
    this.syncing = new FailureLog(logger, 'reading alerts written by other replicas failed; trying again', 'alerts written by other replicas are read again', { level: 'warn', now: this.now });
    // At 0 from the start: increase() cannot count a series' first sample, so the first failed batch would alert no one.
    for (const rule of [...this.rules.keys(), ENGINE_ERROR]) metrics.ruleErrors.inc({ rule }, 0);
  }

  /**
   * Loads what deduplication must know (open alerts, recent dismissals and resolutions:
   * AlertManager.closedAlertMemoryMs), then syncs with the other replicas every SYNC_INTERVAL_MS and
   * applies the findings held meanwhile. Rejects, starting nothing, when stop() was called before the
   * load ended: the owner's stop may have given up waiting for the start, and a timer or write started
   * after stop() would outlive it (and storage, which closes next).
   */
  async start(): Promise<void> {
    this.throwIfStopped();
    const startedAt = this.now();
    const loaded = await this.store.loadForDedup(new Date(startedAt - this.manager.closedAlertMemoryMs));
    this.throwIfStopped();
    this.manager.load(loaded);
    this.syncedUpTo = startedAt;
    this.syncTimer = setInterval(() => {
      const sync = this.syncWithStore().then(
        () => this.syncing.succeeded(),
        (error: unknown) => this.syncing.failed({ err: error }),
      );
      this.inBackground(sync);
    }, SYNC_INTERVAL_MS);
    this.syncTimer.unref();
    const { released, dropped } = this.findings.open();
    if (dropped > 0) this.logger.warn({ held: released, dropped }, 'more findings arrived before the open alerts were loaded than are held; the rest were dropped');
  }

  private throwIfStopped(): void {
    if (this.stopped) throw new Error('alerts stopped while starting');
  }

  /**
   * Learns the alerts other replicas wrote since the last time (and resolves those of ours it finds
   * to be duplicates of theirs: AlertManager.sync, resolveDuplicates), and forgets the closed alerts
   * a start would not load. Every SYNC_INTERVAL_MS, and before the worker judges a partition a rebalance
   * brought it. Rejects when they cannot be read; the next call reads from the same time.
   */
  async syncWithStore(): Promise<void> {
    this.manager.forgetClosed();
    const startedAt = this.now();
    for (const stored of (await this.store.changedSince(new Date(this.syncedUpTo - SYNC_OVERLAP_MS))).sort(laterCreatedFirst)) {
      const next = this.manager.sync(stored);
      // The stored copy lacks what this replica knows: a write from an older copy landed over ours (a
      // key's previous owner, an admin's change decided before our update), or the merge found a
      // recurrence after a resolution made elsewhere (AlertManager.merge). Written, so the store is
      // repaired even when no finding comes to update the alert.
      if (next.id === stored.id && mergeCopies(stored, next) !== stored) this.repair(next);
    }
    this.syncedUpTo = startedAt;
    this.inBackground(this.resolveDuplicates().then(() => undefined));
  }

  /**
   * Resolves the alerts of ours AlertManager.sync found to be duplicates, each as an admin's change is
   * made (writeChange): decided on its stored copy, with our detection fields merged in, written as a
   * compare-and-set and read back, then read back again later (verifyLater: another replica's update
   * made from a copy read before ours may land over it). Only the replica that created a duplicate
   * resolves it. An admin's dismissal or resolution made meanwhile stands instead of ours; an
   * acknowledgement that won the race is resolved at the next pass. Each is a write of its own, so
   * detection's and admins' writes are not held behind a spray's many merchants. One that fails is
   * tried again after the next sync, and at stop. Never rejects; resolves to how many it resolved.
   */
  private resolveDuplicates(): Promise<number> {
    for (const duplicate of this.manager.takeDuplicates()) this.duplicates.set(duplicate.alert.id, duplicate);
    const writes = [...this.duplicates.values()]
      .filter(({ alert }) => !this.resolving.has(alert.id))
      .map((duplicate) => {
        this.resolving.add(duplicate.alert.id);
        return this.serially(() => this.resolveDuplicate(duplicate)).finally(() => this.resolving.delete(duplicate.alert.id));
      });
    return Promise.all(writes).then((resolved) => resolved.filter(Boolean).length);
  }

  /** Whether it resolved the duplicate (see resolveDuplicates). */
  private async resolveDuplicate({ alert: ours, kept }: Duplicate): Promise<boolean> {
    const { id } = ours;
    try {
      const stored = await this.store.getStored(id, ours.merchantId);
      if (!stored) return this.resolveUnstored(ours, kept);
      if (!(stored.alert.status === 'open' || stored.alert.status === 'acknowledged')) {
        this.duplicates.delete(id);
        return false;
      }
      const { alert, lost } = await this.writeChange(duplicateResolution(mergeCopies(stored.alert, ours), kept, this.now()), stored);
      if (lost) {
        this.logger.info({ alertId: id, keptAlertId: kept.id, otherActor: lost.actor, otherTo: lost.to }, 'a duplicate alert was changed through another replica as it was being resolved; read again at the next pass');
        return false;
      }
      this.duplicates.delete(id);
      this.carryInto(this.manager.sync(alert), alert);
      this.metrics.duplicateAlertsResolved.inc({ type: alert.type });
      this.verifyLater(alert);
      this.logger.info({ alertId: id, keptAlertId: kept.id, merchantId: alert.merchantId, type: alert.type }, 'alert resolved as a duplicate of one another replica opened at the same time');
      return true;
    } catch (error) {
      this.logger.warn({ err: error, alertId: id }, 'resolving a duplicate alert failed; trying again after the next sync');
      return false;
    }
  }

  /**
   * A duplicate not written yet (its first write waits for the next flush, or for storage to come
   * back): it is written resolved, never open; no other replica knows of it to change it meanwhile.
   * Whether it resolved it (none is waiting to be written: nothing to resolve).
   */
  private resolveUnstored(ours: Alert, kept: Alert): boolean {
    this.duplicates.delete(ours.id);
    const pending = this.unsaved.get(ours.id);
    if (!pending) return false;
    const resolved = duplicateResolution(mergeCopies(pending, ours), kept, this.now());
    this.unsaved.set(ours.id, resolved);
    this.carryInto(this.manager.sync(resolved), resolved);
    this.metrics.duplicateAlertsResolved.inc({ type: ours.type });
    this.schedule(FLUSH_DELAY_MS);
    this.logger.info({ alertId: ours.id, keptAlertId: kept.id, merchantId: ours.merchantId, type: ours.type }, 'alert resolved as a duplicate of one another replica opened at the same time, before it was stored');
    return true;
  }

  /**
   * The alert kept takes what our duplicate of it saw (withDuplicateFindings: a critical duplicate's
   * severity and score, which enforcement acts on, are not lost with it), written as a repair is.
   * Our duplicate's critical news not yet told (it was created, escalated or reopened critical since
   * its last write, which will store it resolved) passes to the kept alert when taking ours in makes
   * that one critical: on-call hears of it once, when the kept alert is written.
   */
  private carryInto(kept: Alert, duplicate: Alert): void {
    if (kept.id === duplicate.id) return;
    const news = this.newsUnsaved.get(duplicate.id);
    this.newsUnsaved.delete(duplicate.id);
    const carried = withDuplicateFindings(kept, duplicate, this.now());
    if (news !== undefined && carried.severity === 'critical' && kept.severity !== 'critical' && !this.newsUnsaved.has(kept.id)) {
      this.newsUnsaved.set(kept.id, 'escalated');
    }
    if (carried !== kept) this.repair(this.manager.sync(carried));
  }

  /** Queues a write of what this replica knows of an alert (an update already waiting keeps its time). */
  private repair(alert: Alert): void {
    const pending = this.unsaved.get(alert.id);
    this.unsaved.set(alert.id, pending ? mergeCopies(alert, pending) : alert);
    if (!pending) this.schedule(FLUSH_DELAY_MS);
  }

  /**
   * Rule errors are reported at once. Findings are applied at once too, but not before start() has
   * loaded the open alerts: without them a finding would open a second alert where one is open, or
   * wake a dismissed pattern. Until then they are held, in order, and applied when the load is done.
   * (The worker itself hands none over before: its Kafka intake starts after the load, and events
   * posted over HTTP wait in main.ts until detection has started. This keeps the promise for any
   * caller.) After stop() they are ignored: nothing would store them (storage closes next), and a
   * critical one must not reach a webhook as an alert that was never stored.
   */
  handle(detection: Detection): void {
    if (this.stopped) return;
    for (const { ruleId, message } of detection.ruleErrors) {
      this.metrics.ruleErrors.inc({ rule: ruleId });
      if (ruleId === ENGINE_ERROR) this.logger.error({ error: message }, 'detection failed for a batch; its events are stored all the same');
      else this.logger.error({ rule: ruleId, error: message }, 'rule failed; the other rules went on');
    }
    this.findings.take(detection.findings);
  }

  /** Each finding opens, repeats, escalates or reopens its alert (AlertManager.apply), in order. */
  private apply(findings: readonly EngineFinding[]): void {
    for (const { merchantId, ruleId, finding } of findings) {
      const rule = this.rules.get(ruleId);
      if (!rule) continue;
      const { alert, change } = this.manager.apply(merchantId, rule, finding);
      this.metrics.alertChanges.inc({ type: ruleId, change });
      if (!alert) continue;
      this.unsaved.set(alert.id, alert);
      this.schedule(change === 'updated' ? REPEAT_FLUSH_DELAY_MS : FLUSH_DELAY_MS);
      if (change !== 'updated') {
        this.logger.info({ alertId: alert.id, merchantId, type: ruleId, severity: alert.severity, change }, alert.title);
      }
      if (alert.severity === 'critical' && (change === 'created' || change === 'escalated' || change === 'reopened')) {
        if (!this.newsUnsaved.has(alert.id)) this.newsUnsaved.set(alert.id, change);
      }
    }
  }

  /**
   * Tells hooks.onCritical the news of alerts just stored (`stored`: their stored copies). Not of an
   * alert another replica had stored critical and open or acknowledged before the write (`toldBefore`):
   * that replica told on-call (the key's previous and new owner can each escalate their copy before
   * either syncs), and one attack pages once. Two such writes made at the same moment each read the
   * copy before the other's, and both tell.
   */
  private announce(news: ReadonlyMap<string, CriticalChange>, stored: readonly Alert[], toldBefore: ReadonlySet<string>): void {
    for (const alert of stored) {
      const change = news.get(alert.id);
      if (change === undefined || !isCriticalNews(alert) || toldBefore.has(alert.id)) continue;
      try {
        this.hooks.onCritical?.(alert, change);
      } catch (error) {
        this.logger.error({ err: error, alertId: alert.id }, 'critical-alert hook failed');
      }
    }
  }

  /**
   * An admin's status change of one alert of a merchant (any merchant when undefined). It is decided
   * on the stored copy read just before the write, merged with ours (AlertManager.current: a status
   * change made through another replica counts), in this replica's queue of writes (so two changes
   * of one alert here are decided one after the other). It is written as a compare-and-set and read
   * back (writeChange): it is answered made once it stands in storage, and refused (not_allowed) when
   * a conflicting change decided on the same copy through another replica stood first. Only then is
   * it remembered for dedup, though a dismissal silences the dedup key here while it is written. A
   * failed write or read-back rejects and leaves nothing behind, or the change was stored after all
   * (its answer lost), so the caller's retry, the same move by the same actor with the same note, is
   * accepted without recording it twice. Undefined when no such alert exists for that merchant.
   */
  async changeStatus(
    id: string,
    merchantId: string | undefined,
    change: { to: AlertStatus; actor: string; note?: string },
  ): Promise<StatusChange | undefined> {
    return this.serially(async () => {
      const stored = await this.store.getStored(id, merchantId);
      if (!stored) return undefined;
      const current = this.manager.current(stored.alert);
      if (isRepeatedChange(current, change.to, change.actor, change.note ?? null)) {
        // A retry: what this replica knows may lack the change (the first answer was lost); the stored
        // copy may too, if a racing write dropped it (then it is written again, as the read-back would).
        if (mergeLifecycle(stored.alert, current) !== stored.alert) await this.store.save([current], new Map([[id, stored.version]]));
        this.manager.sync(current);
        return { ok: true, alert: current } as const;
      }
      const outcome = changeStatus(current, change.to, change.actor, change.note, this.now());
      if (!outcome.ok) return outcome;
      // While it is written, a dismissal already silences the key here (no critical webhook for an
      // alert being dismissed); forgotten if the write fails or loses.
      this.manager.changeStarted(id, change.to);
      try {
        const { alert, lost } = await this.writeChange(outcome.alert, stored);
        if (lost) {
          this.logger.warn({ alertId: id, actor: change.actor, to: change.to, otherActor: lost.actor, otherTo: lost.to }, 'a status change lost to a conflicting one made at the same time through another replica; refused');
          return { ok: false, reason: 'not_allowed' } as const;
        }
        // sync, not a plain set: detection may have updated our copy while the write was in progress.
        this.manager.sync(alert);
        this.verifyLater(alert);
        this.logger.info({ alertId: id, merchantId: stored.alert.merchantId, actor: change.actor, to: change.to }, 'alert status changed');
        return { ok: true, alert } as const;
      } finally {
        this.manager.changeDone(id);
      }
    });
  }

  /**
   * Writes an admin's change decided on the stored copy `on`, as a compare-and-set (AlertStore.save
   * with `decidedOn`), and reads the alert back before answering, as the copy that stands decides:
   * - the change is there: made;
   * - a conflicting move is there instead (another replica's change from the same status, which
   *   landed first: ours was dropped by the table, or landed over a copy that lacked it): lost;
   * - neither (a write without a conflicting move landed over the copy between our read and our
   *   write, say the key's owner's escalation, and stands over ours): the change is made again at
   *   once on the copy that stands, keeping its detection fields (mergeCopies), up to
   *   MAX_VERIFICATIONS times; verifyLater goes on after that.
   * Rejects when a write or a read fails: the change may or may not stand (the caller's retry tells).
   */
  private async writeChange(changed: Alert, on: StoredAlert): Promise<{ alert: Alert; lost?: HistoryEntry }> {
    const entry = latestEntry(changed)!;
    let ours = changed;
    let base = on;
    for (let attempt = 1; ; attempt++) {
      await this.store.save([ours], new Map([[ours.id, base.version]]), { decidedOn: base.version });
      const [after] = await this.store.getMany([ours.id]);
      if (!after || mergeLifecycle(after.alert, ours) === after.alert) return { alert: ours };
      const lost = this.lostTo(after, ours);
      if (lost || attempt >= MAX_VERIFICATIONS) return { alert: ours, lost };
      this.logger.warn({ alertId: ours.id, actor: entry.actor, to: entry.to }, 'a status change was written over by another replica before it was read back; writing it again');
      ours = mergeCopies(after.alert, ours);
      base = after;
    }
  }

  /**
   * The conflicting change a change we stored lost to: one from the same status, made through another
   * replica (from the same copy, stored first: ours was dropped; or from a copy a racing write had
   * left without ours), which stands in the stored copy (the highest version) while ours is missing.
   * Ours is then forgotten here (forgetLost) and not written again (the history would hold two moves
   * out of one status). Undefined when ours is stored, or was written over by a write without a
   * conflicting move (the key's owner's): that is written again.
   */
  private lostTo(stored: StoredAlert, changed: Alert): HistoryEntry | undefined {
    if (mergeLifecycle(stored.alert, changed) === stored.alert) return undefined;
    const ours = latestEntry(changed)!;
    const theirs = conflictingMove(stored.alert, changed, ours);
    if (theirs) this.forgetLost(stored.alert, ours);
    return theirs;
  }

  /**
   * Our change `lost` lost to a conflicting one that stands in `stored`: this replica takes the stored
   * lifecycle without our entry (AlertManager.adoptLifecycle), in memory and in an update waiting to
   * be written, so that no later write of ours brings it back (two moves out of one status), and a
   * lost dismissal does not silence the key here.
   */
  private forgetLost(stored: Alert, lost: HistoryEntry): void {
    this.manager.adoptLifecycle(stored, lost);
    const pending = this.unsaved.get(stored.id);
    if (pending) this.unsaved.set(stored.id, mergeCopies(withoutEntry(pending, lost), stored));
  }

  /** Writes every unsaved alert; resolves when they are stored (or the write failed and is rescheduled). */
  async flush(): Promise<void> {
    await this.flushNow().then(
      () => this.storing.succeeded(),
      (error: unknown) => this.storing.failed({ err: error }),
    );
  }

  /**
   * Another replica that owns the alert's key may have written it between our read and our write,
   * without our change: read it back a little later and, if the change is missing, write it again,
   * and read it back again, until it is there or MAX_VERIFICATIONS reads have been made.
   */
  private verifyLater(changed: Alert, verification = 1): void {
    if (this.stopped) return;
    const again = (why: string) => {
      if (verification < MAX_VERIFICATIONS) this.verifyLater(changed, verification + 1);
      else this.logger.error({ alertId: changed.id, verifications: verification }, `${why}; giving up on reading it back`);
    };
    const timer = setTimeout(() => {
      this.verifyTimers.delete(timer);
      const read = this.store
        .getMany([changed.id])
        .then(([stored]) => {
          if (!stored) return;
          const lost = this.lostTo(stored, changed);
          if (lost) {
            const ours = latestEntry(changed)!;
            this.logger.error(
              { alertId: changed.id, actor: ours.actor, to: ours.to, otherActor: lost.actor, otherTo: lost.to },
              'a status change answered as made lost to a conflicting one made at the same time through another replica',
            );
            return;
          }
          if (mergeLifecycle(stored.alert, changed) === stored.alert) return;
          const merged = mergeCopies(stored.alert, changed);
          this.logger.warn({ alertId: changed.id }, 'a status change was written over by another replica; writing it again');
          this.manager.sync(merged);
          // Detection's update waiting to be written, if any, is merged in (mergeCopies: neither copy's
          // severity, counters or evidence are written back over).
          const pending = this.unsaved.get(changed.id);
          this.unsaved.set(changed.id, pending ? mergeCopies(pending, merged) : merged);
          this.schedule(FLUSH_DELAY_MS);
          again('a status change keeps being written over');
        })
        .catch((error: unknown) => {
          this.logger.warn({ err: error, alertId: changed.id }, 'reading back a status change failed');
          again('reading back a status change keeps failing');
        });
      this.inBackground(read);
    }, VERIFY_DELAY_MS);
    timer.unref();
    this.verifyTimers.add(timer);
  }

  /**
   * Our copies, each with its stored copy merged in (AlertManager.merge: lifecycle and detection
   * fields, see the contract above), the versions of those stored copies, which the write replaces
   * (AlertStore.save's `over`), and the ids of those stored critical and open or acknowledged (their
   * writer told on-call: see announce).
   */
  private async withStoredLifecycle(batch: readonly Alert[]): Promise<{ merged: Alert[]; over: Map<string, number>; storedCritical: Set<string> }> {
    const stored = new Map((await this.store.getMany(batch.map((alert) => alert.id))).map((theirs) => [theirs.alert.id, theirs]));
    const merged = batch.map((alert) => {
      const theirs = stored.get(alert.id);
      return theirs ? this.manager.merge(alert, theirs.alert) : alert;
    });
    const storedCritical = new Set([...stored.values()].filter((theirs) => isCriticalNews(theirs.alert)).map((theirs) => theirs.alert.id));
    return { merged, over: new Map([...stored].map(([id, theirs]) => [id, theirs.version])), storedCritical };
  }

  /**
   * Writes every unsaved alert; a failed write rejects (and is still retried in the background).
   * The batch is taken once the writes before have ended, so this also waits for a write that took
   * our alerts first (a timer's flush, say).
   */
  private flushNow(): Promise<void> {
    return this.serially(async () => {
      if (this.unsaved.size === 0) return;
      const batch = [...this.unsaved.values()];
      this.unsaved.clear();
      // The news of these copies: news that comes during the write is of later copies, for the next one.
      const news = new Map(this.newsUnsaved);
      this.newsUnsaved.clear();
      try {
        const { merged, over, storedCritical } = await this.withStoredLifecycle(batch);
        // What the stored copies taught us (a dismissal made elsewhere) holds whether or not our write succeeds.
        for (const [i, alert] of merged.entries()) if (alert !== batch[i]) this.manager.sync(alert);
        await this.store.save(merged, over);
        // A critical copy stored before is another replica's, which told on-call; or our own, from a
        // write whose answer was lost, which told no one.
        const toldBefore = new Set([...storedCritical].filter((id) => !this.newsMaybeStoredUntold.has(id)));
        for (const id of news.keys()) this.newsMaybeStoredUntold.delete(id);
        this.announce(news, merged, toldBefore); // never throws: a hook's error is logged
      } catch (error) {
        for (const alert of batch) if (!this.unsaved.has(alert.id)) this.unsaved.set(alert.id, alert);
        for (const [id, change] of news) {
          if (!this.newsUnsaved.has(id)) this.newsUnsaved.set(id, change);
          this.newsMaybeStoredUntold.add(id);
        }
        this.schedule(RETRY_DELAY_MS);
        throw error;
      }
    });
  }

  /**
   * Runs a write once the writes before it have ended: one at a time, each merging what the last one
   * stored. An admin's change is one, written on its own, not queued with detection's: it is
   * remembered only once stored, and a failed write is not retried (the caller is told and may try again).
   */
  private serially<T>(write: () => Promise<T>): Promise<T> {
    const written = this.saving.then(write);
    this.saving = written.then(
      () => undefined,
      () => undefined,
    );
    return written;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    clearInterval(this.syncTimer);
    for (const timer of this.verifyTimers) clearTimeout(timer);
    this.verifyTimers.clear();
    await Promise.all([...this.reading]);
    await this.flush();
    // After the flush, which must not wait for them: the alerts found and changed before the stop come
    // first. Then what the alerts kept take from the duplicates resolved (carryInto) is written.
    if ((await this.resolveDuplicates()) > 0) await this.flush();
  }

  /** Keeps a read that never rejects until it ends, so stop() can wait for it. */
  private inBackground(read: Promise<void>): void {
    this.reading.add(read);
    void read.finally(() => this.reading.delete(read));
  }

  /**
   * Flushes within delayMs: an earlier deadline replaces a later one, never the reverse. Does nothing
   * after stop(): its own flush is the last write (storage closes next), so a write that fails during
   * stop() is not retried, and the repairs and read-backs that stop() waits for go in that flush.
   */
  private schedule(delayMs: number): void {
    if (this.stopped) return;
    const dueAt = Date.now() + delayMs;
    if (this.timer && this.timerDueAt <= dueAt) return;
    clearTimeout(this.timer);
    this.timerDueAt = dueAt;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.timerDueAt = Number.POSITIVE_INFINITY;
      void this.flush();
    }, delayMs);
    this.timer.unref();
  }
}

/** Whether a stored copy is one on-call hears of: critical, and open or acknowledged. */
function isCriticalNews(alert: Alert): boolean {
  return alert.severity === 'critical' && (alert.status === 'open' || alert.status === 'acknowledged');
}
