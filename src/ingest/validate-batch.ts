/**
 * Turns one batch of raw Kafka values into event rows (TabSeparated): parse, validate, drop re-published
 * eventIds, serialize; an event in its common form is read from its bytes into its row by the fast
 * path (event-scanner.ts), any other parsed and validated by the schema. Pure apart from the
 * RecentEventIds it is given; runs inside the analysis thread (analysis-thread-main.ts).
 */
import { isAscii } from 'node:buffer';
import { EVENT_TIME_RANGE, MAX_EVENT_BYTES, MAX_ID_LENGTH, parseRequestEventText, PLANS, timesAsOf, tooLarge, type BatchEvent, type Rejection, type TimeRange } from '../events/request-event.ts';
import { containsSecret } from '../events/secrets.ts';
import { serializeEventRow, tsvText } from '../store/event-store.ts';
import { EventScanner } from './event-scanner.ts';
import type { RecentEventIds } from './recent-event-ids.ts';
import { RowBuffer } from './row-buffer.ts';

export interface RawBatch {
  topic: string;
  partition: number;
  /** The values of the messages, back to back. */
  values: Uint8Array;
  /** ends[i] is where message i's value ends in `values`. */
  ends: Uint32Array;
  /** The messages' keys, back to back (a message without a key has an empty one). */
  keys: Uint8Array;
  /** keyEnds[i] is where message i's key ends in `keys`. */
  keyEnds: Uint32Array;
  /** Kafka offset of each message. */
  offsets: Float64Array;
  /** Kafka timestamp (epoch ms) of each message. */
  timestamps: Float64Array;
}

/** A message that cannot become an event, with what its dead letter needs. */
export interface BatchRejection {
  /** The message's index in the batch. */
  index: number;
  rejection: Rejection;
  /** The message's value as text (secrets still in it: the dead letter redacts). */
  text: string;
  offset: string;
  timestamp: string;
}

export interface ValidatedBatch {
  /** Rows of the accepted events (serializeEventRow), newline-terminated. */
  rows: Uint8Array;
  rowCount: number;
  duplicates: number;
  /**
   * Accepted events whose message key is not their apiKeyId (the contract has producers key
   * messages by it, so that one replica sees all of a key's events).
   */
  misrouted: number;
  /** Messages that cannot become events, in batch order. */
  rejections: BatchRejection[];
  /**
   * The accepted events, and those dead-lettered only for a secret in what the caller sent
   * (Rejection.redactedEvent), for detection (stays in the thread); those of plans not judged may be UnjudgedEvents.
   */
  events: BatchEvent[];
}

const decoder = new TextDecoder();
/**
 * Message keys are compared as they are, a byte-order mark included: a key with one is not the
 * apiKeyId's bytes, and is partitioned by its own (EventScanner.isKeyedBy compares bytes too).
 */
const keyDecoder = new TextDecoder('utf-8', { ignoreBOM: true });

/**
 * A value longer than an event may be (MAX_EVENT_BYTES) is too large whatever its bytes: it is copied
 * for analysis cut to this many bytes (analysis-thread.ts), and only they are read and dead-lettered.
 * Decoded whole, a value that a compressed batch expanded to hundreds of MiB would be a string over
 * V8's limit (about 512 Mi characters), and the throw would stop the worker on every start. Cut to
 * this, it still holds more characters than a dead letter keeps (MAX_DEAD_LETTER_PAYLOAD, 16 Ki), so
 * the letter says it was cut.
 */
export const MAX_COPIED_VALUE_BYTES = MAX_EVENT_BYTES + 4;

/**
 * A message key longer than this (in bytes) is no apiKeyId (at most 128 characters, of up to 4 bytes
 * each): it is copied cut to this, and counted misrouted without being decoded.
 */
export const MAX_COPIED_KEY_BYTES = 4 * MAX_ID_LENGTH + 1;

/**
 * Bytes of rows per byte of the messages they were read from, as the last batch that stored rows
 * had them (rows are shorter than their messages: no field names). A batch's rows are written into
 * memory sized by it, with a little room, so that they fill it and are handed over as they are.
 * Sized to the messages, a third of it stayed empty, and every batch's rows were copied into memory
 * of their size (trimmedBytes). Repeats and refused messages do not count, so a batch of them does
 * not shrink the next one's memory; rows that outgrow it make it grow (a copy) and are usually
 * trimmed (another). Bounded, so that one odd batch does not set the next one's size.
 */
let rowBytesPerMessageByte = 1;
const ROW_ROOM_SHARE = 1.03;

/** The fast path's reader, one for the thread (validateBatch is synchronous). */
const scanner = new EventScanner();
const ALL_PLANS: ReadonlySet<string> = new Set(PLANS);

/**
 * `times`: the event times storage holds (storableEventTimes); others are rejected. Its bound that
 * moves with the clock (events older than the raw events are kept) is taken as of `now`, once a batch.
 * `judgedPlans`: the plans detection judges (ENTITLED_PLANS); an event of another plan that the fast
 * path read goes to `events` as an UnjudgedEvent (no event object is made for it).
 */
