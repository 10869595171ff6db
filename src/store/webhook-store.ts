/**
 * Webhook endpoints, messages (with their attempt log), breakers and replicas' heartbeats in
 * ClickHouse (migrations 005, 006, 011).
 * Contract: every row is written whole with a higher version and read FINAL (a retried write of a
 * new message repeats its first version, so it never undoes a later write; a claim of another
 * replica's message takes the version just above the one read, so it loses to any write made since;
 * a heartbeat is read as its owner's latest); every read an admin can cause is scoped by merchant;
 * a signing secret is written only as row data (never in query text, which a server may log),
 * sealed when a key is configured (secret-box.ts), and blanked when the endpoint is removed.
 */
import { z } from 'zod';
import type { ClickHouse } from './clickhouse.ts';
import { toClickHouseTime } from './event-store.ts';
import type { Tables } from './tables.ts';
import { SecretBox } from '../webhooks/secret-box.ts';

export const MESSAGE_STATUSES = ['pending', 'delivered', 'failed', 'cancelled'] as const;
export type MessageStatus = (typeof MESSAGE_STATUSES)[number];
export const DESTINATIONS = ['oncall', 'merchant'] as const;
export type Destination = (typeof DESTINATIONS)[number];

export interface WebhookEndpoint {
  merchantId: string;
  endpointId: string;
  url: string;
  /**
   * Signing secret: for signing only, never logged or returned after registration. Undefined when
   * the stored value does not open with WEBHOOK_SECRET_KEY (nor WEBHOOK_SECRET_KEY_PREVIOUS): its
   * deliveries fail until the key is restored or the merchant registers the endpoint again.
   */
  secret: string | undefined;
  /** The admin user who first registered the merchant's endpoint. */
  createdBy: string;
  /** The admin user who last registered it (its URL and secret): createdBy, or who replaced it since. */
  updatedBy: string;
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
  /** The replica that attempts it (WORKER_ID); empty: any replica (messages stored before owners). */
  owner: string;
  attempts: number;
  nextAttemptAt: number;
  lastOutcome: string;
  lastError: string;
  /** Every attempt so far, oldest first. */
  attemptLog: AttemptRecord[];
  createdAt: number;
  updatedAt: number;
}

