/**
 * The one HTTP port: /health (liveness), /ready (storage reachable and migrated, intake healthy),
 * /metrics (Prometheus), and the routes that other parts register (ingest, admin).
 * Contract: every error goes through the one error handler (errors.ts); unknown paths are 404 in Format A.
 */
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance, type FastifyReply } from 'fastify';
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
}

export function createHttpServer(options: ServerOptions): FastifyInstance {
  const app = Fastify({
    loggerInstance: options.logger.child({ component: 'http' }) as FastifyBaseLogger,
    // Per-request log lines would cost more than ingest itself; errors are still logged.
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: options.bodyLimit,
    // Deep or hostile JSON is refused by the parser, not by a stack overflow.
    onProtoPoisoning: 'error',
    onConstructorPoisoning: 'error',
    return503OnClosing: true,
    // Errors the router raises before any handler runs: the same formats, and never the URL echoed.
    frameworkErrors: (error, _request, reply) => {
      const httpError =
        error.code === 'FST_ERR_MAX_PARAM_LENGTH'
          ? validationError([{ path: ['params'], message: 'a path parameter is too long' }])
          : error.code === 'FST_ERR_BAD_URL'
            ? validationError([{ path: ['url'], message: 'the URL is malformed' }])
            : toHttpError(error);
      void (reply as FastifyReply).code(httpError.statusCode).send(renderError(httpError));
    },
  });
  app.setErrorHandler(handleError);
  app.setNotFoundHandler((_request, reply) => {
    void reply.code(404).send(renderError(new HttpError(404, 'NOT_FOUND', 'Not found')));
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
