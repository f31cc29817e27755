// End-to-end tests of the web console in headless Chromium against a real
// Airlock (AIRLOCK_URL, AIRLOCK_API_KEY; see run.mjs): sign in with the key,
// create a sandbox and see it live, a terminal over the data plane's PTY
// (output, Ctrl-C), the file browser (list, upload, download), operations,
// templates and a build with its progress, and the admin pages. Each step
// asserts what the page shows; screenshots of the main pages go to
// docs/images/console-*.png.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));
const shots = resolve(here, '..', '..', 'docs', 'images');
const url = process.env.AIRLOCK_URL;
const key = process.env.AIRLOCK_API_KEY;
const exe = process.env.CHROMIUM || '/usr/bin/chromium';
const MIN = 60_000;

let browser, ctx, page;
const problems = []; // console errors and CSP violations
let sandboxId = '';

async function shot(name) {
  mkdirSync(shots, { recursive: true });
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.waitForTimeout(300); // let the live dot and fonts settle
  await page.screenshot({ path: join(shots, `console-${name}.png`) });
}

async function apiGet(path) {
  const r = await fetch(url + path, { headers: { Authorization: `Bearer ${key}` } });
  const body = await r.text();
  assert.equal(r.status, 200, `${path}: ${r.status} ${body}`);
  return JSON.parse(body);
}

async function termText() {
  return page.locator('.xterm-rows').innerText();
}

async function waitTerm(re, timeout = 20_000) {
  const t0 = Date.now();
  for (;;) {
    const text = await termText();
    if (re.test(text)) return text;
    if (Date.now() - t0 > timeout) assert.fail(`the terminal never showed ${re}; it shows:\n${text}`);
    await page.waitForTimeout(200);
  }
}

before(async () => {
  assert.ok(url && key, 'AIRLOCK_URL and AIRLOCK_API_KEY must be set (run through web/test.sh)');
  browser = await chromium.launch({ executablePath: exe, args: ['--no-sandbox'] });
  ctx = await browser.newContext({ viewport: { width: 1360, height: 860 }, acceptDownloads: true });
  page = await ctx.newPage();
  page.on('console', (m) => {
    if (m.type() === 'error') problems.push(m.text());
  });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('dialog', (d) => d.accept());
});

after(async () => {
  await browser?.close();
});

test('the console is served at /ui with a strict CSP, no key needed for its files', async () => {
  const r = await fetch(`${url}/ui/`);
  assert.equal(r.status, 200);
  const csp = r.headers.get('content-security-policy');
  assert.match(csp, /default-src 'none'/);
  assert.match(csp, /script-src 'self'(;|$)/);
  assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval/);
  // The worker's data plane is the one other origin it may connect to.
  assert.match(csp, /connect-src 'self' http:\/\/127\.0\.0\.1:\d+ ws:\/\/127\.0\.0\.1:\d+/);
  const html = await r.text();
  assert.doesNotMatch(html, /<script(?![^>]*\ssrc=)[^>]*>/, 'inline script in index.html');
  // The server embeds this checkout's build (else: ./scripts/build.sh).
  const committed = readFileSync(resolve(here, '..', '..', 'internal', 'ui', 'dist', 'index.html'), 'utf8');
  const nonce = /'nonce-([^']+)'/.exec(csp)[1];
  assert.equal(html, committed.replace('__AIRLOCK_STYLE_NONCE__', nonce), 'the server serves another build of the console than internal/ui/dist: rebuild bin/airlock (./scripts/build.sh)');
  const redirect = await fetch(`${url}/ui`, { redirect: 'manual' });
  assert.equal(redirect.status, 301);
});

