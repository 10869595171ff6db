/**
 * Dead letters: Kafka messages that cannot become events go to the DLQ topic with their reason,
 * field errors and source partition/offset. Contract: the payload is redacted of API key secrets
 * before it is put in a record, and a record is produced before its source offset is committed.
 */
import type { Producer } from 'kafkajs';
import { redactSecrets } from '../events/secrets.ts';
import type { FieldError, Rejection, RejectionReason } from '../events/request-event.ts';

/** At most this much of the original value is kept in a dead letter. */
export const MAX_DEAD_LETTER_PAYLOAD = 16 * 1024;

export interface DeadLetter {
  reason: RejectionReason;
  errors: FieldError[];
  eventId?: string;
  source: { topic: string; partition: number; offset: string; timestamp?: string };
  /** The original value, secrets redacted, truncated to MAX_DEAD_LETTER_PAYLOAD characters. */
  payload: string;
  payloadTruncated: boolean;
  deadLetteredAt: string;
}

export function toDeadLetter(rejection: Rejection, text: string, source: DeadLetter['source']): DeadLetter {
  const rawValue = rejection.redactedPayload ?? text;
  const head = rawValue.length > MAX_DEAD_LETTER_PAYLOAD ? rawValue.slice(0, MAX_DEAD_LETTER_PAYLOAD) : rawValue;
  return {
    reason: rejection.reason,
    errors: rejection.errors,
    ...(rejection.eventId === undefined ? {} : { eventId: rejection.eventId }),
    source,
    // Redact after truncation: a cut cannot expose a secret the full text hid.
    payload: redactSecrets(head),
    payloadTruncated: head.length < rawValue.length,
    deadLetteredAt: new Date().toISOString(),
  };
}

/**
 * At most this many bytes of dead letters go in one produce request. Kafka refuses a record batch
 * over the broker's `message.max.bytes` (1 MiB by default) with an error that is not retriable, and
 * a flush's dead letters from one source partition all go to one DLQ partition: sent at once, a
 * burst of malformed messages would be refused on every retry and hold up the flush for good.
 */
export const MAX_DEAD_LETTER_SEND_BYTES = 256 * 1024;

/** Produces dead letters to the DLQ topic, keyed by source partition so they keep their order. */
export class KafkaDeadLetterQueue {
  constructor(
    private readonly producer: Pick<Producer, 'send'>,
    private readonly topic: string,
  ) {}

  async send(records: readonly DeadLetter[]): Promise<void> {
    const messages = records.map((record) => ({
      key: `${record.source.topic}:${record.source.partition}`,
      value: JSON.stringify(record),
      headers: { 'dlq-reason': record.reason },
    }));
    // In order, one request after the other: a retry after a failure sends them all again (the
    // DLQ is at-least-once), never out of order.
    const sizes = messages.map((message) => Buffer.byteLength(message.value));
    let start = 0;
    while (start < messages.length) {
      let end = start + 1; // one at least, whatever its size
      let bytes = sizes[start]!;
      while (end < messages.length && bytes + sizes[end]! <= MAX_DEAD_LETTER_SEND_BYTES) bytes += sizes[end++]!;
      await this.producer.send({ topic: this.topic, acks: -1, messages: messages.slice(start, end) });
      start = end;
    }
  }
}
