// Shared by the test files: one client of the real Airlock (see run.mjs),
// and the SDK as built (dist/), never the sources.
import { after } from 'node:test';
import { startAirlock } from './airlock-server.mjs';
export * as sdk from '../dist/index.js';
import { Airlock } from '../dist/index.js';

let srv;
/**
 * Returns {client, url, apiKey} or {skip} (a reason to skip every test);
 * call once per file, at top level, with await.
 */
export async function useAirlock() {
  // Under run.mjs the env names the shared server; run alone, a file starts its own.
  srv = await startAirlock();
  if (srv.skip) {
    console.error(`\n!!! ${srv.skip}\n`);
    return { skip: srv.skip };
  }
  after(async () => {
    await srv.stop();
  }, { timeout: 60_000 });
  return { url: srv.url, apiKey: srv.apiKey, client: new Airlock({ url: srv.url, apiKey: srv.apiKey }) };
}

/** A fresh lowercase id. */
export function runId() {
  return Math.random().toString(36).slice(2, 10) + Date.now().toString(36);
}
