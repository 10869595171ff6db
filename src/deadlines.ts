/**
 * Waiting with a limit, for shutdown steps: a step that does not end in time is given up on, and the
 * stop goes on. The step itself is not cancelled by these (pass it an AbortSignal for that).
 */
import { setTimeout as sleep } from 'node:timers/promises';

/** True when `work` is done within `ms`, false when the time runs out first (a timer that does not keep the process alive); fails as `work` does. */
export function doneWithin(work: Promise<unknown>, ms: number): Promise<boolean> {
  return Promise.race([work.then(() => true), sleep(ms, false, { ref: false })]);
}

/**
 * `work`, unless `signal` aborts first: then undefined at once, and a later failure of `work` is
 * nobody's to report.
 */
export function unlessAborted<T>(work: Promise<T>, signal: AbortSignal): Promise<T | undefined> {
  work.catch(() => undefined);
  if (signal.aborted) return Promise.resolve(undefined);
  return new Promise<T | undefined>((resolve, reject) => {
    const onAbort = () => resolve(undefined);
    signal.addEventListener('abort', onAbort, { once: true });
    work.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}
