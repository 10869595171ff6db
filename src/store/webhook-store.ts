/**
 * Webhook endpoints, messages, attempts and breakers in ClickHouse (migration 005). Contract:
 * endpoints, messages and breakers are written whole with a higher version and read FINAL; every
 * read an admin can cause is scoped by merchant; a signing secret is written only as row data
 * (never in query text, which a server may log) and is blanked when the endpoint is removed.
 */
import { z } from 'zod';
import type { ClickHouse } from './clickhouse.ts';
import { toClickHouseTime } from './event-store.ts';
import type { Tables } from './tables.ts';

export const MESSAGE_STATUSES = ['pending', 'delivered', 'failed', 'cancelled'] as const;
export type MessageStatus = (typeof MESSAGE_STATUSES)[number];
export const DESTINATIONS = ['oncall', 'merchant'] as const;
export type Destination = (typeof DESTINATIONS)[number];

export interface WebhookEndpoint {
  merchantId: string;
  endpointId: string;
  url: string;
  /** Signing secret: for signing only, never logged or returned after registration. */
  secret: string;
  createdBy: string;
  createdAt: number;
  updatedAt: number;
}

export interface WebhookMessage {
  /** svc-id. */
  id: string;
  alertId: string;
  merchantId: string;
  destination: Destination;
  endpointId: string;
  target: string;
  body: string;
  status: MessageStatus;
  attempts: number;
  nextAttemptAt: number;
  lastOutcome: string;
  lastError: string;
  createdAt: number;
  updatedAt: number;
}

export interface AttemptRecord {
  messageId: string;
  merchantId: string;
  attempt: number;
  at: number;
  outcome: string;
  statusCode?: number;
  error: string;
  durationMs: number;
}

export interface BreakerState {
  endpointId: string;
  consecutiveFailures: number;
  /** Epoch ms; 0 when not paused. */
  pausedUntil: number;
  updatedAt: number;
}

/** A message as the delivery log shows it: no body, with its attempts. */
export type DeliveryRecord = Omit<WebhookMessage, 'body'> & { attemptLog: AttemptRecord[] };

const time = z.string().transform((text) => Date.parse(`${text.replace(' ', 'T')}Z`));

const endpointRow = z.object({
  merchant_id: z.string(),
  endpoint_id: z.string(),
  url: z.string(),
  secret: z.string(),
  created_by: z.string(),
  created_at: time,
  updated_at: time,
});

const messageColumns = {
  id: z.string(),
  alert_id: z.string(),
  merchant_id: z.string(),
  destination: z.enum(DESTINATIONS),
  endpoint_id: z.string(),
  target: z.string(),
  status: z.enum(MESSAGE_STATUSES),
  attempts: z.coerce.number(),
  next_attempt_at: time,
  last_outcome: z.string(),
  last_error: z.string(),
  created_at: time,
  updated_at: time,
};
const messageRow = z.object({ ...messageColumns, body: z.string() });
const deliveryRow = z.object(messageColumns);

const attemptRow = z.object({
  message_id: z.string(),
  merchant_id: z.string(),
  attempt: z.coerce.number(),
  at: time,
  outcome: z.string(),
  status_code: z.coerce.number().nullable(),
  error: z.string(),
  duration_ms: z.coerce.number(),
});

const breakerRow = z.object({
  endpoint_id: z.string(),
  consecutive_failures: z.coerce.number(),
  paused_until: time,
  updated_at: time,
});

const ENDPOINT_COLUMNS = ['merchant_id', 'endpoint_id', 'url', 'secret', 'created_by', 'created_at', 'updated_at', 'deleted', 'version'] as const;
const MESSAGE_COLUMNS = [
  'id', 'alert_id', 'merchant_id', 'destination', 'endpoint_id', 'target', 'body', 'status', 'attempts', 'next_attempt_at',
  'last_outcome', 'last_error', 'created_at', 'updated_at', 'version',
] as const;
const ATTEMPT_COLUMNS = ['message_id', 'merchant_id', 'attempt', 'at', 'outcome', 'status_code', 'error', 'duration_ms'] as const;
const BREAKER_COLUMNS = ['endpoint_id', 'consecutive_failures', 'paused_until', 'updated_at', 'version'] as const;

export interface DeliveryQuery {
  /** Undefined: every merchant (operators only). */
  merchantId?: string;
  /** Undefined: both destinations (operators only). */
  destination?: Destination;
  status?: MessageStatus;
  limit: number;
  /** Keyset: messages created before this one (created_at, id), newest first. */
  after?: { createdAt: number; id: string };
}

export class WebhookStore {
  private version = Date.now() * 1000;

  constructor(
    private readonly db: ClickHouse,
    private readonly tables: Tables,
  ) {}

