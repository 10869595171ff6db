import { describe, expect, it } from 'vitest';
import { parseRequestEventValue } from '../events/request-event.ts';
import { REQUEST_EVENT_COLUMNS, serializeEventRow, toClickHouseTime } from './event-store.ts';

describe('serializeEventRow', () => {
  it('writes every column, in order, as valid JSON, quoting free text safely', () => {
    const parsed = parseRequestEventValue({
      eventId: 'evt "quoted" \\ \u2028 é',
      timestamp: '2026-11-21T03:04:05.678Z',
      merchantId: 'm_"1"',
      plan: 'pro',
      apiKeyId: 'pk_live_\n',
      environment: 'test',
      ip: '2001:db8::1',
      userAgent: 'Mozilla "x" \t',
      method: 'get',
      path: '/v1/verify/sessions/:id?q="a"',
      status: 404,
      responseTimeMs: 1.5,
    });
    if (!parsed.ok) throw new Error('fixture must be valid');
    const row = JSON.parse(serializeEventRow(parsed.event, { topic: 't', partition: 3, offset: 42 }));
    expect(Object.keys(row)).toEqual([...REQUEST_EVENT_COLUMNS]);
    expect(row).toMatchObject({
      event_id: 'evt "quoted" \\ \u2028 é',
      ts: '2026-11-21 03:04:05.678',
      merchant_id: 'm_"1"',
      api_key_id: 'pk_live_\n',
      user_agent: 'Mozilla "x" \t',
      method: 'GET',
      path: '/v1/verify/sessions/:id?q="a"',
      status: 404,
      response_time_ms: 1.5,
      rate_limit_per_minute: 60,
      country: '',
      source_partition: 3,
      source_offset: 42,
    });
  });

  it('formats ClickHouse time in UTC with milliseconds', () => {
    expect(toClickHouseTime(Date.UTC(2026, 0, 2, 3, 4, 5, 6))).toBe('2026-01-02 03:04:05.006');
    expect(toClickHouseTime(Date.UTC(2026, 0, 2, 3, 4, 5, 60))).toBe('2026-01-02 03:04:05.060');
    expect(toClickHouseTime(Date.UTC(2026, 0, 2, 3, 4, 6, 999))).toBe('2026-01-02 03:04:06.999');
    expect(toClickHouseTime(Date.UTC(2025, 11, 31, 23, 59, 59, 0))).toBe('2025-12-31 23:59:59.000');
  });
});
