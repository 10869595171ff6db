# The worker image. With CLICKHOUSE_URL set it never loads the embedded engine.
FROM node:20-bookworm-slim
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund
COPY tsconfig.json ./
COPY src ./src
COPY rules ./rules
USER node
EXPOSE 8080
CMD ["node", "--import", "tsx", "src/main.ts"]
