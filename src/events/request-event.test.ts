import { describe, expect, it } from 'vitest';
import { toDeadLetter } from '../ingest/dead-letter.ts';
import { commonEvent, EVENT_TIME_RANGE, parseRequestEventText, parseRequestEventValue, MAX_USER_AGENT_LENGTH, schemaEvent, timesAsOf } from './request-event.ts';

const valid = {
  eventId: 'evt_1',
  timestamp: '2026-11-21T03:00:00.123Z',
  merchantId: 'm_1',
  plan: 'business',
  apiKeyId: 'pk_live_abc',
  environment: 'live',
  ip: '203.0.113.7',
  userAgent: 'okhttp/4.12.0',
  method: 'post',
  path: '/v1/verify/sessions',
  status: 201,
  responseTimeMs: 42.5,
};

function rejectionOf(value: unknown) {
  const result = parseRequestEventValue(value);
  if (result.ok) throw new Error('expected a rejection');
  return result.rejection;
}

describe('request event schema', () => {
  it('accepts a valid event and normalizes it', () => {
    const result = parseRequestEventText(JSON.stringify({ ...valid, country: 'de', extra: 'dropped' }));
    expect(result.ok).toBe(true);
    if (!result.ok) return;
    expect(result.event.timestamp).toBe(Date.UTC(2026, 10, 21, 3, 0, 0, 123));
    expect(result.event.method).toBe('POST');
    expect(result.event.country).toBe('DE');
    expect(result.event).not.toHaveProperty('extra');
  });

  it('accepts epoch milliseconds, IPv6 and offsets', () => {
    const ms = Date.UTC(2026, 0, 2, 3, 4, 5, 6);
    for (const variant of [{ timestamp: ms }, { ip: '2001:db8::1' }, { timestamp: '2026-11-21T04:00:00+01:00' }]) {
      expect(parseRequestEventValue({ ...valid, ...variant }).ok).toBe(true);
    }
    const result = parseRequestEventValue({ ...valid, timestamp: '2026-11-21T04:00:00+01:00' });
    expect(result.ok && result.event.timestamp).toBe(Date.UTC(2026, 10, 21, 3, 0, 0));
  });

  it('accepts epoch milliseconds with a fraction, cut to the millisecond as an ISO time\'s digits past it are', () => {
    const ms = Date.UTC(2026, 10, 21, 3, 0, 0, 123);
    for (const result of [parseRequestEventValue({ ...valid, timestamp: ms + 0.5 }), parseRequestEventText(JSON.stringify({ ...valid, timestamp: ms + 0.999 }))]) {
      expect(result.ok && result.event.timestamp).toBe(ms);
    }
    expect(parseRequestEventValue({ ...valid, timestamp: '2026-11-21T03:00:00.123999Z' }).ok && ms).toBe(ms);
  });

  it.each([
    ['eventId', 'evt_\uD800'],
    ['eventId', 'evt_\uDC00_1'],
    ['eventId', 'evt_\uFFFD'],
    ['merchantId', 'm_\uDBFF'],
    ['apiKeyId', 'pk_live_\uFFFD'],
  ])('rejects a %s storage would not keep apart from another (%j), naming it', (field, value) => {
    for (const result of [parseRequestEventValue({ ...valid, [field]: value }), parseRequestEventText(JSON.stringify({ ...valid, [field]: value }))]) {
      expect(result.ok).toBe(false);
      if (!result.ok) expect(result.rejection.errors).toEqual([{ path: [field], message: expect.stringMatching(/^must be well-formed text: a lone surrogate, or U\+FFFD/) }]);
    }
  });

  it('accepts ids with characters outside the BMP, their surrogates paired', () => {
    expect(parseRequestEventValue({ ...valid, eventId: 'evt_\u{1F600}_\u{10FFFF}', merchantId: 'm_\u00e9' }).ok).toBe(true);
  });

  it.each([
    ['eventId', ''],
    ['eventId', 'x'.repeat(129)],
    ['timestamp', 'yesterday'],
    ['timestamp', 12],
    ['plan', 'gold'],
    ['environment', 'prod'],
    ['ip', '999.1.1.1'],
    ['ip', 'example.com'],
    ['status', 600],
    ['status', 200.5],
    ['responseTimeMs', -1],
    ['country', 'DEU'],
    ['rateLimitPerMinute', 0],
    ['method', 'GET /'],
  ])('rejects %s = %j naming the field', (field, value) => {
    const rejection = rejectionOf({ ...valid, [field]: value });
    expect(rejection.reason).toBe('validation_failed');
    expect(rejection.errors.map((error) => error.path[0])).toContain(field);
    expect(rejection.eventId).toBe(field === 'eventId' ? value.toString().slice(0, 128) || '' : 'evt_1');
  });

  it.each([undefined, 'yesterday', '2026-11-21 03:00:00Z', true, null])('says what a timestamp must be when it is neither form: %j', (timestamp) => {
    expect(rejectionOf({ ...valid, timestamp }).errors).toEqual([
      { path: ['timestamp'], message: 'must be an ISO 8601 time (2026-11-20T12:00:00.000Z) or epoch milliseconds' },
    ]);
  });

  it.each([
    '1999-12-31T23:59:59.999Z', '2100-01-01T00:00:00.001Z', '2150-01-01T00:00:00.000Z', '9999-12-31T23:59:59.999Z', '2100-01-01T00:30:00-01:00',
    Date.UTC(2000, 0, 1) - 1, Date.UTC(2100, 0, 1) + 1,
  ])('rejects a timestamp outside 2000 to 2100 in either form: %j', (timestamp) => {
    expect(rejectionOf({ ...valid, timestamp }).errors).toEqual([
      { path: ['timestamp'], message: 'must be a time from 2000-01-01T00:00:00.000Z to 2100-01-01T00:00:00.000Z' },
    ]);
  });

  it('accepts both ends of the range, in either form and with an offset', () => {
    for (const timestamp of ['2000-01-01T00:00:00.000Z', '2100-01-01T00:00:00.000Z', '2100-01-01T01:00:00+01:00', Date.UTC(2000, 0, 1), Date.UTC(2100, 0, 1)]) {
      expect(parseRequestEventValue({ ...valid, timestamp }).ok, String(timestamp)).toBe(true);
    }
  });

  it('rejects a time storage cannot hold, saying why, in every way in', () => {
    const times = { ...EVENT_TIME_RANGE, max: Date.UTC(2096, 0, 1), why: 'storage ends there' };
    const late = { ...valid, timestamp: '2096-01-01T00:00:00.001Z' };
    for (const result of [parseRequestEventValue(late, times), parseRequestEventText(JSON.stringify(late), times)]) {
      expect(result.ok).toBe(false);
      if (!result.ok) expect(result.rejection.errors).toEqual([{ path: ['timestamp'], message: 'must be a time from 2000-01-01T00:00:00.000Z to 2096-01-01T00:00:00.000Z: storage ends there' }]);
    }
    expect(parseRequestEventValue({ ...valid, timestamp: Date.UTC(2096, 0, 1) }, times).ok).toBe(true);
  });

  it('rejects a time older than storage keeps events, a bound that moves with the clock, saying why, in every way in', () => {
    const now = Date.parse('2026-11-21T03:00:00.123Z');
    const times = { ...EVENT_TIME_RANGE, maxAgeMs: 30 * 86_400_000, minWhy: 'older than kept' };
    const oldest = now - 30 * 86_400_000;
    expect(timesAsOf(times, now)).toEqual({ ...EVENT_TIME_RANGE, min: oldest, minWhy: 'older than kept' });
    const old = { ...valid, timestamp: oldest - 1 };
    for (const result of [parseRequestEventValue(old, timesAsOf(times, now)), parseRequestEventText(JSON.stringify(old), timesAsOf(times, now))]) {
      expect(result.ok).toBe(false);
      if (!result.ok) {
        expect(result.rejection.errors).toEqual([{ path: ['timestamp'], message: `must be a time from ${new Date(oldest).toISOString()} to 2100-01-01T00:00:00.000Z: older than kept` }]);
      }
    }
    expect(parseRequestEventValue({ ...valid, timestamp: new Date(oldest).toISOString() }, timesAsOf(times, now)).ok).toBe(true);
    // A day later the same event is too old, and a range not resolved by the caller is resolved against the clock.
    expect(parseRequestEventValue({ ...valid, timestamp: oldest }, timesAsOf(times, now + 86_400_000)).ok).toBe(false);
    expect(parseRequestEventValue({ ...valid, timestamp: Date.now() - 31 * 86_400_000 }, times).ok).toBe(false);
    expect(parseRequestEventValue({ ...valid, timestamp: Date.now() - 29 * 86_400_000 }, times).ok).toBe(true);
    // Too late still says why the range ends.
    const late = { ...times, max: Date.UTC(2096, 0, 1), why: 'storage ends there' };
    const lateResult = parseRequestEventValue({ ...valid, timestamp: Date.UTC(2096, 0, 1) + 1 }, timesAsOf(late, now));
    expect(!lateResult.ok && lateResult.rejection.errors[0]!.message).toMatch(/: storage ends there$/);
  });

  it('rejects a time more than maxAheadMs after the clock, saying why, whichever end the rule or storage had', () => {
    const now = Date.parse('2026-11-21T03:00:00.123Z');
    const day = 86_400_000;
    const times = { ...EVENT_TIME_RANGE, max: Date.UTC(2096, 0, 1), why: 'storage ends there', maxAheadMs: day, aheadWhy: 'too far ahead' };
    expect(timesAsOf(times, now)).toEqual({ ...EVENT_TIME_RANGE, max: now + day, why: 'too far ahead' });
    const ahead = { ...valid, timestamp: now + day + 1 };
    for (const result of [parseRequestEventValue(ahead, timesAsOf(times, now)), parseRequestEventText(JSON.stringify(ahead), timesAsOf(times, now))]) {
      expect(result.ok).toBe(false);
      if (!result.ok) {
        expect(result.rejection.errors).toEqual([{ path: ['timestamp'], message: `must be a time from 2000-01-01T00:00:00.000Z to ${new Date(now + day).toISOString()}: too far ahead` }]);
      }
    }
    expect(parseRequestEventValue({ ...valid, timestamp: new Date(now + day).toISOString() }, timesAsOf(times, now)).ok).toBe(true);
    // An hour later the same event is taken, and a range not resolved by the caller is resolved against the clock.
    expect(parseRequestEventValue(ahead, timesAsOf(times, now + 3_600_000)).ok).toBe(true);
    expect(parseRequestEventValue({ ...valid, timestamp: Date.now() + 2 * day }, times).ok).toBe(false);
    expect(parseRequestEventValue({ ...valid, timestamp: Date.now() + day / 2 }, times).ok).toBe(true);
    // Near the rule's own end, the rule's end and its reason stand.
    const nearEnd = Date.UTC(2095, 11, 31, 12);
    expect(timesAsOf(times, nearEnd)).toEqual({ ...EVENT_TIME_RANGE, max: Date.UTC(2096, 0, 1), why: 'storage ends there' });
  });

  it('names an out-of-range time with the other problems, and a malformed one once', () => {
    const fields = (value: unknown) => rejectionOf(value).errors.map((error) => error.path[0]);
    expect(fields({ ...valid, ip: 'example.com', timestamp: '2150-01-01T00:00:00.000Z' })).toEqual(['ip', 'timestamp']);
    expect(fields({ ...valid, ip: 'example.com', timestamp: '1500-01-01 00:00:00Z' })).toEqual(['timestamp', 'ip']);
  });

  it('lists every missing required field at once', () => {
    const rejection = rejectionOf({});
    const fields = rejection.errors.map((error) => error.path[0]);
    expect(fields).toEqual(
      expect.arrayContaining(['eventId', 'timestamp', 'merchantId', 'plan', 'apiKeyId', 'environment', 'ip', 'userAgent', 'method', 'path', 'status', 'responseTimeMs']),
    );
  });

  it('truncates a long user agent instead of rejecting the event', () => {
    const result = parseRequestEventValue({ ...valid, userAgent: 'a'.repeat(5000) });
    expect(result.ok && result.event.userAgent.length).toBe(MAX_USER_AGENT_LENGTH);
  });

  it('cuts a user agent where the cut leaves no secret-looking token and no half of a character', () => {
    const userAgentOf = (value: object) => {
      const result = parseRequestEventValue(value);
      return result.ok ? result.event.userAgent : `rejected: ${result.rejection.reason}`;
    };
    // The Slovak locale of an in-app browser, cut to `sk_S`, which would read as a secret.
    const head = `Mozilla/5.0 (iPhone) ${'x'.repeat(MAX_USER_AGENT_LENGTH - 4 - 27)} FBLC/`;
    expect(head).toHaveLength(MAX_USER_AGENT_LENGTH - 4);
    const cut = userAgentOf({ ...valid, userAgent: `${head}sk_SK;FBAV/400` });
    expect(cut).toBe(head);
    // What is stored (or published to the topic) reads back as the same event.
    const again = parseRequestEventText(JSON.stringify({ ...valid, userAgent: cut }));
    expect(again.ok && again.event.userAgent).toBe(cut);
    // An emoji across the limit goes whole, not its first half.
    const emoji = `${'a'.repeat(MAX_USER_AGENT_LENGTH - 1)}\u{1F600}tail`;
    expect(userAgentOf({ ...valid, userAgent: emoji })).toBe('a'.repeat(MAX_USER_AGENT_LENGTH - 1));
    // An ordinary cut is left as it is, inside its token.
    expect(userAgentOf({ ...valid, userAgent: `${head}FBAV/400` })).toBe(`${head}FBAV`);
  });

  it('measures an event in UTF-8 bytes, in raw text and as an item of a JSON array', () => {
    // 30,000 three-byte characters: under the limit in UTF-16 units, 90 kB in UTF-8.
    const wide = { ...valid, path: `/v1/${'\u20AC'.repeat(30_000)}` };
    expect(parseRequestEventText(JSON.stringify(wide))).toMatchObject({ ok: false, rejection: { reason: 'too_large' } });
    expect(parseRequestEventValue(wide)).toMatchObject({ ok: false, rejection: { reason: 'too_large' } });
    // Too large as an item of an array too, which was never checked for size.
    expect(parseRequestEventValue({ ...valid, padding: 'x'.repeat(70_000) })).toMatchObject({ ok: false, rejection: { reason: 'too_large' } });
    // 20,000 of them (60 kB) are within it: the path is then refused by its own rule, not for size.
    const narrow = { ...valid, path: `/v1/${'\u20AC'.repeat(20_000)}` };
    expect(parseRequestEventText(JSON.stringify(narrow))).toMatchObject({ ok: false, rejection: { reason: 'validation_failed' } });
  });

  it.each([
    ['not json', 'invalid_json'],
    ['[1,2]', 'not_an_object'],
    ['"text"', 'not_an_object'],
    ['null', 'not_an_object'],
    ['', 'empty'],
    [JSON.stringify({ ...valid, userAgent: 'x'.repeat(70_000) }), 'too_large'],
  ])('rejects raw text %#: %s', (text, reason) => {
    const result = parseRequestEventText(text);
    expect(result.ok).toBe(false);
    if (!result.ok) expect(result.rejection.reason).toBe(reason);
  });

  it('rejects an event that carries a key secret, and never repeats the secret', () => {
    const leaked = { ...valid, apiKeyId: 'svc_live_pk_abc.sk_live_0123456789abcdef' };
    for (const result of [parseRequestEventText(JSON.stringify(leaked)), parseRequestEventValue(leaked)]) {
      expect(result.ok).toBe(false);
      if (result.ok) continue;
      expect(result.rejection.reason).toBe('secret_in_event');
      expect(JSON.stringify(result.rejection)).not.toContain('0123456789abcdef');
    }
  });

  it.each([
    ['userAgent', 'sk_live_x'],
    ['userAgent', 'curl/8.5 sk_a1'],
    ['path', '/v1/keys/sk_live_x'],
    ['path', '/v1/cb?next=%2Fhook%3Fkey%3Dsk_live_0123456789abcdef'],
    ['path', '/v1/keys/sk%5Flive_x'],
    ['userAgent', 'agent\nsk_live_x'],
    // The `s` or the `k` percent-escaped, in either case of hex (what an over-eager URL encoder writes).
    ['path', '/v1/keys/%73k_live_4eC39HqLyjWDarjtT1zdp7dc'],
    ['path', '/v1/keys/s%6B_live_4eC39HqLyjWDarjtT1zdp7dc'],
    ['path', '/v1/keys/s%6b_live_4eC39HqLyjWDarjtT1zdp7dc'],
    ['userAgent', 'curl/8.5 %73%6b%5flive_x'],
  ])('rejects a short or embedded secret in the %s (%j), from Kafka and over HTTP', (field, value) => {
    const event = { ...valid, [field]: value };
    for (const result of [parseRequestEventText(JSON.stringify(event)), parseRequestEventValue(event)]) {
      expect(result.ok).toBe(false);
      if (!result.ok) expect(result.rejection.reason).toBe('secret_in_event');
    }
  });

  it('keeps, for detection, the event with a secret redacted from what the caller sent (user agent, path), never one from an identity field', () => {
    const judged = (event: Record<string, unknown>, text = JSON.stringify(event)) =>
      [parseRequestEventText(text), parseRequestEventValue(event)].map((result) => (result.ok ? 'accepted' : { reason: result.rejection.reason, redactedEvent: result.rejection.redactedEvent }));
    // Anyone may send `sk_1` in a user agent: rejected (the contract), yet still judged.
    for (const result of judged({ ...valid, userAgent: 'sqlmap/1.8.2#stable (https://sqlmap.org) sk_1' })) {
      expect(result).toMatchObject({ reason: 'secret_in_event', redactedEvent: { eventId: valid.eventId, apiKeyId: valid.apiKeyId, userAgent: 'sqlmap/1.8.2#stable (https://sqlmap.org) sk_[REDACTED]' } });
    }
    const escaped = { ...valid, path: '/v1/verify/sessions?key=sk_live_0123456789abcdef' };
    for (const result of judged(escaped, JSON.stringify(escaped).replace('sk_live', 'sk\\u005flive'))) {
      expect(result).toMatchObject({ reason: 'secret_in_event', redactedEvent: { path: '/v1/verify/sessions?key=sk_[REDACTED]' } });
      expect(JSON.stringify(result)).not.toContain('0123456789abcdef');
    }
    // A path padded with secrets is cut to its bound once they are redacted, still judged; an escape
    // written out in a user agent (six characters: `\\u0073`) is redacted as the check reads it.
    for (const result of judged({ ...valid, path: `/v1/x?${'&sk_1'.repeat(150)}` })) expect(result).toMatchObject({ redactedEvent: { path: expect.stringMatching(/^\/v1\/x\?&sk_\[REDACTED\]/) } });
    for (const result of judged({ ...valid, userAgent: 'x\\u0073k_live_ABCDEF123456 sk_1' })) {
      expect(result).toMatchObject({ reason: 'secret_in_event', redactedEvent: { userAgent: 'xsk_[REDACTED] sk_[REDACTED]' } });
    }
    // A cut that leaves `sk_S` of the locale `sk_SK` at the end: the path goes whole, the event is still judged (review round 44: it was dropped).
    const padding = 'sk_1.'.repeat(100);
    const cutInLocale = `/v1/x?a=${padding}${'a'.repeat(2048 - '/v1/x?a='.length - 14 * 100 - 5)}-sk_SK/`;
    for (const result of judged({ ...valid, userAgent: 'sqlmap/1.7.2#stable (https://sqlmap.org)', path: cutInLocale })) {
      expect(result).toMatchObject({ reason: 'secret_in_event', redactedEvent: { path: '[REDACTED]', userAgent: 'sqlmap/1.7.2#stable (https://sqlmap.org)' } });
    }
    // A secret in an id, or an event invalid beside its secret: nothing to judge.
    for (const event of [
      { ...valid, apiKeyId: 'svc_live_pk_abc.sk_live_0123456789abcdef' },
      { ...valid, eventId: 'evt sk_live_0123456789abcdef' },
      { ...valid, merchantId: 'm sk_live_0123456789abcdef' },
      { ...valid, userAgent: 'sk_1', status: 'ok' },
    ]) {
      for (const result of judged(event)) expect(result).toEqual({ reason: 'secret_in_event', redactedEvent: undefined });
    }
  });

  it('accepts benign look-alikes: words ending in "sk", and the Slovak locale of in-app browsers', () => {
    const event = { ...valid, path: '/v1/task_list', userAgent: 'Mozilla/5.0 (iPhone) [FBAN/FBIOS;FBLC/sk_SK;FBOP/5]' };
    expect(parseRequestEventText(JSON.stringify(event)).ok).toBe(true);
    expect(parseRequestEventValue(event).ok).toBe(true);
  });

  it.each([
    ['path', '/v1/disk_usage?metric=risk_score'],
    ['path', '/v1/ta%73k_list'],
    ['path', '/v1/cb?next=%2Fv1%2Ftask_list&lang=sk_SK%3B'],
    ['userAgent', 'Desk_App/2.1 (Windows NT 10.0) Kiosk_Mode'],
    ['eventId', 'evt_task_1'],
  ])('accepts an escaped or plain look-alike in the %s (%j), from Kafka and over HTTP', (field, value) => {
    const event = { ...valid, [field]: value };
    expect(parseRequestEventText(JSON.stringify(event)).ok).toBe(true);
    expect(parseRequestEventValue(event).ok).toBe(true);
  });

  it('redacts a percent-escaped secret in the eventId it reports', () => {
    const event = { ...valid, eventId: 'evt_%73k_live_0123456789abcdef', path: '/v1/keys/s%6B_live_0123456789abcdef' };
    for (const result of [parseRequestEventText(JSON.stringify(event)), parseRequestEventValue(event)]) {
      expect(result).toMatchObject({ ok: false, rejection: { reason: 'secret_in_event', eventId: 'evt_sk_[REDACTED]' } });
      expect(JSON.stringify(result)).not.toContain('0123456789abcdef');
    }
  });

  it('redacts a secret that the reported eventId\'s cut (128 characters) would split, leaving no head of it', () => {
    for (const secret of ['sk_ABcdEFgh1234567890', '%73k_LiveABCDEFGH12345678']) {
      const event = { ...valid, eventId: `${'a'.repeat(122)} ${secret}` };
      for (const result of [parseRequestEventText(JSON.stringify(event)), parseRequestEventValue(event)]) {
        expect(result).toMatchObject({ ok: false, rejection: { reason: 'secret_in_event' } });
        const reported = !result.ok ? result.rejection.eventId! : '';
        expect(reported.startsWith(`${'a'.repeat(122)} sk_[REDACTED]`.slice(0, 128))).toBe(true);
        expect(reported).not.toMatch(/sk_[A-Z]|%73k_L/);
      }
    }
  });

  it('dead-letters a value that is not JSON without the secret glued to a JSON escape in it', () => {
    const text = '{"eventId":"evt_1","userAgent":"agent\\nsk_live_0123456789abcdef", truncated';
    const result = parseRequestEventText(text);
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.rejection.reason).toBe('invalid_json');
    const deadLetter = toDeadLetter(result.rejection, text, { topic: 't', partition: 0, offset: '1' });
    expect(deadLetter.payload).toBe('{"eventId":"evt_1","userAgent":"agent\\nsk_[REDACTED]", truncated');
  });

  it('finds a secret hidden by a JSON escape, and its dead letter does not carry it', () => {
    const text = JSON.stringify({ ...valid, userAgent: 'sk_live_0123456789abcdef' }).replace('sk_live', 'sk\\u005flive');
    expect(text).toContain('sk\\u005flive_0123456789abcdef');
    const result = parseRequestEventText(text);
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.rejection.reason).toBe('secret_in_event');
    const deadLetter = toDeadLetter(result.rejection, text, { topic: 't', partition: 0, offset: '1' });
    expect(JSON.stringify(deadLetter)).not.toContain('0123456789abcdef');
    expect(deadLetter.payload).toContain('"eventId":"evt_1"'); // the rest of the event is kept
  });

  it('dead-letters a message with a plain secret and one a JSON escape hides, carrying neither', () => {
    const event = { ...valid, path: '/v1/keys/sk_live_plain0123', userAgent: 'HIDDEN python-requests/2.32.3' };
    const text = JSON.stringify(event).replace('HIDDEN', '\\u0073k_live_hidden456789');
    const result = parseRequestEventText(text);
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.rejection.reason).toBe('secret_in_event');
    // The payload is the event with its escapes resolved, then redacted: what a reader would decode.
    expect(result.rejection.redactedPayload).toBeDefined();
    const deadLetter = toDeadLetter(result.rejection, text, { topic: 't', partition: 0, offset: '1' });
    expect(JSON.parse(deadLetter.payload)).toMatchObject({ eventId: 'evt_1', path: '/v1/keys/sk_[REDACTED]', userAgent: 'sk_[REDACTED] python-requests/2.32.3' });
    expect(JSON.stringify(deadLetter)).not.toMatch(/plain0123|hidden456789/);
  });

  it.each([
    ['a JSON escape of "s"', '\\u0073k_live_hidden456789'],
    ['a JSON escape of "k"', 's\\u006B_live_hidden456789'],
    ['a URL escape of "s"', '%73k_live_hidden456789'],
    ['a URL escape written with JSON escapes', '\\u002573k_live_hidden456789'],
  ])('dead-letters a message that is not JSON with a secret behind %s, redacted whole', (_name, secret) => {
    const text = `{"eventId":"evt_1","userAgent":"${secret}", "path":"/v1/keys/sk_live_plain0123", truncated`;
    const result = parseRequestEventText(text);
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.rejection.reason).toBe('invalid_json');
    const deadLetter = toDeadLetter(result.rejection, text, { topic: 't', partition: 0, offset: '1' });
    expect(deadLetter.payload).toBe('{"eventId":"evt_1","userAgent":"sk_[REDACTED]", "path":"/v1/keys/sk_[REDACTED]", truncated');
  });

  it('does not quote the input in a JSON syntax error (the excerpt may be the tail of a secret)', () => {
    const secret = 'sk_live_0123456789ABCDEFGHIJKLMNOPQRSTUV';
    for (const text of [`["${secret}",]`, `{"userAgent":"${secret}" "x":1}`, `{"a":"${secret}"}}`]) {
      const result = parseRequestEventText(text);
      expect(result.ok).toBe(false);
      if (result.ok) continue;
      expect(result.rejection.reason).toBe('invalid_json');
      expect(result.rejection.errors[0]!.message).toMatch(/JSON/);
      expect(JSON.stringify(result.rejection)).not.toMatch(/RSTUV|0123456789/);
    }
  });

  it('refuses a value nested too deeply to serialize, without throwing', () => {
    let deep: unknown = 'x';
    for (let i = 0; i < 200_000; i++) deep = [deep];
    const result = parseRequestEventValue({ ...valid, userAgent: deep });
    expect(result.ok).toBe(false);
    if (!result.ok) expect(result.rejection.reason).toBe('validation_failed');
  });
});

