import { readFileSync } from 'node:fs';
import { parser } from '@prometheus-io/lezer-promql';
import type { SyntaxNode } from '@lezer/common';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { RULES } from '../rules/index.ts';
import { AlertManager } from './alerts/alert-manager.ts';
import { AlertService } from './alerts/alert-service.ts';
import { createLogger } from './logger.ts';
import { WorkerMetrics } from './metrics.ts';
import type { AlertStore } from './store/alert-store.ts';
import type { WebhookStore } from './store/webhook-store.ts';
import { WebhookDispatcher } from './webhooks/dispatcher.ts';
import { targetPolicy } from './webhooks/target-policy.ts';

/** The alerting rules shipped for on-call (config/prometheus-alerts.yml). */
interface AlertRule {
  alert: string;
  expr: string;
  for?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}

const RULES_FILE = new URL('../config/prometheus-alerts.yml', import.meta.url);
/** Labels Prometheus gives every scraped series. */
const TARGET_LABELS = ['instance', 'job'];
/** Series Prometheus makes itself for every target. */
const PROMETHEUS_SERIES = new Map([['up', [] as string[]]]);
const SEVERITIES = ['critical', 'warning', 'info'];

/** Every series name the worker exports, with its labels (histograms by their _bucket, _sum and _count). */
function exportedSeries(): Map<string, string[]> {
  const metrics = new WorkerMetrics({ defaultMetrics: false });
  // The metrics registered only by the parts that report them.
  metrics.reportWebhookDispatcherUp(() => true);
  metrics.reportEnforcementDecisions(() => undefined);
  const series = new Map(PROMETHEUS_SERIES);
  for (const metric of metrics.registry.getMetricsAsArray() as unknown as { name: string; labelNames: string[]; constructor: { name: string } }[]) {
    if (metric.constructor.name === 'Histogram') {
      series.set(`${metric.name}_bucket`, [...metric.labelNames, 'le']);
      series.set(`${metric.name}_sum`, metric.labelNames);
      series.set(`${metric.name}_count`, metric.labelNames);
    } else {
      series.set(metric.name, metric.labelNames);
    }
  }
  return series;
}

/** What an expression reads: its syntax errors, the series it selects, the labels it names, and whether it aggregates. */
function readExpression(expr: string) {
  const tree = parser.parse(expr);
  const errors: string[] = [];
  const selectors: { name: string; labels: string[] }[] = [];
  const grouping: string[] = [];
  let aggregates = false;
  const text = (node: SyntaxNode) => expr.slice(node.from, node.to);
  tree.iterate({
    enter: (ref) => {
      if (ref.type.isError) errors.push(`at ${ref.from}: ${JSON.stringify(expr.slice(ref.from, ref.from + 20))}`);
      if (ref.name === 'AggregateExpr') aggregates = true;
      if (ref.name === 'GroupingLabels') for (const label of ref.node.getChildren('LabelName')) grouping.push(text(label));
      if (ref.name === 'VectorSelector') {
        const name = ref.node.getChild('Identifier');
        const matchers = ref.node.getChild('LabelMatchers');
        const labels = (matchers?.getChildren('UnquotedLabelMatcher') ?? []).map((matcher) => text(matcher.getChild('LabelName')!));
        selectors.push({ name: name ? text(name) : '', labels });
      }
    },
  });
  return { errors, selectors, grouping, aggregates };
}

describe('the Prometheus alerting rules shipped in config/', () => {
  const file = parse(readFileSync(RULES_FILE, 'utf8')) as { groups: { name: string; rules: AlertRule[] }[] };
  const rules = file.groups.flatMap((group) => group.rules);
  const exported = exportedSeries();

  it('are well formed: unique names, a severity, a summary and a description, durations Prometheus reads', () => {
    expect(rules.length).toBeGreaterThan(5);
    expect(new Set(rules.map((rule) => rule.alert)).size).toBe(rules.length);
    for (const rule of rules) {
      expect(rule.alert, JSON.stringify(rule)).toMatch(/^SecurityCenter[A-Z][A-Za-z]+$/);
      expect(SEVERITIES, rule.alert).toContain(rule.labels?.severity);
      expect(rule.annotations?.summary?.length, rule.alert).toBeGreaterThan(10);
      expect(rule.annotations?.description?.length, rule.alert).toBeGreaterThan(20);
      if (rule.for !== undefined) expect(rule.for, rule.alert).toMatch(/^\d+[smh]$/);
    }
  });

  it('parse as PromQL and read only series the worker exports, by labels those series have', () => {
    for (const rule of rules) {
      const { errors, selectors, grouping } = readExpression(rule.expr);
      expect(errors, `${rule.alert}: ${rule.expr}`).toEqual([]);
      expect(selectors.length, rule.alert).toBeGreaterThan(0);
      const known = new Set(TARGET_LABELS);
      for (const { name, labels } of selectors) {
        expect([...exported.keys()], `${rule.alert} reads ${name}`).toContain(name);
        const own = exported.get(name)!;
        for (const label of labels) expect([...own, ...TARGET_LABELS], `${rule.alert}: ${name} has no label ${label}`).toContain(label);
        for (const label of own) known.add(label);
      }
      for (const label of grouping) expect([...known], `${rule.alert} groups by ${label}`).toContain(label);
    }
  });

  it('name in their annotations only labels the alert carries', () => {
    for (const rule of rules) {
      const { selectors, grouping, aggregates } = readExpression(rule.expr);
      // An aggregation keeps only the labels it groups by; otherwise the series keep their own.
      const carried = aggregates ? grouping : [...TARGET_LABELS, ...selectors.flatMap(({ name }) => exported.get(name) ?? [])];
      const text = Object.values(rule.annotations ?? {}).join(' ');
      for (const [, label] of text.matchAll(/\$labels\.(\w+)/g)) expect(carried, `${rule.alert} names $labels.${label}`).toContain(label);
    }
  });

  it('count the first increase they look for: a worker exports every labelled counter series they select at 0 from its start', async () => {
    // Prometheus's increase() cannot count a series' first sample: a series that first appears at 1
    // (the first failed batch, the first webhook given up) would never fire an `increase(...) > 0` rule.
    const metrics = new WorkerMetrics({ defaultMetrics: false });
    const logger = createLogger('silent');
    new AlertService(new AlertManager({ suppressionMs: 60_000 }), {} as AlertStore, RULES, metrics, logger);
    new WebhookDispatcher({ store: {} as WebhookStore, policy: targetPolicy(), metrics, logger });
    const missing: string[] = [];
    for (const rule of rules) {
      for (const [, name, matchers] of rule.expr.matchAll(/increase\((\w+)\{([^}]*)\}/g)) {
        const series = (await metrics.registry.getSingleMetric(name!)!.get()).values;
        const selected = series.filter(({ labels, value }) =>
          value === 0 &&
          [...matchers!.matchAll(/(\w+)\s*(!?=)\s*"([^"]*)"/g)].every(([, label, op, wanted]) => (String(labels[label!]) === wanted) === (op === '=')),
        );
        if (selected.length === 0) missing.push(`${rule.alert}: ${name}{${matchers}}`);
      }
    }
    expect(missing).toEqual([]);
  });

  it('are checked by a parser that reports syntax errors (so the check above can fail)', () => {
    expect(readExpression('sum by (topic (rate(security_center_events_stored_total[5m]))').errors).not.toEqual([]);
  });
});
