# The worker image. With CLICKHOUSE_URL set it never loads the embedded engine.
# Node 24 (LTS): Node 20 is past its end of life. The test suite passes on 20.19+, 22 and 24.
FROM node:24-bookworm-slim
WORKDIR /app
COPY package.json package-lock.json ./
# `npm install`, not `npm ci` (as in .ci/run): chdb declares platform packages that the registry does
# not publish for every platform, so the lock file cannot list them and `npm ci` refuses it as out
# of sync ("Missing: @chdb/lib-darwin-arm64@ from lock file"). `npm install --omit=dev` installs the
# lock file's production packages at its versions, this platform's chdb library among them.
# --ignore-scripts skips the package's own `prepare` (it builds the receivers' verifier with
# TypeScript, a dev dependency, and the worker runs src through tsx); `npm rebuild` then runs the
# dependencies' install scripts (chdb, esbuild).
RUN npm install --omit=dev --ignore-scripts --no-audit --no-fund && npm rebuild
COPY tsconfig.json ./
COPY src ./src
COPY rules ./rules
# Without CLICKHOUSE_URL the embedded engine keeps its data in DATA_DIR (./data, so /app/data): it
# must be writable by the user the worker runs as. Mount a volume there to keep the data.
RUN mkdir -p /app/data && chown node:node /app/data
VOLUME /app/data
USER node
EXPOSE 8080
# V8 semi-spaces of 64 MB for the main thread, as `npm start` gives it: its scavenges copy the Kafka
# fetch in hand, fewer of them the larger they are (the analysis thread gets 16 MB: README, Performance).
CMD ["node", "--max-semi-space-size=64", "--import", "tsx", "src/main.ts"]