  // Endpoints ---------------------------------------------------------------------------------

  async putEndpoint(endpoint: WebhookEndpoint): Promise<void> {
    await this.insert(this.tables.webhookEndpoints, ENDPOINT_COLUMNS, [this.endpointLine(endpoint, false)]);
  }

  /** Removes a merchant's endpoint (blanking its secret); false when it had none. */
  async removeEndpoint(merchantId: string, at: number): Promise<boolean> {
    const current = await this.endpoint(merchantId);
    if (!current) return false;
    await this.insert(this.tables.webhookEndpoints, ENDPOINT_COLUMNS, [
      this.endpointLine({ ...current, secret: '', updatedAt: at }, true),
    ]);
    return true;
  }

  async endpoint(merchantId: string): Promise<WebhookEndpoint | undefined> {
    return (await this.endpoints([merchantId])).get(merchantId);
  }

  /** The registered endpoints of these merchants, by merchant. */
  async endpoints(merchantIds: readonly string[]): Promise<Map<string, WebhookEndpoint>> {
    if (merchantIds.length === 0) return new Map();
    const rows = await this.db.queryRows(
      `SELECT merchant_id, endpoint_id, url, secret, created_by, created_at, updated_at
         FROM ${this.tables.webhookEndpoints} FINAL
        WHERE merchant_id IN {merchantIds:Array(String)} AND deleted = 0`,
      { merchantIds: [...new Set(merchantIds)] },
    );
    const endpoints = rows.map((row) => {
      const parsed = endpointRow.parse(row);
      return {
        merchantId: parsed.merchant_id,
        endpointId: parsed.endpoint_id,
        url: parsed.url,
        secret: parsed.secret,
        createdBy: parsed.created_by,
        createdAt: parsed.created_at,
        updatedAt: parsed.updated_at,
      };
    });
    return new Map(endpoints.map((endpoint) => [endpoint.merchantId, endpoint]));
  }

  // Messages and attempts ---------------------------------------------------------------------

  async saveMessages(messages: readonly WebhookMessage[]): Promise<void> {
    await this.insert(
      this.tables.webhookMessages,
      MESSAGE_COLUMNS,
      messages.map((message) =>
        JSON.stringify({
          id: message.id,
          alert_id: message.alertId,
          merchant_id: message.merchantId,
          destination: message.destination,
          endpoint_id: message.endpointId,
          target: message.target,
          body: message.body,
          status: message.status,
          attempts: message.attempts,
          next_attempt_at: toClickHouseTime(message.nextAttemptAt),
          last_outcome: message.lastOutcome,
          last_error: message.lastError,
          created_at: toClickHouseTime(message.createdAt),
          updated_at: toClickHouseTime(message.updatedAt),
          version: this.nextVersion(),
        }),
      ),
    );
  }

  /**
   * Pending messages in the order they are due (due or not: the caller learns when the next one is),
   * leaving out the ones it is already working on. One page, bodies included.
   */
  async pendingMessages(limit: number, exclude: readonly string[]): Promise<WebhookMessage[]> {
    const rows = await this.db.queryRows(
      `SELECT id, alert_id, merchant_id, destination, endpoint_id, target, body, status,
              attempts, next_attempt_at, last_outcome, last_error, created_at, updated_at
         FROM ${this.tables.webhookMessages} FINAL
        WHERE status = 'pending' AND id NOT IN {exclude:Array(UUID)}
        ORDER BY next_attempt_at, id
        LIMIT {limit:UInt32}`,
      { exclude: [...exclude], limit },
    );
    return rows.map((row) => toMessage(messageRow.parse(row)));
  }

  async insertAttempts(attempts: readonly AttemptRecord[]): Promise<void> {
    await this.insert(
      this.tables.webhookAttempts,
      ATTEMPT_COLUMNS,
      attempts.map((attempt) =>
        JSON.stringify({
          message_id: attempt.messageId,
          merchant_id: attempt.merchantId,
          attempt: attempt.attempt,
          at: toClickHouseTime(attempt.at),
          outcome: attempt.outcome,
          status_code: attempt.statusCode ?? null,
          error: attempt.error,
          duration_ms: Math.max(0, Math.round(attempt.durationMs)),
        }),
      ),
    );
  }

