import { createLogger, type Logger } from '../../src/logger.ts';

/** A logger at info that keeps its lines (parsed as `Line`) and the raw text. */
export function capturedLogs<Line = Record<string, unknown>>(): { logger: Logger; lines: Line[]; text: () => string } {
  const lines: Line[] = [];
  let text = '';
  const logger = createLogger('info', {
    write: (line: string) => {
      text += line;
      lines.push(JSON.parse(line) as Line);
    },
  });
  return { logger, lines, text: () => text };
}