test('sign in: a wrong key is refused, the admin key signs in', async () => {
  await page.goto(`${url}/ui`);
  await page.getByTestId('login-key').waitFor();
  await shot('login');
  await page.getByTestId('login-key').fill('al_' + '0'.repeat(40));
  await page.getByTestId('login-submit').click();
  await page.getByTestId('login-error').filter({ hasText: /key/i }).waitFor();
  // The refused key's 401 is logged by Chromium as a console error: expected.
  problems.splice(0, problems.length, ...problems.filter((p) => !/status of 401/.test(p)));
  await page.getByTestId('login-key').fill(key);
  await page.getByTestId('login-submit').click();
  await page.getByTestId('sandboxes').waitFor();
  assert.equal(await page.evaluate(() => sessionStorage.getItem('airlock.apiKey')), key);
  assert.equal(await page.evaluate(() => localStorage.length), 0);
  assert.ok(!page.url().includes(key), 'the key is in the URL');
  await page.locator('[data-testid=live][data-live=true]').waitFor({ timeout: 10_000 });
  assert.ok(await page.locator('[data-nav=admin]').isVisible(), 'the admin key sees the Admin page');
});

test('sandboxes: create one from the form and see it running with its resources and metadata', { timeout: 5 * MIN }, async () => {
  await page.getByTestId('create-metadata').fill('e2e=console, team=web');
  await page.getByTestId('create-sandbox').click();
  const created = await page.locator('.msg.ok').filter({ hasText: 'created sb-' }).textContent();
  sandboxId = /sb-[a-z0-9]+/.exec(created)[0];
  const row = page.locator(`tr[data-sandbox="${sandboxId}"]`);
  await row.waitFor();
  // The row turns running by itself: the page follows /v1/events.
  await row.locator('[data-state=running]').waitFor({ timeout: 4 * MIN });
  const text = await row.innerText();
  assert.match(text, /1 vCPU · 512 MiB · 4 GiB disk/);
  assert.match(text, /e2e=console/);
  assert.match(text, /team=web/);
  assert.match(text, /base/);
  const sb = await apiGet(`/v1/sandboxes/${sandboxId}`);
  assert.equal(sb.state, 'running');
  assert.deepEqual(sb.metadata, { e2e: 'console', team: 'web' });
  await shot('sandboxes');
});

