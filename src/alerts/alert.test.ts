import { describe, expect, it } from 'vitest';
import { SEVERITIES } from '../detect/types.ts';
import { higherSeverity, isAllowedTransition, riskScore } from './alert.ts';

describe('riskScore', () => {
  it.each([
    ['low', 0, 0.1],
    ['low', 1, 0.399],
    ['medium', 0, 0.4],
    ['medium', 1, 0.699],
    ['high', 0.5, 0.8],
    ['critical', 0, 0.9],
    ['critical', 1, 1],
  ] as const)('%s at confidence %d is %d', (severity, confidence, expected) => {
    expect(riskScore(severity, confidence)).toBeCloseTo(expected, 3);
  });

  it('keeps every score inside its band, whatever the confidence', () => {
    const bands = { low: [0, 0.4], medium: [0.4, 0.7], high: [0.7, 0.9], critical: [0.9, 1] } as const;
    for (const severity of SEVERITIES) {
      for (const confidence of [-1, 0, 0.3, 0.99, 1, 7, Number.NaN]) {
        const score = riskScore(severity, confidence);
        expect(score).toBeGreaterThanOrEqual(bands[severity][0]);
        expect(score).toBeLessThanOrEqual(bands[severity][1]);
        if (severity !== 'critical') expect(score).toBeLessThan(bands[severity][1]);
      }
    }
  });
});

describe('lifecycle', () => {
  it.each([
    ['open', 'acknowledged', true],
    ['open', 'dismissed', true],
    ['acknowledged', 'resolved', true],
    ['acknowledged', 'dismissed', true],
    ['open', 'resolved', false],
    ['resolved', 'open', false],
    ['dismissed', 'open', false],
    ['acknowledged', 'open', false],
    ['open', 'open', false],
  ] as const)('%s -> %s allowed: %s', (from, to, allowed) => {
    expect(isAllowedTransition(from, to)).toBe(allowed);
  });

  it('never lowers severity', () => {
    expect(higherSeverity('high', 'medium')).toBe('high');
    expect(higherSeverity('medium', 'critical')).toBe('critical');
  });
});