export interface AttemptRecord {
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

/**
 * A pending message with, for a merchant message, the merchant's endpoint as registered now, when
 * the reading replica may attempt it (`dueAt`: its next attempt for its owner, later for others),
 * and the version of the row read (`storedVersion`, which a claim of it builds on).
 */
export type PendingMessage = WebhookMessage & {
  dueAt: number;
  storedVersion: number;
  endpoint?: Pick<WebhookEndpoint, 'endpointId' | 'url' | 'secret'>;
};

/**
 * What became of a claim (claimMessage), read back: `claimed` (it stands, and the previous owner is
 * still silent), `taken` (a write made since the read it was made from won: the owner's outcome, a
 * cancellation, another replica's claim), `owner_alive` (the previous owner wrote a heartbeat since:
 * it may be attempting the message itself).
 */
export type ClaimVerdict = 'claimed' | 'taken' | 'owner_alive';

/**
 * Who reads pending messages: its own are due on schedule, another replica's only once both its
 * schedule and its owner's last heartbeat are `adoptAfterMs` past (its owner is gone).
 */
export interface PendingReader {
  owner: string;
  adoptAfterMs: number;
}

/** Destinations whose messages a read leaves out: their endpoints have all the attempts in flight they may. */
export interface FullDestinations {
  oncall: boolean;
  /** Every merchant's endpoint together (the slots merchants may take): no merchant message is read. */
  merchants?: boolean;
  merchantIds: readonly string[];
}

/** A message to store; one with a version is written with it (a retried write loses to any write since). */
export type MessageToSave = WebhookMessage & { version?: number };

/** A message as the delivery log shows it: without its body. */
export type DeliveryRecord = Omit<WebhookMessage, 'body'>;

const time = z.string().transform((text) => Date.parse(`${text.replace(' ', 'T')}Z`));

const endpointRow = z.object({
  merchant_id: z.string(),
  endpoint_id: z.string(),
  url: z.string(),
  secret: z.string(),
  created_by: z.string(),
  updated_by: z.string(),
  created_at: time,
  updated_at: time,
});

/** Versions are about 2^51 (microseconds since the epoch): exact as numbers. */
const versionedEndpointRow = endpointRow.extend({ version: z.coerce.number() });

const attemptLog = z.array(
  z.object({
    attempt: z.number(),
    at: z.number(),
    outcome: z.string(),
    statusCode: z.number().optional(),
    error: z.string(),
    durationMs: z.number(),
  }),
);

const messageColumns = {
  id: z.string(),
  alert_id: z.string(),
  merchant_id: z.string(),
  destination: z.enum(DESTINATIONS),
  endpoint_id: z.string(),
  target: z.string(),
  status: z.enum(MESSAGE_STATUSES),
  owner: z.string(),
  attempts: z.coerce.number(),
  next_attempt_at: time,
  last_outcome: z.string(),
  last_error: z.string(),
  attempt_log: z.string().transform((text) => attemptLog.parse(JSON.parse(text))),
  created_at: time,
  updated_at: time,
};
const messageRow = z.object({ ...messageColumns, body: z.string() });
const deliveryRow = z.object(messageColumns);
const pendingRow = messageRow.extend({ version: z.coerce.number(), due_at: time, registered_endpoint_id: z.string(), registered_url: z.string(), registered_secret: z.string(), registered_since: time });

const claimRow = z.object({ owner: z.string(), version: z.coerce.number(), seen_at: time });

const breakerRow = z.object({
  endpoint_id: z.string(),
  consecutive_failures: z.coerce.number(),
  paused_until: time,
  updated_at: time,
});

const ENDPOINT_COLUMNS = ['merchant_id', 'endpoint_id', 'url', 'secret', 'created_by', 'updated_by', 'created_at', 'updated_at', 'deleted', 'version'] as const;
const MESSAGE_COLUMNS = [
  'id', 'alert_id', 'merchant_id', 'destination', 'endpoint_id', 'target', 'body', 'status', 'owner', 'attempts', 'next_attempt_at',
  'last_outcome', 'last_error', 'attempt_log', 'created_at', 'updated_at', 'version',
] as const;
/** The message columns but the body, as reads name them. */
const READ_COLUMNS = MESSAGE_COLUMNS.filter((column) => column !== 'body' && column !== 'version').join(', ');
const BREAKER_COLUMNS = ['endpoint_id', 'consecutive_failures', 'paused_until', 'updated_at', 'version'] as const;
const REPLICA_COLUMNS = ['owner', 'seen_at'] as const;

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

/**
 * How far apart two replicas' clocks may be: a merchant's first endpoint, registered through one
 * replica, may look a little younger than a message another made for it at once. Such a message
 * is not taken for one made before a removal (pendingMessages): cancelling a critical alert's
 * notification would be the worse mistake.
 */
const REPLICA_CLOCK_SKEW_MS = 5_000;

/** Why a merchant's message was cancelled: its endpoint was removed. */
export const ENDPOINT_REMOVED = 'the merchant endpoint was removed';

/** What a sealed secret is bound to: its merchant and endpoint. */
function secretRow(merchantId: string, endpointId: string): string {
  return `${merchantId}\u0000${endpointId}`;
}

export class WebhookStore {
  private version = Date.now() * 1000;

  constructor(
    private readonly db: ClickHouse,
    private readonly tables: Tables,
    /** Seals merchants' signing secrets at rest (stores them as they are without a key). */
    private readonly secrets = new SecretBox(undefined),
  ) {}

  // Endpoints ---------------------------------------------------------------------------------

  async putEndpoint(endpoint: WebhookEndpoint & { secret: string }): Promise<void> {
    try {
      const storedSecret = this.secrets.seal(endpoint.secret, secretRow(endpoint.merchantId, endpoint.endpointId));
      await this.insert(this.tables.webhookEndpoints, ENDPOINT_COLUMNS, [this.endpointLine({ ...endpoint, storedSecret }, false)]);
    } catch (error) {
      // A storage error can quote the rows it was given: it must not carry the secret into a log.
      const message = error instanceof Error ? error.message : String(error);
      throw new Error(`storing a webhook endpoint failed: ${message.replaceAll(endpoint.secret, '[REDACTED]')}`);
    }
  }

