/**
 * Request input checked with zod, with every problem reported as a Format B 400 naming the field:
 * `{error, code:'VALIDATION_ERROR', details:[{path:['query','limit'], message}]}`. Unknown fields are
 * refused by the strict schemas themselves; each unknown key is named on its own.
 */
import type { z } from 'zod';
import { validationError, type FieldIssue } from '../http/errors.ts';

export type InputLocation = 'query' | 'body' | 'params';

/** Most issues reported for one request: a hostile input must not produce a huge answer. */
const MAX_ISSUES = 20;

export function parseInput<S extends z.ZodType>(schema: S, value: unknown, location: InputLocation): z.output<S> {
  const parsed = schema.safeParse(value ?? {});
  if (parsed.success) return parsed.data;
  const details: FieldIssue[] = [];
  for (const issue of parsed.error.issues) {
    if (issue.code === 'unrecognized_keys') {
      for (const key of issue.keys) details.push({ path: [location, ...issue.path.map(pathPart), truncate(key)], message: 'unknown field' });
    } else {
      details.push({ path: [location, ...issue.path.map(pathPart)], message: issue.message });
    }
  }
  throw validationError(details.slice(0, MAX_ISSUES), `Invalid ${location}`);
}

function pathPart(part: PropertyKey): string | number {
  return typeof part === 'number' ? part : truncate(String(part));
}

/** Field names come from the caller: never echo more than a short prefix of one. */
function truncate(text: string): string {
  return text.length > 64 ? `${text.slice(0, 64)}…` : text;
}