describe('the hand-checked common case', () => {
  const ODD_VALUES: unknown[] = [
    '', 'x', 'x'.repeat(128), 'x'.repeat(129), 'x'.repeat(2048), 'x'.repeat(2049), 0, -1, 1, 1.5, 2 ** 53, -0, null, true, [], {}, 'live', 'test', 'prod',
    'business', 'gold', '2026-11-21T03:00:00Z', '2026-11-21T03:00:00.123456Z', '2026-11-21T04:00:00+01:00', '2026-02-30T00:00:00Z', '2026-11-21 03:00:00Z',
    '2026-11-21T03:00:00', '2026-11-21T03:00:00.123Z', '2024-02-29T10:00:00.000Z', '2026-02-29T10:00:00.000Z', '2000-02-29T00:00:00.000Z',
    '2100-02-29T00:00:00.000Z', '2026-04-31T00:00:00.000Z', '2026-04-30T23:59:59.999Z', '2026-12-31T23:59:59.999Z', '2026-13-01T00:00:00.000Z',
    '2026-00-10T00:00:00.000Z', '2026-01-00T00:00:00.000Z', '2026-11-21T24:00:00.000Z', '2026-11-21T23:60:00.000Z', '2026-11-21T23:59:60.000Z',
    '0999-01-01T00:00:00.000Z', '1000-01-01T00:00:00.000Z', '2026-1a-21T03:00:00.000Z', '2026-11-21T03:00:00.000z', '2026-11-21T03:00:00.00Z',
    '2026-11-21T03:00:00.0000Z', '+2026-11-21T03:00:00.000Z', '2026-11-21T03:00:00,000Z', Date.UTC(2000, 0, 1), Date.UTC(2000, 0, 1) - 1, Date.UTC(2100, 0, 1), Date.UTC(2100, 0, 1) + 1, '1.2.3.4', '01.2.3.4', '256.1.1.1',
    '2001:db8::1', '::ffff:1.2.3.4', 'GET', 'get', 'GET /', 'X'.repeat(16), 'X'.repeat(17), 'de', 'DE', 'DEU', 'd1', 99, 100, 599, 600, 86_400_000, 86_400_001,
    100_000_000, 100_000_001, 'sk_live_0123456789abcdef', '\u00e9', '12', '201', Date.UTC(2026, 0, 1) + 0.5, 'x\uD800', '\uDC00x', '\uFFFD', 'x\u{1F600}',
  ];
  const FIELDS = [...Object.keys(valid), 'rateLimitPerMinute', 'country'];

  // Everything it accepts, the schema accepts too, with the same normalized event; the rest goes to the schema.
  it('accepts only what the schema accepts, with the schema’s output', () => {
    let accepted = 0;
    for (const field of FIELDS) {
      for (const odd of ODD_VALUES) {
        const value = { ...valid, country: 'de', rateLimitPerMinute: 600, extra: 'dropped', [field]: odd };
        const common = commonEvent(value);
        if (!common) continue;
        accepted++;
        expect(schemaEvent(value), `${field} = ${JSON.stringify(odd)}`).toStrictEqual({ ok: true, event: common });
      }
    }
    expect(accepted).toBeGreaterThan(60);
  });

  it('takes ordinary events, with and without the optional fields', () => {
    expect(commonEvent(valid)).toBeDefined();
    expect(commonEvent({ ...valid, timestamp: Date.UTC(2026, 0, 1), country: 'US', rateLimitPerMinute: 60 })).toBeDefined();
  });

  it('reads a null optional field as an absent one, as the schema does', () => {
    const withNulls = { ...valid, country: null, rateLimitPerMinute: null };
    const common = commonEvent(withNulls);
    expect(common).toBeDefined();
    expect(common).not.toHaveProperty('country');
    expect(common).not.toHaveProperty('rateLimitPerMinute');
    expect(schemaEvent(withNulls)).toStrictEqual({ ok: true, event: common });
    // The schema's way on its own (an IPv6 address is left to it), and through the text parser.
    const ipv6 = { ...withNulls, ip: '2001:db8::1' };
    expect(commonEvent(ipv6)).toBeUndefined();
    const viaSchema = schemaEvent(ipv6);
    expect(viaSchema.ok && viaSchema.event).toStrictEqual({ ...common, ip: '2001:db8::1' });
    const parsed = parseRequestEventText(JSON.stringify(ipv6));
    expect(parsed.ok && parsed.event).toStrictEqual({ ...common, ip: '2001:db8::1' });
  });
});
