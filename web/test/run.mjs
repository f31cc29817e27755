// Runs the console's browser tests against ONE Airlock: the one named by
// AIRLOCK_URL + AIRLOCK_API_KEY, or an `airlock up` started here (the
// TypeScript SDK suite's starter, sdk/typescript/test/airlock-server.mjs).
// Chromium is Debian's (/usr/bin/chromium, or $CHROMIUM); a machine that
// lacks it or cannot start it skips every test, loudly.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { startAirlock } from '../../sdk/typescript/test/airlock-server.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const exe = process.env.CHROMIUM || '/usr/bin/chromium';
const skip = (why) => {
  console.error(`\n!!! SKIPPING the web console's browser tests: ${why}\n`);
  process.exit(process.env.AIRLOCK_REQUIRE_TESTS ? 1 : 0);
};
if (!existsSync(exe)) skip(`no Chromium at ${exe} (Debian: apt-get install chromium; scripts/install-deps.sh installs it; or set CHROMIUM)`);
try {
  const b = await chromium.launch({ executablePath: exe, args: ['--no-sandbox'] });
  await b.close();
} catch (e) {
  skip(`${exe} does not start headless: ${String(e.message).split('\n')[0]}`);
}

const t0 = Date.now();
const srv = await startAirlock();
if (srv.skip) skip(srv.skip);
if (srv.started) console.error(`airlock up ready at ${srv.url} (pid ${srv.pid}) in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
const files = process.argv.slice(2).length ? process.argv.slice(2) : [join(here, 'console.test.mjs')];
const child = spawn(process.execPath, ['--test', '--test-concurrency=1', '--test-reporter=spec', ...files], {
  stdio: 'inherit',
  env: { ...process.env, AIRLOCK_URL: srv.url, AIRLOCK_API_KEY: srv.apiKey, CHROMIUM: exe },
});
const forward = (sig) => child.kill(sig);
process.on('SIGINT', forward);
process.on('SIGTERM', forward);
const code = await new Promise((r) => child.once('exit', (c, s) => r(c ?? (s ? 1 : 0))));
if (code !== 0 && srv.started) console.error(`\n--- tail of ${srv.logPath} ---\n${srv.tail()}\n`);
await srv.stop();
console.error(`web console tests: ${code === 0 ? 'passed' : 'FAILED'} in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
process.exit(code);
