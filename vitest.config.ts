import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['src/**/*.test.ts', 'rules/**/*.test.ts', 'scripts/**/*.test.ts', 'test/**/*.test.ts'],
    globalSetup: ['test/services/global-setup.ts'],
    pool: 'forks',
    // Two cores: integration files are heavy, two at a time is the most the machine gives.
    maxWorkers: 2,
    testTimeout: 120_000,
    hookTimeout: 240_000,
  },
});
