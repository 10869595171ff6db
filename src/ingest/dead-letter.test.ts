import { describe, expect, it } from 'vitest';
import type { ProducerRecord } from 'kafkajs';
import { KafkaDeadLetterQueue, MAX_DEAD_LETTER_PAYLOAD, toDeadLetter } from './dead-letter.ts';
import { MAX_SEND_BYTES } from './kafka-client.ts';

function deadLetters(count: number, payloadChars: number) {
  return Array.from({ length: count }, (_, i) =>
    toDeadLetter({ reason: 'too_large', errors: [{ path: [], message: 'larger than 64 KiB' }] }, `${i}:${'x'.repeat(payloadChars)}`, {
      topic: 'api.request-metadata',
      partition: 3,
      offset: String(i),
    }),
  );
}

describe('KafkaDeadLetterQueue', () => {
  it('sends a burst of large dead letters in requests under the byte limit, in order, all of them', async () => {
    const sent: ProducerRecord[] = [];
    const queue = new KafkaDeadLetterQueue({ send: async (record) => (sent.push(record), []) }, 'dlq');
    const records = deadLetters(200, MAX_DEAD_LETTER_PAYLOAD); // about 3.2 MB, one source partition
    await queue.send(records);
    expect(sent.length).toBeGreaterThan(1);
    for (const request of sent) {
      expect(request.acks).toBe(-1);
      expect(request.messages.reduce((sum, message) => sum + Buffer.byteLength(message.value as string), 0)).toBeLessThanOrEqual(MAX_SEND_BYTES);
    }
    const offsets = sent.flatMap((request) => request.messages.map((message) => JSON.parse(message.value as string).source.offset));
    expect(offsets).toEqual(records.map((record) => record.source.offset));
    expect(sent[0]!.messages[0]).toMatchObject({ key: 'api.request-metadata:3', headers: { 'dlq-reason': 'too_large' } });
  });

  it('sends small dead letters in one request, and nothing for none', async () => {
    const sent: ProducerRecord[] = [];
    const queue = new KafkaDeadLetterQueue({ send: async (record) => (sent.push(record), []) }, 'dlq');
    await queue.send([]);
    expect(sent).toHaveLength(0);
    await queue.send(deadLetters(50, 100));
    expect(sent.map((request) => request.messages.length)).toEqual([50]);
  });
});

describe('toDeadLetter', () => {
  it('redacts what is left of a secret that the payload limit cuts short', () => {
    const head = 'x'.repeat(MAX_DEAD_LETTER_PAYLOAD - 10);
    const record = toDeadLetter({ reason: 'too_large', errors: [] }, `${head} sk_0123456789abcdef`, { topic: 't', partition: 0, offset: '1' });
    expect(record.payloadTruncated).toBe(true);
    expect(record.payload).toBe(`${head} sk_[REDACTED]`);
  });
});

describe('toDeadLetter of a value with escaped secrets', () => {
  const source = { topic: 't', partition: 0, offset: '1' };

  it('redacts secrets written with JSON and URL escapes in the raw value, plain ones beside them too', () => {
    const text = '{"eventId":"e1","path":"/v1/keys/sk_live_plain0123","userAgent":"\\u0073k_live_hidden4567 x","ref":"s%6B_live_pct89ab", broken';
    const record = toDeadLetter({ reason: 'invalid_json', errors: [] }, text, source);
    expect(record.payload).toBe('{"eventId":"e1","path":"/v1/keys/sk_[REDACTED]","userAgent":"sk_[REDACTED] x","ref":"sk_[REDACTED]", broken');
  });

  it('redacts what is left of an escaped secret that the payload limit cuts short', () => {
    const head = 'x'.repeat(MAX_DEAD_LETTER_PAYLOAD - 16);
    const record = toDeadLetter({ reason: 'too_large', errors: [] }, `${head} \\u0073k\\u005flive_0123456789abcdef`, source);
    expect(record.payloadTruncated).toBe(true);
    expect(record.payload).toBe(`${head} sk_[REDACTED]`);
  });
});
