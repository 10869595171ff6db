import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    pool: 'forks',
    // Two cores: integration files are heavy, two at a time is the most the machine gives.
    maxWorkers: 2,
    testTimeout: 120_000,
    hookTimeout: 240_000,
    projects: [
      // Pure logic (rules, signing, parsing, the tests' own file builders): no engines, so no broker is started for a run of these alone.
      { extends: true, test: { name: 'unit', include: ['src/**/*.test.ts', 'rules/**/*.test.ts', 'scripts/**/*.test.ts', 'test/support/**/*.test.ts'] } },
      // Real engines: one Kafka-protocol broker for the run, started only when one of these is queued.
      {
        extends: true,
        test: { name: 'integration', include: ['test/**/*.test.ts'], exclude: ['test/support/**', 'node_modules/**'], globalSetup: ['test/services/global-setup.ts'] },
      },
    ],
  },
});
