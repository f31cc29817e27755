// Starts (or finds) the real Airlock the tests run against.
//
// With AIRLOCK_URL and AIRLOCK_API_KEY both set, that server is used.
// Otherwise `airlock up` is started (AIRLOCK_BIN, default <repo>/bin/airlock)
// on a free port with a fresh data dir, and stopped at the end.
import { spawn, execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, symlinkSync, closeSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
export const repoRoot = resolve(here, '..', '..', '..');

function freePort() {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once('error', rej);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => res(port));
    });
  });
}

function tail(path, n = 60) {
  try {
    return readFileSync(path, 'utf8').split('\n').slice(-n).join('\n');
  } catch {
    return '(no log)';
  }
}

/**
 * Returns {url, apiKey, stop, skip}. skip is a reason to skip every test
 * (not root, no binary); stop() tears down what was started.
 */
export async function startAirlock() {
  if (process.env.AIRLOCK_URL && process.env.AIRLOCK_API_KEY) {
    return { url: process.env.AIRLOCK_URL, apiKey: process.env.AIRLOCK_API_KEY, stop: async () => {}, started: false };
  }
  const bin = process.env.AIRLOCK_BIN || join(repoRoot, 'bin', 'airlock');
  if (process.getuid && process.getuid() !== 0) {
    return { skip: 'SKIPPING: airlock up must run as root (set AIRLOCK_URL and AIRLOCK_API_KEY to use a running server)' };
  }
  if (!existsSync(bin)) {
    return { skip: `SKIPPING: no airlock binary at ${bin} (run ./scripts/build.sh, or set AIRLOCK_BIN)` };
  }
  const dir = mkdtempSync(join(tmpdir(), 'airlock-sdk-ts-'));
  const cache = process.env.AIRLOCK_TEST_CACHE;
  if (cache) {
    // Each shared directory must exist: a dangling link makes `airlock up`'s mkdir fail.
    for (const d of ['cache', 'bin', 'build-cache']) {
      mkdirSync(join(cache, d), { recursive: true });
      symlinkSync(join(cache, d), join(dir, d));
    }
  }
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const logPath = join(dir, 'up.log');
  const log = openSync(logPath, 'a');
  const child = spawn(bin, ['up', '--listen', `127.0.0.1:${port}`, '--data-dir', dir, '--build-templates', '', '--qemu=false'], {
    stdio: ['ignore', log, log],
    detached: false,
  });
  closeSync(log);
  let exited = null;
  child.once('exit', (code, sig) => (exited = { code, sig }));
  const stop = async () => {
    if (exited === null) {
      child.kill('SIGTERM');
      const done = new Promise((r) => child.once('exit', r));
      const t = setTimeout(() => exited === null && child.kill('SIGKILL'), 30_000);
      await done;
      clearTimeout(t);
    }
    try {
      execFileSync('umount', ['-l', join(dir, 'runsc', 'null-netns')], { stdio: 'ignore' });
    } catch {
      // not mounted
    }
    rmSync(dir, { recursive: true, force: true });
  };
  const deadline = Date.now() + 5 * 60_000;
  const keyPath = join(dir, 'admin.key');
  for (;;) {
    if (exited !== null) {
      const t = tail(logPath);
      await stop();
      throw new Error(`airlock up exited (${JSON.stringify(exited)}) before it was ready; tail of ${logPath}:\n${t}`);
    }
    let healthy = false;
    try {
      const r = await fetch(url + '/healthz');
      healthy = r.status === 200;
    } catch {
      // not listening yet
    }
    if (healthy && existsSync(keyPath) && readFileSync(keyPath, 'utf8').trim()) break;
    if (Date.now() > deadline) {
      const t = tail(logPath);
      await stop();
      throw new Error(`airlock up was not ready within 5 minutes; tail of ${logPath}:\n${t}`);
    }
    await new Promise((r) => setTimeout(r, 500));
  }
  const apiKey = readFileSync(keyPath, 'utf8').trim();
  return { url, apiKey, stop, started: true, logPath, pid: child.pid, tail: () => tail(logPath) };
}
