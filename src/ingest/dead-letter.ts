/**
 * Dead letters: Kafka messages that cannot become events go to the DLQ topic with their reason,
 * field errors and source partition/offset. Contract: the payload is redacted of API key secrets
 * before it is put in a record, and a record is produced before its source offset is committed.
 */
import type { Producer } from 'kafkajs';
import { redactSecrets } from '../events/secrets.ts';
import type { FieldError, Rejection, RejectionReason } from '../events/request-event.ts';
import { sendInRequests } from './kafka-client.ts';

/** At most this much of the original value is kept in a dead letter. */
export const MAX_DEAD_LETTER_PAYLOAD = 16 * 1024;

export interface DeadLetter {
  reason: RejectionReason;
  errors: FieldError[];
  eventId?: string;
  source: { topic: string; partition: number; offset: string; timestamp?: string };
  /**
   * The original value, secrets redacted, truncated to MAX_DEAD_LETTER_PAYLOAD characters. When a
   * JSON value with escapes carried a secret, its escape-resolved serialization (redactedPayload).
   */
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

/** Produces dead letters to the DLQ topic, keyed by source partition so they keep their order. */
export class KafkaDeadLetterQueue {
  constructor(
    private readonly producer: Pick<Producer, 'send'>,
    private readonly topic: string,
  ) {}

  send(records: readonly DeadLetter[]): Promise<void> {
    const messages = records.map((record) => ({
      key: `${record.source.topic}:${record.source.partition}`,
      value: JSON.stringify(record),
      headers: { 'dlq-reason': record.reason },
    }));
    return sendInRequests(this.producer, this.topic, messages);
  }
}
