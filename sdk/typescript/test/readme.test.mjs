// The README's example, extracted and run unmodified with the env vars, so
// that it cannot rot. It imports '@airlock/sdk': the file is written inside
// the package, where Node resolves the package's own name to dist/.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync, writeFileSync, rmSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { useAirlock } from './helpers.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const ctx = await useAirlock();

test('the README example runs', { timeout: 5 * 60_000 }, async (t) => {
  if (ctx.skip) return t.skip(ctx.skip);
  const readme = readFileSync(join(here, '..', 'README.md'), 'utf8');
  const blocks = [...readme.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]);
  assert.equal(blocks.length, 1, 'the README has one js example');
  const file = join(here, `.tmp-readme-${process.pid}.mjs`);
  writeFileSync(file, blocks[0]);
  try {
    const { stdout } = await new Promise((resolve, reject) => {
      execFile(process.execPath, [file], { env: { ...process.env, AIRLOCK_URL: ctx.url, AIRLOCK_API_KEY: ctx.apiKey }, timeout: 4 * 60_000 }, (err, stdout, stderr) => {
        if (err) reject(new Error(`README example failed: ${err.message}\nstdout:\n${stdout}\nstderr:\n${stderr}`));
        else resolve({ stdout, stderr });
      });
    });
    t.diagnostic(stdout.trim().replace(/\n/g, ' | '));
    assert.match(stdout, /^3 "hello from Linux\\n" "oops\\n"$/m);
    assert.match(stdout, /remember the milk/);
    assert.match(stdout, /\[stdout\] tick 1\n\[stdout\] tick 2\n\[stdout\] tick 3\n/);
    assert.match(stdout, /exit 0/);
  } finally {
    rmSync(file, { force: true });
  }
});