  /**
   * Removes a merchant's endpoint (blanking its secret) and cancels the pending messages to it, so
   * the delivery log says so at once; undefined when it had none. An attempt in flight meanwhile
   * still records its outcome, later; a retry it schedules is cancelled when due (pendingMessages
   * finds no endpoint for it). The removed row keeps who removed it (updated_by), for an audit.
   */
  async removeEndpoint(merchantId: string, at: number, by: string): Promise<{ cancelledMessages: number } | undefined> {
    const current = await this.endpoint(merchantId);
    if (!current) return undefined;
    await this.insert(this.tables.webhookEndpoints, ENDPOINT_COLUMNS, [
      this.endpointLine({ ...current, storedSecret: '', updatedBy: by, updatedAt: at }, true),
    ]);
    const rows = await this.db.queryRows(
      `SELECT ${READ_COLUMNS}, body
         FROM ${this.tables.webhookMessages} FINAL
        WHERE merchant_id = {merchantId:String} AND destination = 'merchant' AND status = 'pending'`,
      { merchantId },
    );
    const cancelled = rows.map((row): WebhookMessage => ({
      ...toMessage(messageRow.parse(row)),
      status: 'cancelled',
      lastOutcome: 'cancelled',
      lastError: ENDPOINT_REMOVED,
      updatedAt: at,
    }));
    await this.saveMessages(cancelled);
    return { cancelledMessages: cancelled.length };
  }

  /**
   * After WEBHOOK_SECRET_KEY was set or rotated: stores every secret that opens with a previous key
   * (or was stored before sealing) sealed with the current key, so the previous key can go. Each
   * row is written with its own version + 1, so a merchant's registration made meanwhile (a much
   * higher version) still wins. Secrets that open with no key are counted, not touched.
   */
  async resealSecrets(): Promise<{ resealed: number; unreadable: number }> {
    const rows = await this.db.queryRows(
      `SELECT merchant_id, endpoint_id, url, secret, created_by, updated_by, created_at, updated_at, version
         FROM ${this.tables.webhookEndpoints} FINAL
        WHERE deleted = 0`,
    );
    const lines: string[] = [];
    let unreadable = 0;
    for (const row of rows) {
      const { version, ...parsed } = versionedEndpointRow.parse(row);
      const boundTo = secretRow(parsed.merchant_id, parsed.endpoint_id);
      const storedSecret = this.secrets.reseal(parsed.secret, boundTo);
      if (storedSecret !== undefined) {
        lines.push(this.endpointLine({ ...toEndpoint(parsed), storedSecret }, false, version + 1));
      } else if (this.secrets.open(parsed.secret, boundTo) === undefined) {
        unreadable++;
      }
    }
    await this.insert(this.tables.webhookEndpoints, ENDPOINT_COLUMNS, lines);
    return { resealed: lines.length, unreadable };
  }

  async endpoint(merchantId: string): Promise<WebhookEndpoint | undefined> {
    return (await this.endpoints([merchantId])).get(merchantId);
  }

  /** The registered endpoints of these merchants, by merchant. */
  async endpoints(merchantIds: readonly string[]): Promise<Map<string, WebhookEndpoint>> {
    if (merchantIds.length === 0) return new Map();
    const rows = await this.db.queryRows(
      `SELECT merchant_id, endpoint_id, url, secret, created_by, updated_by, created_at, updated_at
         FROM ${this.tables.webhookEndpoints} FINAL
        WHERE merchant_id IN {merchantIds:Array(String)} AND deleted = 0`,
      { merchantIds: [...new Set(merchantIds)] },
    );
    const endpoints = rows.map((row) => {
      const parsed = endpointRow.parse(row);
      return { ...toEndpoint(parsed), secret: this.secrets.open(parsed.secret, secretRow(parsed.merchant_id, parsed.endpoint_id)) };
    });
    return new Map(endpoints.map((endpoint) => [endpoint.merchantId, endpoint]));
  }

  // Messages --------------------------------------------------------------------------------

