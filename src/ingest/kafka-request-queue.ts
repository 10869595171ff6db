/**
 * A fix to kafkajs 2.2.4, its last release (tulios/kafkajs#1751, open). After every response, a
 * broker connection's request queue arms a timer for the end of the broker's throttle, to send the
 * requests it holds back then (throttled, or over the in-flight limit). With no throttle its end
 * (-1) is long past, so the delay is negative: the timer fires after 1 ms (Node 24 warns:
 * TimeoutNegativeWarning), finds nothing held back, and arms itself again, for as long as the
 * connection lives: about a thousand wake-ups a second per connection, idle or busy (the figures
 * of `npm run bench:idle` before and after the fix are in the README).
 *
 * The fix arms no timer while nothing is held back: a request held back later arms one itself
 * (RequestQueue.push goes to kafkajs's own scheduling, for the throttle's end or in 10 ms), and
 * while requests are held back every timer that fires arms the next.
 */
import { createRequire } from 'node:module';

/** The part of kafkajs's RequestQueue (src/network/requestQueue/index.js) the fix reads. */
interface RequestQueue {
  /** Requests held back: throttled, or over the in-flight limit. */
  pending: unknown[];
  scheduleCheckPendingRequests(): void;
}

const FIXED = Symbol.for('security-center.kafkajs-idle-request-queue-timer');

/** Installs the fix in the kafkajs this process loads (once; later calls do nothing). */
export function stopIdleRequestQueueTimers(): void {
  const { prototype } = createRequire(import.meta.url)('kafkajs/src/network/requestQueue/index.js') as { prototype: RequestQueue & { [FIXED]?: true } };
  if (prototype[FIXED]) return;
  const schedule = prototype.scheduleCheckPendingRequests;
  // A kafkajs other than the one the lock file pins: fail loudly rather than patch what is not there.
  if (typeof schedule !== 'function') throw new Error("kafkajs's RequestQueue has no scheduleCheckPendingRequests: the idle-timer fix (kafka-request-queue.ts) no longer fits it");
  prototype.scheduleCheckPendingRequests = function (this: RequestQueue) {
    if (this.pending.length === 0) return;
    schedule.call(this);
  };
  prototype[FIXED] = true;
}
