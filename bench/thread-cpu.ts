/**
 * Where a bench's worker spends its CPU, by thread (Linux's /proc): the main thread, the analysis
 * thread, Node's other threads and the storage engine's. Used by bench:ingest and bench:idle.
 */
import { readdirSync, readFileSync } from 'node:fs';

export interface ThreadTimes {
  name: string;
  /** User and system CPU, seconds. */
  cpu: number;
  system: number;
  minorFaults: number;
}

/**
 * This process's threads by id, from /proc (Linux; empty elsewhere). CPU from schedstat (nanoseconds):
 * stat's times are whole ticks (USER_HZ, 100 a second), rounded down per thread, which loses about
 * 0.01 s a thread over a run, mostly the storage engine's many; system time from stat.
 */
export function threadTimes(): Map<string, ThreadTimes> {
  const threads = new Map<string, ThreadTimes>();
  let ids: string[];
  try {
    ids = readdirSync('/proc/self/task');
  } catch {
    return threads;
  }
  for (const id of ids) {
    try {
      const stat = readFileSync(`/proc/self/task/${id}/stat`, 'utf8');
      // The name is in parentheses and may hold spaces; the fields after it are space-separated.
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      const [user, system] = [Number(fields[11]) / 100, Number(fields[12]) / 100];
      let cpu = user + system;
      try {
        cpu = Number(readFileSync(`/proc/self/task/${id}/schedstat`, 'utf8').split(' ')[0]) / 1e9;
      } catch {
        // A kernel without schedstat: stat's ticks.
      }
      threads.set(id, { name: stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')')), cpu, system, minorFaults: Number(fields[7]) });
    } catch {
      // The thread ended meanwhile.
    }
  }
  return threads;
}

/**
 * The names Node gives its own threads: Node 20 names them all `node`; Node 24 names V8's helpers
 * `V8Worker`, libuv's pool `libuv-worker`, a worker_threads thread `WorkerThread`, and the main
 * thread `MainThread` (which a thread the storage engine starts from it inherits: only the process's
 * own id is the main thread).
 */
const NODE_THREAD_NAMES = new Set(['node', 'V8Worker', 'DelayedTaskSche', 'SignalInspector', 'libuv-worker', 'WorkerThread']);

/** Which of cpuByThread's groups the thread `id` named `name` is in. */
function threadGroup(id: string, name: string, before: Map<string, ThreadTimes>): string {
  if (id === String(process.pid)) return 'main thread';
  if (!NODE_THREAD_NAMES.has(name)) return 'storage engine';
  const startedSince = !before.has(id) && (name === 'node' || name === 'WorkerThread');
  return startedSince ? 'analysis thread' : 'other Node threads';
}

/**
 * Where the worker's CPU went between `start` and `end`, by the process's threads, in four groups:
 * the main thread (Kafka fetching and decoding, the HTTP server, handing work on, and the bench's
 * polling), the analysis thread (validation, detection: the worker_threads thread started since
 * `before`), Node's other threads (V8's garbage collection and compilation helpers, libuv's pool)
 * and the storage engine's (chdb's threads, named by it, and any other; none with a ClickHouse
 * server). Each with its system time and minor page faults. Undefined where /proc cannot be read.
 */
export function cpuByThread(before: Map<string, ThreadTimes>, start: Map<string, ThreadTimes>, end: Map<string, ThreadTimes>): string | undefined {
  if (end.size === 0) return undefined;
  const groups = new Map<string, { cpu: number; system: number; minorFaults: number }>();
  for (const [id, now] of end) {
    const then = start.get(id);
    const group = threadGroup(id, now.name, before);
    const sum = groups.get(group) ?? { cpu: 0, system: 0, minorFaults: 0 };
    sum.cpu += now.cpu - (then?.cpu ?? 0);
    sum.system += now.system - (then?.system ?? 0);
    sum.minorFaults += now.minorFaults - (then?.minorFaults ?? 0);
    groups.set(group, sum);
  }
  return [...groups]
    .sort(([, a], [, b]) => b.cpu - a.cpu)
    .map(([group, { cpu, system, minorFaults }]) => `${group} ${cpu.toFixed(2)} s (system ${system.toFixed(2)} s, ${Math.round(minorFaults / 1000)}k minor faults)`)
    .join(', ');
}