  async saveMessages(messages: readonly MessageToSave[]): Promise<void> {
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
          owner: message.owner,
          attempts: message.attempts,
          next_attempt_at: toClickHouseTime(message.nextAttemptAt),
          last_outcome: message.lastOutcome,
          last_error: message.lastError,
          attempt_log: JSON.stringify(message.attemptLog),
          created_at: toClickHouseTime(message.createdAt),
          updated_at: toClickHouseTime(message.updatedAt),
          version: message.version ?? this.nextVersion(),
        }),
      ),
    );
  }

  /**
   * Pending messages in the order the reader may attempt them (due or not: the caller learns when
   * the next one is), leaving out the ones it is already working on and those to full destinations.
   * One page, bodies included, each with its merchant's endpoint as registered now (for merchant
   * messages), unless that was registered after the message was created.
   */
  async pendingMessages(
    limit: number,
    exclude: readonly string[],
    reader: PendingReader,
    full: FullDestinations = { oncall: false, merchantIds: [] },
  ): Promise<PendingMessage[]> {
    // An owner without a heartbeat (one that predates them) reads as silent since the epoch.
    const rows = await this.db.queryRows(
      `SELECT m.*, e.endpoint_id AS registered_endpoint_id, e.url AS registered_url, e.secret AS registered_secret, e.created_at AS registered_since
         FROM (SELECT ${READ_COLUMNS}, body, version,
                      if(owner IN ('', {owner:String}), next_attempt_at,
                         greatest(next_attempt_at, r.seen_at) + toIntervalMillisecond({adoptAfterMs:UInt32})) AS due_at
                 FROM ${this.tables.webhookMessages} FINAL
                 LEFT JOIN (SELECT owner, max(seen_at) AS seen_at FROM ${this.tables.webhookReplicas} GROUP BY owner) AS r USING (owner)
                WHERE status = 'pending' AND id NOT IN {exclude:Array(UUID)}
                  AND NOT (destination = 'oncall' AND {oncallFull:Bool})
                  AND NOT (destination = 'merchant' AND ({merchantsFull:Bool} OR merchant_id IN {fullMerchants:Array(String)}))
                ORDER BY due_at, id
                LIMIT {limit:UInt32}) AS m
         LEFT JOIN (SELECT merchant_id, endpoint_id, url, secret, created_at
                      FROM ${this.tables.webhookEndpoints} FINAL
                     WHERE deleted = 0) AS e ON m.merchant_id = e.merchant_id
        ORDER BY m.due_at, m.id`,
      {
        exclude: [...exclude],
        limit,
        owner: reader.owner,
        adoptAfterMs: reader.adoptAfterMs,
        oncallFull: full.oncall,
        merchantsFull: full.merchants ?? false,
        fullMerchants: [...full.merchantIds],
      },
    );
    return rows.map((row) => {
      const { version, due_at, registered_endpoint_id, registered_url, registered_secret, registered_since, ...message } = pendingRow.parse(row);
      const parsed = { ...toMessage(message), dueAt: due_at, storedVersion: version };
      // A registration made after the message (the endpoint was removed, then registered again; a
      // replacement keeps its createdAt) does not take it: removing the endpoint cancelled it.
      return parsed.destination === 'merchant' && registered_url && registered_since <= parsed.createdAt + REPLICA_CLOCK_SKEW_MS
        ? {
            ...parsed,
            endpoint: {
              endpointId: registered_endpoint_id,
              url: registered_url,
              secret: this.secrets.open(registered_secret, secretRow(parsed.merchantId, registered_endpoint_id)),
            },
          }
        : parsed;
    });
  }

  /**
   * Claims another replica's pending message for `owner` before attempting it: writes it as it was
   * read, but owned by `owner` and due at `leaseUntil` (when `owner` makes it again should it stop
   * before storing the attempt), with the version just above the one read. So the claim wins over
   * the row it was made from, and loses to any write made since (the previous owner's outcome, a
   * cancellation), whatever the replicas' clocks; two replicas' claims of one row tie, and the one
   * inserted last stands. Returns the claim's version, for claimStands.
   */
  async claimMessage(message: PendingMessage, owner: string, leaseUntil: number, at: number): Promise<number> {
    const { dueAt: _dueAt, storedVersion, endpoint: _endpoint, ...row } = message;
    const version = storedVersion + 1;
    await this.saveMessages([{ ...row, owner, nextAttemptAt: leaseUntil, updatedAt: at, version }]);
    return version;
  }

  /**
   * Reads a claim back (see ClaimVerdict): whether the message is still as `owner` claimed it, and
   * its previous owner still silent for `adoptAfterMs` at `now` (by the reader's clock, as
   * pendingMessages judges it; an owner without a heartbeat is silent since the epoch).
   */
  async claimStands(
    message: Pick<WebhookMessage, 'id' | 'merchantId'>,
    claim: { owner: string; version: number },
    previousOwner: string,
    now: number,
    adoptAfterMs: number,
  ): Promise<ClaimVerdict> {
    const rows = await this.db.queryRows(
      `SELECT m.owner AS owner, toString(m.version) AS version, r.seen_at AS seen_at
         FROM (SELECT owner, version
                 FROM ${this.tables.webhookMessages} FINAL
                WHERE merchant_id = {merchantId:String} AND id = {id:UUID}) AS m
         CROSS JOIN (SELECT max(seen_at) AS seen_at FROM ${this.tables.webhookReplicas} WHERE owner = {previousOwner:String}) AS r`,
      { merchantId: message.merchantId, id: message.id, previousOwner },
    );
    const [row] = rows.map((line) => claimRow.parse(line));
    if (!row || row.owner !== claim.owner || row.version !== claim.version) return 'taken';
    return row.seen_at + adoptAfterMs > now ? 'owner_alive' : 'claimed';
  }

  /** Records that this replica is alive (by its clock): while recent, others do not adopt its messages. */
  async saveHeartbeat(owner: string, at: number): Promise<void> {
    await this.insert(this.tables.webhookReplicas, REPLICA_COLUMNS, [JSON.stringify({ owner, seen_at: toClickHouseTime(at) })]);
  }

  /** The delivery log: messages newest first, each with its attempts. */
  async deliveries(query: DeliveryQuery): Promise<DeliveryRecord[]> {
    const rows = await this.db.queryRows(
      `SELECT ${READ_COLUMNS}
         FROM ${this.tables.webhookMessages} FINAL
        WHERE ({merchantId:String} = '' OR merchant_id = {merchantId:String})
          AND ({destination:String} = '' OR destination = {destination:String})
          AND ({status:String} = '' OR status = {status:String})
          AND ({afterId:String} = '' OR (created_at, id) < ({afterAt:DateTime64(3, 'UTC')}, toUUIDOrZero({afterId:String})))
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
    return rows.map((row) => {
      const { body: _body, ...delivery } = toMessage({ ...deliveryRow.parse(row), body: '' });
      return delivery;
    });
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

  /** An endpoint row; `storedSecret` is the secret as stored (sealed when a key is configured). */
  private endpointLine(
    endpoint: Omit<WebhookEndpoint, 'secret'> & { storedSecret: string },
    deleted: boolean,
    version = this.nextVersion(),
  ): string {
    return JSON.stringify({
      merchant_id: endpoint.merchantId,
      endpoint_id: endpoint.endpointId,
      url: endpoint.url,
      secret: endpoint.storedSecret,
      created_by: endpoint.createdBy,
      updated_by: endpoint.updatedBy,
      created_at: toClickHouseTime(endpoint.createdAt),
      updated_at: toClickHouseTime(endpoint.updatedAt),
      deleted: deleted ? 1 : 0,
      version,
    });
  }

  private async insert(table: string, columns: readonly string[], lines: readonly string[]): Promise<void> {
    if (lines.length === 0) return;
    await this.db.insert(table, columns, Buffer.from(`${lines.join('\n')}\n`), 'JSONEachRow');
  }

  /** A row version: monotonic across writes in this process; wall-clock based across restarts. */
  nextVersion(): number {
    return (this.version = Math.max(this.version + 1, Date.now() * 1000));
  }
}

/** An endpoint row but its secret. */
function toEndpoint(row: z.output<typeof endpointRow>): Omit<WebhookEndpoint, 'secret'> {
  return {
    merchantId: row.merchant_id,
    endpointId: row.endpoint_id,
    url: row.url,
    createdBy: row.created_by,
    updatedBy: row.updated_by,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
  };
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
    owner: row.owner,
    attempts: row.attempts,
    nextAttemptAt: row.next_attempt_at,
    lastOutcome: row.last_outcome,
    lastError: row.last_error,
    attemptLog: row.attempt_log,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
  };
}
