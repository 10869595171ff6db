/**
 * The rules the engine runs, in a stable order. A rule is pure (see src/detect/types.ts): adding one
 * is a new file rules/<id>.ts with its fixtures rules/<id>.fixtures.ts, and a line here.
 */
import { rule as bot } from './bot_traffic.ts';
import { rule as sharing } from './credential_sharing.ts';
import { rule as failure } from './high_failure_rate.ts';
import { rule as travel } from './impossible_travel.ts';
import { rule as velocity } from './velocity_attack.ts';

export const RULES = [velocity, travel, failure, bot, sharing] as const;