export function validateBatch(batch: RawBatch, recentIds: RecentEventIds, times: TimeRange = EVENT_TIME_RANGE, now = Date.now(), judgedPlans: ReadonlySet<string> = ALL_PLANS): ValidatedBatch {
  const storable = timesAsOf(times, now);
  // Room for the rows the last batch that stored rows suggests (it grows for more); they are
  // trimmed to their size when handed over if they leave much of it empty.
  const rows = new RowBuffer(Math.ceil(batch.values.length * rowBytesPerMessageByte * ROW_ROOM_SHARE) + 4096);
  const rejections: ValidatedBatch['rejections'] = [];
  const events: BatchEvent[] = [];
  const ascii = isAscii(batch.values);
  const valuesBuffer = Buffer.from(batch.values.buffer, batch.values.byteOffset, batch.values.byteLength);
  const text = messageTexts(valuesBuffer, ascii);
  const topicText = tsvText(batch.topic);
  // The fast path writes the topic a byte per character (Kafka's topic names are ASCII).
  const fastPath = ascii && /^[\x20-\x7e]*$/.test(topicText);
  let duplicates = 0;
  let misrouted = 0;
  let storedMessageBytes = 0;
  let start = 0;
  let keyStart = 0;
  for (let index = 0; index < batch.ends.length; index++) {
    const end = batch.ends[index]!;
    const keyEnd = batch.keyEnds[index]!;
    // Its bytes alone say a value is too large; only its head is read (see MAX_COPIED_VALUE_BYTES).
    const oversized = end - start > MAX_EVENT_BYTES;
    // A hint of a secret is searched as the slow path searches it; one found goes the slow way, which refuses it.
    if (fastPath && !oversized && scanner.read(batch.values, start, end, storable) && !(scanner.mayHoldSecret && containsSecret(text(start, end)))) {
      if (recentIds.checkAndAddAscii(batch.values, scanner.eventIdStart, scanner.eventIdEnd, batch.partition)) {
        duplicates++;
      } else {
        if (!scanner.isKeyedBy(batch.keys, keyStart, keyEnd)) misrouted++;
        scanner.writeRow(rows, topicText, batch.partition, batch.offsets[index]!);
        storedMessageBytes += end - start;
        events.push(judgedPlans.has(scanner.plan) ? scanner.event(valuesBuffer) : { plan: scanner.plan, timestamp: scanner.timestamp, unjudged: true });
      }
      start = end;
      keyStart = keyEnd;
      continue;
    }
    const messageText = text(start, oversized ? Math.min(end, start + MAX_COPIED_VALUE_BYTES) : end);
    const result = oversized ? tooLarge() : parseRequestEventText(messageText, storable);
    const messageBytes = end - start;
    start = end;
    if (!result.ok) {
      const { redactedEvent, ...rejection } = result.rejection;
      rejections.push({ index, rejection, text: messageText, offset: String(batch.offsets[index]), timestamp: String(batch.timestamps[index]) });
      // Dead-lettered, yet judged (Rejection.redactedEvent). Its id is not remembered as stored: a copy
      // the fleet sends again without the secret is stored; detection counts a redelivery once.
      if (redactedEvent !== undefined) events.push(redactedEvent);
    } else if (recentIds.checkAndAdd(result.event.eventId, batch.partition)) {
      duplicates++;
    } else {
      if (!isKeyedBy(batch.keys, keyStart, keyEnd, result.event.apiKeyId)) misrouted++;
      rows.append(serializeEventRow(result.event, { topic: batch.topic, partition: batch.partition, offset: batch.offsets[index]! }, messageText));
      storedMessageBytes += messageBytes;
      events.push(result.event);
    }
    keyStart = keyEnd;
  }
  if (storedMessageBytes > 0) rowBytesPerMessageByte = Math.min(2, Math.max(0.5, rows.byteLength / storedMessageBytes));
  scanner.release();
  // Trimmed: the main thread holds this memory until the rows are stored (RowChunks).
  return { rows: rows.trimmedBytes(), rowCount: rows.rows, duplicates, misrouted, rejections, events };
}

/** Whether the key bytes [start, end) are `apiKeyId` in UTF-8: byte for byte when ASCII (nearly always), else decoded. */
function isKeyedBy(keys: Uint8Array, start: number, end: number, apiKeyId: string): boolean {
  if (end - start > 4 * apiKeyId.length) return false;
  if (end - start === apiKeyId.length) {
    let i = 0;
    while (i < apiKeyId.length && keys[start + i]! < 0x80 && keys[start + i] === apiKeyId.charCodeAt(i)) i++;
    if (i === apiKeyId.length) return true;
  }
  return keyDecoder.decode(keys.subarray(start, end)) === apiKeyId;
}

/**
 * The text of the message between two byte offsets. Events are nearly always ASCII: then a byte is a
 * character, and Buffer's latin1 decoding is the cheapest (faster than a decoder call per message,
 * and than slicing one string of the whole batch, which JSON.parse then reads more slowly).
 */
function messageTexts(values: Buffer, ascii: boolean): (start: number, end: number) => string {
  if (!ascii) return (start, end) => decoder.decode(values.subarray(start, end));
  return (start, end) => values.toString('latin1', start, end);
}
