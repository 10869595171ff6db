/** Table names, in one place. Every name is qualified with the configured database. */
export interface Tables {
  readonly database: string;
  readonly schemaMigrations: string;
  readonly requestEvents: string;
  readonly requestRollup1m: string;
  readonly merchantRollup15m: string;
  readonly keyNetworks1d: string;
  readonly keyVouchedNetworks1d: string;
  readonly networkAuthFailures1m: string;
  readonly alerts: string;
  readonly enforcementHistory: string;
  readonly webhookEndpoints: string;
  readonly webhookMessages: string;
  readonly webhookBreakers: string;
  readonly webhookReplicas: string;
}

export function tablesIn(database: string): Tables {
  return {
    database,
    schemaMigrations: `${database}.schema_migrations`,
    requestEvents: `${database}.request_events`,
    requestRollup1m: `${database}.request_rollup_1m`,
    merchantRollup15m: `${database}.merchant_rollup_15m`,
    keyNetworks1d: `${database}.key_networks_1d`,
    keyVouchedNetworks1d: `${database}.key_vouched_networks_1d`,
    networkAuthFailures1m: `${database}.network_auth_failures_1m`,
    alerts: `${database}.alerts_by_time`,
    enforcementHistory: `${database}.enforcement_history`,
    webhookEndpoints: `${database}.webhook_endpoints`,
    webhookMessages: `${database}.webhook_messages`,
    webhookBreakers: `${database}.webhook_breakers`,
    webhookReplicas: `${database}.webhook_replicas`,
  };
}
