# The worker image. With CLICKHOUSE_URL set it never loads the embedded engine.
FROM node:20-bookworm-slim
WORKDIR /app
COPY package.json package-lock.json ./
# --ignore-scripts skips the package's own `prepare` (it builds the receivers' verifier with
# TypeScript, a dev dependency, and the worker runs src through tsx); `npm rebuild` then runs the
# dependencies' install scripts (chdb, esbuild).
RUN npm ci --omit=dev --ignore-scripts --no-audit --no-fund && npm rebuild
COPY tsconfig.json ./
COPY src ./src
COPY rules ./rules
# Without CLICKHOUSE_URL the embedded engine keeps its data in DATA_DIR (./data, so /app/data): it
# must be writable by the user the worker runs as. Mount a volume there to keep the data.
RUN mkdir -p /app/data && chown node:node /app/data
VOLUME /app/data
USER node
EXPOSE 8080
CMD ["node", "--import", "tsx", "src/main.ts"]
