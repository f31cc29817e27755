// Runs every test file against ONE Airlock: the one named by AIRLOCK_URL +
// AIRLOCK_API_KEY, or an `airlock up` started here for the whole run.
// Node 20's test runner has no global setup, so this wrapper is it: the
// test files see AIRLOCK_URL and AIRLOCK_API_KEY set.
import { spawn } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startAirlock } from './airlock-server.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const files = process.argv.slice(2).length
  ? process.argv.slice(2)
  : readdirSync(here).filter((f) => f.endsWith('.test.mjs')).sort().map((f) => join(here, f));

const t0 = Date.now();
const srv = await startAirlock();
if (srv.skip) {
  console.error(`\n!!! ${srv.skip}\n!!! every TypeScript SDK test is skipped\n`);
  process.exit(process.env.AIRLOCK_REQUIRE_TESTS ? 1 : 0);
}
if (srv.started) console.error(`airlock up ready at ${srv.url} (pid ${srv.pid}) in ${((Date.now() - t0) / 1000).toFixed(1)} s`);

let code = 1;
let stopping = false;
const child = spawn(process.execPath, ['--test', '--test-concurrency=1', '--test-reporter=spec', ...files], {
  stdio: 'inherit',
  env: { ...process.env, AIRLOCK_URL: srv.url, AIRLOCK_API_KEY: srv.apiKey },
});
const onSignal = (sig) => {
  if (stopping) return;
  stopping = true;
  child.kill(sig);
};
process.on('SIGINT', onSignal);
process.on('SIGTERM', onSignal);
code = await new Promise((r) => child.once('exit', (c, s) => r(c ?? (s ? 1 : 0))));
if (code !== 0 && srv.started) console.error(`\n--- tail of ${srv.logPath} ---\n${srv.tail()}\n`);
await srv.stop();
console.error(`TypeScript SDK tests: ${code === 0 ? 'passed' : 'FAILED'} in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
process.exit(code);
