/**
 * The TypeScript SDK of Airlock.
 *
 * ```ts
 * import { Airlock } from '@airlock/sdk';
 * const airlock = new Airlock(); // AIRLOCK_URL and AIRLOCK_API_KEY
 * ```
 * @packageDocumentation
 */
export * from './client.js';
export * from './commands.js';
export * from './files.js';
export * from './errors.js';
