import { createRequire } from 'node:module';
import { afterEach, beforeAll, beforeEach, describe, expect, it, vi } from 'vitest';
import { stopIdleRequestQueueTimers } from './kafka-request-queue.ts';

/** kafkajs's RequestQueue, as its connections make one (src/network/requestQueue/index.js). */
interface Queue {
  pending: unknown[];
  inflight: Map<number, { timeoutRequest(): void }>;
  throttleCheckTimeoutId: unknown;
  push(request: { entry: Entry; expectResponse: boolean; sendRequest: () => void }): void;
  fulfillRequest(response: { correlationId: number; payload: Buffer; size: number }): void;
  maybeThrottle(milliseconds: number): void;
}
interface Entry {
  correlationId: number;
  apiName: string;
  apiKey: number;
  apiVersion: number;
  resolve: () => void;
  reject: (error: Error) => void;
}
type QueueClass = new (options: Record<string, unknown>) => Queue;

const RequestQueue = createRequire(import.meta.url)('kafkajs/src/network/requestQueue/index.js') as QueueClass;
const silent = { debug() {}, info() {}, warn() {}, error() {} };

function newQueue(maxInFlightRequests: number | null = null): Queue {
  return new RequestQueue({ maxInFlightRequests, requestTimeout: 30_000, enforceRequestTimeout: false, clientId: 'test', broker: 'localhost:9092', logger: silent });
}

/** Pushes a request that expects a response; returns how many times it was sent so far. */
function push(queue: Queue, correlationId: number): () => number {
  let sent = 0;
  const entry: Entry = { correlationId, apiName: 'Fetch', apiKey: 1, apiVersion: 11, resolve() {}, reject() {} };
  queue.push({ entry, expectResponse: true, sendRequest: () => sent++ });
  return () => sent;
}

const respond = (queue: Queue, correlationId: number) => queue.fulfillRequest({ correlationId, payload: Buffer.alloc(0), size: 0 });

describe('stopIdleRequestQueueTimers', () => {
  beforeAll(() => stopIdleRequestQueueTimers());
  beforeEach(() => {
    vi.useFakeTimers();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it('arms no timer after a response when nothing is held back and no throttle runs', () => {
    const queue = newQueue();
    expect(push(queue, 1)()).toBe(1);
    respond(queue, 1);
    // kafkajs alone arms one here, for 1 ms, and again each time it fires.
    expect(queue.throttleCheckTimeoutId).toBeNull();
    expect(vi.getTimerCount()).toBe(0);
  });

  it('still sends a request the broker throttle held back when the throttle ends, and then arms nothing', () => {
    const queue = newQueue();
    queue.maybeThrottle(30);
    const sent = push(queue, 1);
    expect(sent()).toBe(0);
    vi.advanceTimersByTime(29);
    expect(sent()).toBe(0);
    vi.advanceTimersByTime(2);
    expect(sent()).toBe(1);
    respond(queue, 1);
    expect(queue.pending).toHaveLength(0);
    expect(vi.getTimerCount()).toBe(0);
  });

  it('still sends a request held back by the in-flight limit when a response frees a place', () => {
    const queue = newQueue(1);
    const first = push(queue, 1);
    const second = push(queue, 2);
    expect([first(), second()]).toEqual([1, 0]);
    respond(queue, 1);
    expect(second()).toBe(1);
    respond(queue, 2);
    // The look kafkajs armed when the second was held back runs once, and arms nothing more.
    vi.advanceTimersByTime(10);
    expect(vi.getTimerCount()).toBe(0);
  });

  it('arms no timer for a throttle while nothing is held back, and sends a request that comes during it at its end', () => {
    const queue = newQueue();
    push(queue, 1);
    queue.maybeThrottle(50);
    respond(queue, 1);
    expect(vi.getTimerCount()).toBe(0); // kafkajs alone arms one for the throttle's end
    vi.advanceTimersByTime(20);
    const second = push(queue, 2);
    vi.advanceTimersByTime(29);
    expect(second()).toBe(0);
    vi.advanceTimersByTime(2);
    expect(second()).toBe(1);
  });

  it('sends a held-back request when a throttle that came meanwhile ends', () => {
    const queue = newQueue(1);
    push(queue, 1);
    const second = push(queue, 2); // held back by the in-flight limit: kafkajs looks again in 10 ms
    queue.maybeThrottle(50); // the first one's response says the broker throttles this client
    respond(queue, 1);
    vi.advanceTimersByTime(10); // still throttled: the look arms the next for the throttle's end
    expect(second()).toBe(0);
    vi.advanceTimersByTime(39);
    expect(second()).toBe(0);
    vi.advanceTimersByTime(2);
    expect(second()).toBe(1);
    respond(queue, 2);
    expect(vi.getTimerCount()).toBe(0);
  });

  it('sends a held-back request when a request in flight times out and frees a place', () => {
    const queue = newQueue(1);
    push(queue, 1);
    const second = push(queue, 2);
    queue.inflight.get(1)!.timeoutRequest();
    expect(second()).toBe(1);
    respond(queue, 2);
    vi.advanceTimersByTime(10);
    expect(vi.getTimerCount()).toBe(0);
  });

  it('installs once, however often it is called', () => {
    const prototype = (RequestQueue as unknown as { prototype: { scheduleCheckPendingRequests: unknown } }).prototype;
    const installed = prototype.scheduleCheckPendingRequests;
    stopIdleRequestQueueTimers();
    expect(prototype.scheduleCheckPendingRequests).toBe(installed);
  });
});