test('terminal: a live PTY over the data plane; output, Ctrl-C, resize', { timeout: 3 * MIN }, async () => {
  await page.locator(`a[href="#/sandboxes/${sandboxId}"]`).first().click();
  await page.locator('[data-testid=term-status][data-state=connected]').waitFor({ timeout: 60_000 });
  await page.locator('.xterm').click();
  await waitTerm(/\$\s*$/m, 30_000); // a prompt
  await page.keyboard.type('echo console-$((6*7))');
  await page.keyboard.press('Enter');
  await waitTerm(/^console-42\s*$/m);
  // A PTY: the shell sees a terminal of the page's size.
  await page.keyboard.type('tty && stty size | tr " " x');
  await page.keyboard.press('Enter');
  const sized = await waitTerm(/^\d+x\d+\s*$/m);
  const [, rows, cols] = /^(\d+)x(\d+)\s*$/m.exec(sized);
  assert.ok(Number(cols) > 80 && Number(rows) > 10, `terminal size ${cols}x${rows}`);
  assert.match(sized, /\/dev\/pts\//);
  // Ctrl-C reaches the foreground job as SIGINT: the sleep ends at once
  // and the rest of its line never runs.
  await page.keyboard.type('sleep 300; echo not-interrupted');
  await page.keyboard.press('Enter');
  await page.waitForTimeout(700);
  const t0 = Date.now();
  await page.keyboard.press('Control+C');
  await waitTerm(/not-interrupted\s*\n.*\$\s*$/, 10_000); // the next prompt
  await page.keyboard.type('echo after-$((1+1)) > /home/user/made-in-terminal.txt; cat /home/user/made-in-terminal.txt');
  await page.keyboard.press('Enter');
  const t = await waitTerm(/^after-2\s*$/m, 10_000);
  assert.ok(Date.now() - t0 < 10_000);
  assert.doesNotMatch(t, /^not-interrupted/m);
  await shot('terminal');
});

test('files: list, upload and download over the data plane', { timeout: 2 * MIN }, async () => {
  await page.locator('[data-tab=files]').click();
  const made = page.locator('tr[data-file="made-in-terminal.txt"]');
  await made.waitFor({ timeout: 30_000 });
  assert.match(await made.innerText(), /\b8 B\b/);
  const content = `uploaded by the console ${Date.now()}\n`;
  await page.getByTestId('files-upload').setInputFiles({ name: 'upload.txt', mimeType: 'text/plain', buffer: Buffer.from(content) });
  await page.locator('[data-testid=files-msg]').filter({ hasText: 'uploaded upload.txt' }).waitFor();
  await page.locator('tr[data-file="upload.txt"]').waitFor();
  for (const [name, want] of [
    ['upload.txt', content],
    ['made-in-terminal.txt', 'after-2\n'],
  ]) {
    const [dl] = await Promise.all([page.waitForEvent('download'), page.getByTestId(`download-${name}`).click()]);
    assert.equal(dl.suggestedFilename(), name);
    assert.equal(readFileSync(await dl.path(), 'utf8'), want, `downloaded ${name}`);
  }
  // Into a directory and back.
  await page.getByTestId('files-path').fill('/etc');
  await page.getByTestId('files-path').press('Enter');
  await page.locator('tr[data-file="hostname"]').waitFor();
  await page.getByTestId('files-path').fill('/home/user');
  await page.getByTestId('files-path').press('Enter');
  await page.locator('tr[data-file="upload.txt"]').waitFor();
  await shot('files');
});

test('events: the sandbox\'s live events', async () => {
  await page.locator('[data-tab=events]').click();
  const table = page.getByTestId('sandbox-events');
  await table.locator('[data-state=running]').first().waitFor();
  const text = await table.innerText();
  assert.match(text, /sandbox\.state/);
  assert.match(text, /operation\.state/);
  assert.match(text, /create/);
});

test('operations: the create operation succeeded', async () => {
  await page.locator('[data-nav=operations]').click();
  const row = page.getByTestId('operations').locator('tr', { hasText: sandboxId }).filter({ hasText: 'create' });
  await row.locator('[data-state=succeeded]').waitFor();
  await shot('operations');
});

test('templates and a build with its progress', { timeout: 8 * MIN }, async () => {
  await page.locator('[data-nav=templates]').click();
  await page.locator('[data-testid=templates] tr[data-template="base:latest"]').waitFor();
  await page.getByTestId('build-name').fill('console-e2e');
  // A step of its own each run: the build cache (shared by test runs)
  // would otherwise answer it without output.
  const run = Date.now().toString(36);
  await page.getByTestId('build-steps').fill(`RUN echo built-by-console-$((2*21)) ${run}\nENV GREETING hello`);
  await page.getByTestId('build-start').click();
  await page.getByTestId('build-log').waitFor();
  await page.getByTestId('build-log').filter({ hasText: new RegExp(`^built-by-console-42 ${run}$`, 'm') }).waitFor({ timeout: 7 * MIN });
  await page.locator('[data-testid=build-head] [data-state=ready]').waitFor({ timeout: 3 * MIN });
  assert.equal(await page.getByTestId('build-progress').evaluate((p) => p.value), 1);
  assert.match(await page.getByTestId('build-log').innerText(), /==> done: sha256:/);
  await shot('build');
  await page.locator('a[href="#/templates"]').first().click();
  await page.locator('[data-testid=templates] tr[data-template="console-e2e:latest"]').waitFor({ timeout: 30_000 });
  const b = page.locator('[data-testid=builds] tr', { hasText: 'console-e2e' }).first();
  await b.locator('[data-state=ready]').waitFor();
  await shot('templates');
});

test('admin: orgs, keys, quotas and network profiles', { timeout: 2 * MIN }, async () => {
  await page.locator('[data-nav=admin]').click();
  await page.locator('[data-testid=orgs] tr[data-org="org-default"]').waitFor();
  const orgName = `console-${Date.now().toString(36)}`;
  await page.getByTestId('org-name').fill(orgName);
  await page.getByTestId('create-org').click();
  const orgRow = page.locator('[data-testid=orgs] tr', { hasText: orgName });
  await orgRow.waitFor();
  const orgId = /org-[a-z0-9]+/.exec(await orgRow.innerText())[0];
  await page.locator(`[data-testid=org-detail] h3`, { hasText: orgName }).waitFor();
  // A key, shown once, that works.
  await page.getByTestId('key-name').fill('console-ci');
  await page.getByTestId('create-key').click();
  const secret = await page.getByTestId('new-secret').textContent();
  assert.match(secret, /^al_[0-9a-f]{40}$/);
  await page.locator('[data-testid=keys] tr[data-key="console-ci"]').waitFor();
  const r = await fetch(`${url}/v1/sandboxes`, { headers: { Authorization: `Bearer ${secret}` } });
  assert.equal(r.status, 200, 'the key made in the console works');
  // Quotas.
  await page.locator('[data-quota=sandboxes]').fill('3');
  await page.locator('[data-quota=vcpus]').fill('4');
  await page.getByTestId('save-quotas').click();
  await page.locator('.msg.ok', { hasText: `quotas of ${orgId} saved` }).waitFor();
  await page.locator(`[data-testid=orgs] tr[data-org="${orgId}"]`, { hasText: 'sandboxes 0/3' }).waitFor();
  const org = await apiGet(`/v1/orgs/${orgId}`);
  assert.equal(org.quotas.sandboxes, 3);
  assert.equal(org.quotas.vcpus, 4);
  // Network profiles: the built-in ones, then one of ours.
  await page.locator('[data-testid=profiles] tr[data-profile="none"]').waitFor();
  await page.locator('[data-testid=profiles] tr[data-profile="public"]').waitFor();
  await page.getByTestId('profile-name').fill('console-pypi');
  await page.getByTestId('save-profile').click();
  await page.locator('[data-testid=profiles] tr[data-profile="console-pypi"]', { hasText: 'pypi.org' }).waitFor();
  const p = await apiGet('/v1/network-profiles/console-pypi');
  assert.equal(p.policy.rules[0].domains[0], 'pypi.org');
  // Revoke the key from the page: it stops working.
  await page.locator('[data-testid=keys] tr[data-key="console-ci"] button', { hasText: 'Revoke' }).click();
  await page.locator('[data-testid=keys] tr[data-key="console-ci"] [data-state=revoked]').waitFor();
  const r2 = await fetch(`${url}/v1/sandboxes`, { headers: { Authorization: `Bearer ${secret}` } });
  assert.equal(r2.status, 401);
  await page.locator(`a[href="#/admin/org-default"]`).click();
  await page.locator('[data-testid=keys] tr').nth(1).waitFor();
  await shot('admin');
});

test('delete the sandbox from its page', { timeout: 3 * MIN }, async () => {
  await page.goto(`${url}/ui/#/sandboxes/${sandboxId}/events`);
  await page.locator('[data-testid=sandbox-head] [data-state=running]').waitFor();
  await page.locator('[data-action=delete]').click();
  await page.locator('[data-testid=sandbox-head] [data-state=deleted]').waitFor({ timeout: 2 * MIN });
  const sb = await apiGet(`/v1/sandboxes/${sandboxId}`);
  assert.equal(sb.state, 'deleted');
});

test('a non-admin key: no admin page; sign out forgets the key', async () => {
  const r = await fetch(`${url}/v1/orgs/org-default/keys`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ name: 'console-member', admin: false }),
  });
  assert.equal(r.status, 201);
  const { secret } = await r.json();
  await page.getByTestId('sign-out').click();
  await page.getByTestId('login-key').waitFor();
  assert.equal(await page.evaluate(() => sessionStorage.getItem('airlock.apiKey')), null);
  await page.getByTestId('login-key').fill(secret);
  await page.getByTestId('login-submit').click();
  await page.getByTestId('sandboxes').waitFor();
  assert.equal(await page.locator('[data-nav=admin]').count(), 0);
  await page.goto(`${url}/ui/#/admin`);
  await page.locator('main .msg.error', { hasText: 'not an admin key' }).waitFor();
  // The page asks GET /v1/orgs to learn whether the key is an admin's; its
  // 403 is logged by Chromium as a console error: expected here.
  problems.splice(0, problems.length, ...problems.filter((p) => !/status of 403/.test(p)));
});

test('no console errors and no CSP violations on any page', () => {
  assert.deepEqual(problems, []);
});
