/**
 * Reading figures out of an alert's evidence and writing them into short insight lines. Evidence is
 * stored JSON (older rule versions, other replicas): every reader checks the type and gives
 * undefined for anything missing or malformed, so an insight never quotes a figure that is not there.
 */

/** The longest insight line; anything longer is cut with an ellipsis. */
export const MAX_LINE_CHARS = 200;
/** The longest value copied from evidence into a line (a path, a place, a tool name). */
const MAX_VALUE_CHARS = 60;

export interface EvidenceReader {
  /** A finite number >= 0, or undefined. */
  count(name: string): number | undefined;
  text(name: string): string | undefined;
  /** The strings of an array (other items skipped); [] when absent. */
  strings(name: string): string[];
  /** A nested object as a reader of its own (empty when absent). */
  nested(name: string): EvidenceReader;
  /** A nested object's own entries whose values are counts, e.g. evidence.tools = {sqlmap: 3}. */
  counts(name: string): [string, number][];
  /** The objects of an array, each as a reader. */
  items(name: string): EvidenceReader[];
}

export function readEvidence(evidence: unknown): EvidenceReader {
  const record = isRecord(evidence) ? evidence : {};
  return {
    count: (name) => asCount(record[name]),
    text: (name) => (typeof record[name] === 'string' ? record[name] : undefined),
    strings: (name) => (Array.isArray(record[name]) ? record[name].filter((item): item is string => typeof item === 'string') : []),
    nested: (name) => readEvidence(record[name]),
    counts: (name) => {
      const value = record[name];
      if (!isRecord(value)) return [];
      return Object.entries(value).flatMap(([key, n]) => (asCount(n) === undefined ? [] : [[key, asCount(n)!] as [string, number]]));
    },
    items: (name) => (Array.isArray(record[name]) ? record[name].filter(isRecord).map(readEvidence) : []),
  };
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function asCount(value: unknown): number | undefined {
  return typeof value === 'number' && Number.isFinite(value) && value >= 0 ? value : undefined;
}

/** 1200 -> "1,200"; 2.456 -> "2.5" (figures are read, not computed: one decimal is enough). */
export function figure(n: number): string {
  return n.toLocaleString('en-US', { maximumFractionDigits: 1 });
}

export function percent(share: number): string {
  return `${Math.round(share * 100)}%`;
}

/** "1 key", "3 keys". */
export function plural(n: number, noun: string, nouns = `${noun}s`): string {
  return `${figure(n)} ${n === 1 ? noun : nouns}`;
}

/** A value copied from evidence, cut to a readable length. */
export function quoted(value: string, max = MAX_VALUE_CHARS): string {
  return value.length <= max ? value : `${value.slice(0, max - 1)}…`;
}

/** "a", "a and b", "a, b and c", "a, b, c and 4 more" (at most `shown` named). */
export function listed(values: readonly string[], shown = 3): string {
  const named = values.slice(0, shown);
  const rest = values.length - named.length;
  if (rest > 0) return `${named.join(', ')} and ${figure(rest)} more`;
  if (named.length <= 1) return named.join('');
  return `${named.slice(0, -1).join(', ')} and ${named[named.length - 1]}`;
}

/** A finished line: at most MAX_LINE_CHARS. */
export function line(text: string): string {
  return text.length <= MAX_LINE_CHARS ? text : `${text.slice(0, MAX_LINE_CHARS - 1)}…`;
}
