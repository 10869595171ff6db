/**
 * The one HTTP port: /health (liveness), /ready (start-up done, storage writable, intake healthy),
 * /metrics (Prometheus), and the routes that other parts register (ingest, admin).
 * Contract: every error goes through the one error handler (errors.ts); unknown paths are 404 in Format A.
 */
import { STATUS_CODES, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import type { Logger } from '../logger.ts';
import type { WorkerMetrics } from '../metrics.ts';
import { HttpError, handleError, renderError, toHttpError, validationError } from './errors.ts';

export interface ServerOptions {
  logger: Logger;
  metrics: WorkerMetrics;
  version: string;
  bodyLimit: number;
  /** Readiness: undefined when ready, else the reason it is not. */
  notReadyReason(): string | undefined;
  /** How long a request's headers and body may take to arrive (REQUEST_TIMEOUT_MS by default). */
  requestTimeoutMs?: number;
}

/**
 * A request whose headers and body have not all arrived by then gets 408 REQUEST_TIMEOUT (Fastify's
 * default is none: a client that sent half a body would hold its connection forever). 60 s leaves a
 * post of the largest INGEST_MAX_BODY_BYTES (100 MiB) 1.7 MB/s.
 */
export const REQUEST_TIMEOUT_MS = 60_000;

export function createHttpServer(options: ServerOptions): FastifyInstance {
  const requestTimeout = options.requestTimeoutMs ?? REQUEST_TIMEOUT_MS;
  const app = Fastify({
    requestTimeout,
    http: {
      headersTimeout: Math.min(60_000, requestTimeout),
      // How often Node looks for requests past their time (its default, 30 s, would let one run 50% over).
      connectionsCheckingInterval: Math.min(5_000, requestTimeout),
      // Node's own answer to an HTTP/1.1 request without Host is a bare 400; it is answered below, in Format A.
      requireHostHeader: false,
    },
    loggerInstance: options.logger.child({ component: 'http' }) as FastifyBaseLogger,
    // Per-request log lines would cost more than ingest itself; errors are still logged.
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: options.bodyLimit,
    // Deep or hostile JSON is refused by the parser, not by a stack overflow.
    onProtoPoisoning: 'error',
    onConstructorPoisoning: 'error',
    // Closing is answered below, in Format A with Retry-After (Fastify's own 503 has neither).
    return503OnClosing: false,
    clientErrorHandler: answerClientError,
    // Errors the router raises before any handler runs: the same formats, and never the URL echoed.
    frameworkErrors: (error, _request, reply) => {
      const httpError =
        error.code === 'FST_ERR_MAX_PARAM_LENGTH'
          ? new HttpError(404, 'NOT_FOUND', 'Not found') // an id longer than any id names nothing
          : error.code === 'FST_ERR_BAD_URL'
            ? validationError([{ path: ['url'], message: 'the URL is malformed' }])
            : toHttpError(error);
      void (reply as FastifyReply).code(httpError.statusCode).send(renderError(httpError));
    },
  });
  app.setErrorHandler(handleError);
  // Node answers an Expect other than 100-continue itself, with a bare 417; in Format A here.
  app.server.on('checkExpectation', answerUnmetExpectation);
  // Once close() has begun, a request arriving on a kept-alive connection is turned away at once, so
  // that its client retries elsewhere (a load balancer's other replicas) instead of waiting for the
  // drain; the requests already running finish.
  let closing = false;
  app.addHook('preClose', async () => {
    closing = true;
  });
  app.addHook('onRequest', async () => {
    if (closing) throw new HttpError(503, 'SERVICE_UNAVAILABLE', 'The worker is shutting down; retry', undefined, { 'retry-after': '1', connection: 'close' });
  });
  // Node closes only the connections idle when close() begins; a busy one answered with keep-alive
  // would then hold close() open until its keep-alive timeout. Every answer sent once closing has
  // begun closes its connection instead.
  app.addHook('onSend', async (request, reply, payload) => {
    if (closing) void reply.header('connection', 'close');
    lastAnswered.set(request.raw.socket, request.raw);
    return payload;
  });
  app.addHook('onRequest', async (request) => {
    if (request.raw.httpVersion === '1.1' && request.headers.host === undefined) {
      throw new HttpError(400, 'BAD_REQUEST', 'The request has no Host header');
    }
  });
  app.setNotFoundHandler(answerNotFound);
  // A path no route serves is answered before its body is parsed: otherwise an empty or malformed
  // JSON body would get the parser's 400 instead of the 404 (the not-found handler runs after parsing).
  app.addHook('onRequest', async (request, reply) => {
    if (!request.is404) return;
    answerNotFound(request, reply);
    return reply;
  });

  const startedAt = Date.now();
  app.get('/health', async () => ({
    status: 'ok',
    timestamp: new Date().toISOString(),
    version: options.version,
    uptime: Math.round((Date.now() - startedAt) / 1000),
  }));

  app.get('/ready', async (_request, reply) => {
    const reason = options.notReadyReason();
    if (reason) return reply.code(503).send({ status: 'not_ready', reason, timestamp: new Date().toISOString() });
    return { status: 'ready', timestamp: new Date().toISOString() };
  });

  app.get('/metrics', async (_request, reply) => {
    const body = await options.metrics.registry.metrics();
    return reply.type(options.metrics.registry.contentType).send(body);
  });

  return app;
}

/** The one answer to a path no route serves: 404 in Format A, the URL never echoed. */
function answerNotFound(_request: FastifyRequest, reply: FastifyReply): void {
  void reply.code(404).send(renderError(new HttpError(404, 'NOT_FOUND', 'Not found')));
}

/**
 * Per connection, the request it last answered. A request answered before its body arrived (a 401 or
 * 404 does not wait for it) keeps its connection, whose next request may follow once the body has;
 * if the body never comes, the request timeout must not answer it a second time (a 408 the client
 * would read as its next request's answer): its connection is closed instead.
 */
const lastAnswered = new WeakMap<Socket, IncomingMessage>();

/** A request with an Expect header other than 100-continue, which Node leaves to the server: 417 in Format A. */
function answerUnmetExpectation(_request: IncomingMessage, response: ServerResponse): void {
  const body = JSON.stringify(renderError(new HttpError(417, 'EXPECTATION_FAILED', 'The only Expect header taken is 100-continue')));
  response.writeHead(417, { 'content-type': 'application/json; charset=utf-8', 'content-length': Buffer.byteLength(body), connection: 'close' }).end(body);
}

/**
 * A request Node's HTTP parser refuses before any route sees it (malformed request line or headers,
 * headers or URL over the size limit, a request too slow to arrive): answered in Format A, as every
 * other error, and the connection closed (what follows on it cannot be trusted).
 */
function answerClientError(error: Error & { code?: string }, socket: Socket): void {
  if (error.code === 'ECONNRESET' || socket.destroyed) return;
  const answered = lastAnswered.get(socket);
  if (answered !== undefined && !answered.complete) {
    socket.destroy(error);
    return;
  }
  const httpError =
    error.code === 'ERR_HTTP_REQUEST_TIMEOUT'
      ? new HttpError(408, 'REQUEST_TIMEOUT', 'The request did not arrive in time')
      : error.code === 'HPE_HEADER_OVERFLOW'
        ? new HttpError(431, 'HEADERS_TOO_LARGE', 'The request headers or URL are larger than the limit')
        : new HttpError(400, 'BAD_REQUEST', 'The request is not valid HTTP');
  const body = JSON.stringify(renderError(httpError));
  if (socket.writable) {
    socket.write(
      `HTTP/1.1 ${httpError.statusCode} ${STATUS_CODES[httpError.statusCode]}\r\nContent-Type: application/json; charset=utf-8\r\n` +
        `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    );
  }
  socket.destroy(error);
}
