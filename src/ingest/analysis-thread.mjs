// Entry point of the analysis thread. Plain JavaScript, because a worker thread does not inherit
// the TypeScript loader of the main thread: it registers tsx, then loads the thread's code.
import { register } from 'tsx/esm/api';

register();
await import('./analysis-thread-main.ts');
