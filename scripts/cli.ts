/** What the development scripts share: their options, and how they answer a mistake in them. */
import { parseArgs, type ParseArgsConfig } from 'node:util';

/** Prints the message and the usage to stderr and exits with 2, a usage error. */
export function usageError(message: string, usage: string): never {
  process.stderr.write(`${message}\n${usage}\n`);
  process.exit(2);
}

/**
 * The script's options. `--help` prints the usage and exits; an unknown or malformed option is a
 * usage error (not a stack trace).
 */
export function parseOptions<T extends NonNullable<ParseArgsConfig['options']>>(options: T, usage: string) {
  const args = process.argv.slice(2);
  if (args.includes('--help') || args.includes('-h')) {
    process.stdout.write(`${usage}\n`);
    process.exit(0);
  }
  try {
    return parseArgs({ args, options, strict: true }).values;
  } catch (error) {
    usageError(error instanceof Error ? error.message : String(error), usage);
  }
}