  /** The delivery log: messages newest first, each with its attempts. */
  async deliveries(query: DeliveryQuery): Promise<DeliveryRecord[]> {
    const rows = await this.db.queryRows(
      `SELECT id, alert_id, merchant_id, destination, endpoint_id, target, status,
              attempts, next_attempt_at, last_outcome, last_error, created_at, updated_at
         FROM ${this.tables.webhookMessages} FINAL
        WHERE ({merchantId:String} = '' OR merchant_id = {merchantId:String})
          AND ({destination:String} = '' OR destination = {destination:String})
          AND ({status:String} = '' OR status = {status:String})
          AND ({afterId:String} = '' OR (created_at, id) < ({afterAt:DateTime64(3)}, toUUIDOrZero({afterId:String})))
        ORDER BY created_at DESC, id DESC
        LIMIT {limit:UInt32}`,
      {
        merchantId: query.merchantId ?? '',
        destination: query.destination ?? '',
        status: query.status ?? '',
        afterId: query.after?.id ?? '',
        afterAt: toClickHouseTime(query.after?.createdAt ?? 0),
        limit: query.limit,
      },
    );
    const messages = rows.map((row) => toMessage({ ...deliveryRow.parse(row), body: '' }));
    if (messages.length === 0) return [];
    const attemptRows = await this.db.queryRows(
      `SELECT message_id, merchant_id, attempt, at, outcome, status_code, error, duration_ms
         FROM ${this.tables.webhookAttempts}
        WHERE merchant_id IN {merchantIds:Array(String)} AND message_id IN {ids:Array(UUID)}
        ORDER BY message_id, attempt, at`,
      { merchantIds: [...new Set(messages.map((message) => message.merchantId))], ids: messages.map((message) => message.id) },
    );
    const byMessage = new Map<string, AttemptRecord[]>();
    for (const row of attemptRows) {
      const parsed = attemptRow.parse(row);
      const list = byMessage.get(parsed.message_id) ?? [];
      list.push({
        messageId: parsed.message_id,
        merchantId: parsed.merchant_id,
        attempt: parsed.attempt,
        at: parsed.at,
        outcome: parsed.outcome,
        ...(parsed.status_code !== null ? { statusCode: parsed.status_code } : {}),
        error: parsed.error,
        durationMs: parsed.duration_ms,
      });
      byMessage.set(parsed.message_id, list);
    }
    return messages.map(({ body: _body, ...message }) => ({ ...message, attemptLog: byMessage.get(message.id) ?? [] }));
  }

  // Breakers ----------------------------------------------------------------------------------

  async loadBreakers(): Promise<BreakerState[]> {
    const rows = await this.db.queryRows(
      `SELECT endpoint_id, consecutive_failures, paused_until, updated_at FROM ${this.tables.webhookBreakers} FINAL`,
    );
    return rows.map((row) => {
      const parsed = breakerRow.parse(row);
      return {
        endpointId: parsed.endpoint_id,
        consecutiveFailures: parsed.consecutive_failures,
        pausedUntil: parsed.paused_until,
        updatedAt: parsed.updated_at,
      };
    });
  }

  async saveBreakers(states: readonly BreakerState[]): Promise<void> {
    await this.insert(
      this.tables.webhookBreakers,
      BREAKER_COLUMNS,
      states.map((state) =>
        JSON.stringify({
          endpoint_id: state.endpointId,
          consecutive_failures: state.consecutiveFailures,
          paused_until: toClickHouseTime(state.pausedUntil),
          updated_at: toClickHouseTime(state.updatedAt),
          version: this.nextVersion(),
        }),
      ),
    );
  }

  // -------------------------------------------------------------------------------------------

  private endpointLine(endpoint: WebhookEndpoint, deleted: boolean): string {
    return JSON.stringify({
      merchant_id: endpoint.merchantId,
      endpoint_id: endpoint.endpointId,
      url: endpoint.url,
      secret: endpoint.secret,
      created_by: endpoint.createdBy,
      created_at: toClickHouseTime(endpoint.createdAt),
      updated_at: toClickHouseTime(endpoint.updatedAt),
      deleted: deleted ? 1 : 0,
      version: this.nextVersion(),
    });
  }

  private async insert(table: string, columns: readonly string[], lines: readonly string[]): Promise<void> {
    if (lines.length === 0) return;
    await this.db.insertJsonEachRow(table, columns, Buffer.from(`${lines.join('\n')}\n`));
  }

  /** Monotonic across writes in this process; wall-clock based across restarts. */
  private nextVersion(): number {
    return (this.version = Math.max(this.version + 1, Date.now() * 1000));
  }
}

function toMessage(row: z.output<typeof messageRow>): WebhookMessage {
  return {
    id: row.id,
    alertId: row.alert_id,
    merchantId: row.merchant_id,
    destination: row.destination,
    endpointId: row.endpoint_id,
    target: row.target,
    body: row.body,
    status: row.status,
    attempts: row.attempts,
    nextAttemptAt: row.next_attempt_at,
    lastOutcome: row.last_outcome,
    lastError: row.last_error,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
  };
}
