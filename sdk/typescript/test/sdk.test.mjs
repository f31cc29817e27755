// Streaming, background commands with stdin and signals, PTY, events and
// typed errors, against the real Airlock.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, connect } from 'node:net';
import { useAirlock, runId, sdk } from './helpers.mjs';

const ctx = await useAirlock();
let sb;
const run = runId();

before(async () => {
  if (ctx.skip) return;
  sb = await ctx.client.sandboxes.create({ template: 'base', metadata: { sdktest: run }, env: { GREETING: 'hi' } });
}, { timeout: 5 * 60_000 });

after(async () => {
  await sb?.delete().catch(() => {});
}, { timeout: 2 * 60_000 });

const skip = (t) => (ctx.skip ? (t.skip(ctx.skip), true) : false);

test('the sandbox runs and refreshes', async (t) => {
  if (skip(t)) return;
  assert.match(sb.id, /^sb-/);
  assert.equal(sb.state, 'running');
  await sb.refresh();
  assert.equal(sb.state, 'running');
  assert.equal(sb.metadata.sdktest, run);
  const page = await ctx.client.sandboxes.listPage({ metadata: { sdktest: run }, limit: 1 });
  assert.deepEqual(page.sandboxes.map((s) => s.id), [sb.id]);
  const same = await ctx.client.sandboxes.get(sb.id);
  assert.equal(same.id, sb.id);
});

test('run with onStdout/onStderr callbacks streams output as it comes', async (t) => {
  if (skip(t)) return;
  const outs = [];
  const errs = [];
  const stamps = [];
  const t0 = Date.now();
  const r = await sb.commands.run('for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.4; done', {
    onStdout: (s) => { outs.push(s); stamps.push(Date.now() - t0); },
    onStderr: (s) => errs.push(s),
  });
  assert.equal(r.exitCode, 0);
  assert.equal(r.stdout, 'out1\nout2\nout3\n');
  assert.equal(r.stderr, 'err1\nerr2\nerr3\n');
  assert.equal(outs.join(''), r.stdout);
  assert.equal(errs.join(''), r.stderr);
  // The first line arrived well before the command ended.
  assert.ok(stamps[0] < Date.now() - t0 - 500, `first stdout at ${stamps[0]} ms, the command took ${Date.now() - t0} ms`);
});

test('start: async iteration over output events, then wait', async (t) => {
  if (skip(t)) return;
  const h = await sb.commands.start('echo one; sleep 0.3; echo two >&2; sleep 0.3; printf three');
  const seen = [];
  for await (const ev of h) {
    assert.ok(ev.data instanceof Uint8Array);
    seen.push(`${ev.type}:${ev.text}`);
  }
  const r = await h.wait();
  assert.equal(r.exitCode, 0);
  assert.deepEqual(seen.join('|').replace(/\n/g, ''), 'stdout:one|stderr:two|stdout:three');
  assert.equal(r.stdout, 'one\nthree');
});

test('background command: stdin, closeStdin', async (t) => {
  if (skip(t)) return;
  const h = await sb.commands.start('tr a-z A-Z', { stdin: true });
  await h.sendStdin('hello ');
  await h.sendStdin(new TextEncoder().encode('bytes'));
  await h.closeStdin();
  const r = await h.wait();
  assert.equal(r.exitCode, 0);
  assert.equal(r.stdout, 'HELLO BYTES');
});

test('background command: a signal ends it', async (t) => {
  if (skip(t)) return;
  const h = await sb.commands.start('echo started; sleep 600');
  // Wait until it runs (its first output), then signal it.
  const it = h[Symbol.asyncIterator]();
  const first = await it.next();
  assert.equal(first.value.text, 'started\n');
  await h.signal('TERM');
  const r = await h.wait();
  assert.equal(r.signal, 'TERM');
  assert.equal(r.exitCode, -1);
  assert.equal(r.timedOut, false);
});

test('command env, cwd, argv and the sandbox env', async (t) => {
  if (skip(t)) return;
  const r = await sb.commands.run('', { argv: ['sh', '-c', 'echo "$GREETING $X $(pwd)"'], env: { X: 'y' }, cwd: '/tmp' });
  assert.equal(r.stdout, 'hi y /tmp\n');
});

test('pty: start with a terminal size, resize', async (t) => {
  if (skip(t)) return;
  let h;
  try {
    h = await sb.commands.start('stty size; read line; stty size; echo "got $line"', { pty: { cols: 100, rows: 30 } });
  } catch (err) {
    if (err instanceof sdk.InvalidRequestError && /pty/i.test(err.message)) {
      const msg = `SKIPPING test "pty: start with a terminal size, resize": the server refuses "pty" (${err.status} ${err.code}: ${err.message}); its pty support is not in this build yet`;
      console.error(`\n!!! ${msg}\n`);
      return t.skip(msg);
    }
    throw err;
  }
  let out = '';
  const it = h[Symbol.asyncIterator]();
  while (!out.includes('30 100')) {
    const n = await it.next();
    assert.ok(!n.done, `pty output ended early: ${JSON.stringify(out)}`);
    out += n.value.text;
  }
  await h.resize(120, 40);
  await h.sendStdin('ok\r');
  for (;;) {
    const n = await it.next();
    if (n.done) break;
    out += n.value.text;
  }
  const r = await h.wait();
  assert.equal(r.exitCode, 0);
  assert.match(out, /40 120/);
  assert.match(out, /got ok/);
});

test('files: bytes, streams, list, exists', async (t) => {
  if (skip(t)) return;
  const dir = `/home/user/sdk-${run}`;
  const bytes = new Uint8Array(300_000).map((_, i) => i % 251);
  const fi = await sb.files.write(`${dir}/bin.dat`, bytes);
  assert.equal(fi.size, bytes.length);
  const back = await sb.files.read(`${dir}/bin.dat`, { format: 'bytes' });
  assert.deepEqual(Buffer.from(back), Buffer.from(bytes));
  const stream = new ReadableStream({
    start(c) {
      c.enqueue(new TextEncoder().encode('streamed '));
      c.enqueue(new TextEncoder().encode('text'));
      c.close();
    },
  });
  await sb.files.write(`${dir}/s.txt`, stream);
  const rs = await sb.files.read(`${dir}/s.txt`, { format: 'stream' });
  let text = '';
  for await (const chunk of rs) text += new TextDecoder().decode(chunk);
  assert.equal(text, 'streamed text');
  const names = (await sb.files.list(dir)).map((e) => `${e.name}:${e.type}`);
  assert.deepEqual(names, ['bin.dat:file', 's.txt:file']);
  const p1 = await sb.files.listPage(dir, { limit: 1 });
  assert.deepEqual(p1.entries.map((e) => e.name), ['bin.dat']);
  assert.ok(p1.nextCursor);
  const p2 = await sb.files.listPage(dir, { limit: 1, cursor: p1.nextCursor });
  assert.deepEqual(p2.entries.map((e) => e.name), ['s.txt']);
  assert.equal(await sb.files.exists(`${dir}/nope`), false);
  await sb.files.remove(dir, { recursive: true });
  assert.equal(await sb.files.exists(dir), false);
});

test('events: the iterator sees a state change', { timeout: 5 * 60_000 }, async (t) => {
  if (skip(t)) return;
  // The stream starts at the oldest event: skip what happened before.
  const seen = [];
  const ctl = new AbortController();
  const watch = (async () => {
    for await (const ev of ctx.client.events({ sandboxId: sb.id, signal: ctl.signal })) {
      seen.push(ev);
      if (ev.type === 'sandbox.state' && ev.data.state === 'paused') return ev;
    }
  })();
  await sb.pause();
  let timer;
  const ev = await Promise.race([watch, new Promise((_, rej) => (timer = setTimeout(() => rej(new Error('no paused event in 60 s')), 60_000)))]);
  clearTimeout(timer);
  ctl.abort();
  assert.equal(ev.sandbox_id, sb.id);
  assert.ok(ev.seq > 0);
  // Resuming from the last seq sees only newer events.
  await sb.resume();
  for await (const e of sb.events({ after: ev.seq })) {
    assert.ok(e.seq > ev.seq);
    if (e.type === 'sandbox.state' && e.data.state === 'running') break;
  }
  assert.equal(sb.state, 'running');
});

test('a command outlives a suspend: the stream re-attaches from its offset (close 1013)', { timeout: 5 * 60_000 }, async (t) => {
  if (skip(t)) return;
  const h = await sb.commands.start('for i in $(seq 1 12); do echo line$i; sleep 0.5; done');
  const it = h[Symbol.asyncIterator]();
  let out = '';
  while (!out.includes('line3\n')) {
    const n = await it.next();
    assert.ok(!n.done);
    out += n.value.text;
  }
  const t0 = Date.now();
  await sb.suspend();
  t.diagnostic(`suspended in ${Date.now() - t0} ms; the handle re-attaches (and so wakes the sandbox)`);
  for (;;) {
    const n = await it.next();
    if (n.done) break;
    out += n.value.text;
  }
  const r = await h.wait();
  assert.equal(r.exitCode, 0);
  const want = Array.from({ length: 12 }, (_, i) => `line${i + 1}\n`).join('');
  assert.equal(r.stdout, want, 'no output lost or repeated');
  assert.equal(out, want);
  await sb.refresh();
  if (sb.state !== 'running') await sb.wake();
});

test('a dropped attach connection is re-attached from the output offset', { timeout: 2 * 60_000 }, async (t) => {
  if (skip(t)) return;
  // A TCP relay in front of the worker's data plane cuts the first
  // connection once "line3" went through; the handle must re-attach with
  // ?offset=N and lose or repeat nothing.
  const session = await ctx.client.request(`/v1/sandboxes/${sb.id}/commands`, {
    method: 'POST',
    json: { cmd: 'for i in $(seq 1 8); do echo line$i; sleep 0.3; done' },
  });
  const target = new URL(session.attach_url);
  const paths = [];
  let conns = 0;
  const relay = createServer((down) => {
    const first = conns++ === 0;
    const up = connect(Number(target.port), target.hostname);
    let seen = '';
    down.on('data', (b) => {
      const m = /GET (\S+)/.exec(b.toString('latin1'));
      if (m) paths.push(m[1]);
      up.write(b);
    });
    up.on('data', (b) => {
      down.write(b);
      seen += b.toString('latin1');
      if (first && seen.includes('line3')) {
        up.destroy();
        down.destroy();
      }
    });
    up.on('error', () => down.destroy());
    down.on('error', () => up.destroy());
    up.on('close', () => down.destroy());
    down.on('close', () => up.destroy());
  });
  await new Promise((r) => relay.listen(0, '127.0.0.1', r));
  try {
    const via = new URL(session.attach_url);
    via.hostname = '127.0.0.1';
    via.port = String(relay.address().port);
    const h = new sdk.CommandHandle({ ...session, attach_url: via.toString() }, {});
    const r = await h.wait();
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, Array.from({ length: 8 }, (_, i) => `line${i + 1}\n`).join(''));
    assert.ok(conns >= 2, `the relay saw ${conns} connection(s)`);
    assert.match(paths[0], /offset=0/);
    assert.match(paths[1], /offset=([1-9]\d*)/, `re-attached at ${paths[1]}`);
    t.diagnostic(`attaches: ${paths.map((p) => new URL(p, 'http://x').searchParams.get('offset')).join(', ')}`);
  } finally {
    relay.close();
  }
});

test('typed errors', async (t) => {
  if (skip(t)) return;
  const bad = new sdk.Airlock({ url: ctx.url, apiKey: 'al_' + '0'.repeat(40) });
  await assert.rejects(bad.sandboxes.get(sb.id), (e) => e instanceof sdk.UnauthorizedError && e instanceof sdk.AirlockError && e.status === 401 && e.code === 'unauthorized');
  await assert.rejects(ctx.client.sandboxes.get('sb-doesnotexist'), (e) => e instanceof sdk.NotFoundError && e.status === 404);
  await assert.rejects(ctx.client.sandboxes.create({ resources: { vcpus: 99 } }), (e) => e instanceof sdk.InvalidRequestError && e.status === 422);
  await assert.rejects(sb.resume(), (e) => e instanceof sdk.ConflictError && e.status === 409);
  await assert.rejects(sb.files.read('/home/user/no-such-file'), sdk.NotFoundError);
  const down = new sdk.Airlock({ url: 'http://127.0.0.1:9', apiKey: 'x' });
  await assert.rejects(down.sandboxes.get('sb-x'), sdk.UnavailableError);
  // The checkpoint feature gate is off by default: forbidden.
  await assert.rejects(sb.checkpoint('cp1'), (e) => e instanceof sdk.ForbiddenError && /snapshots/.test(e.message));
});

test('checkpoints: checkpoint, rollback, fork, export and import', { timeout: 8 * 60_000 }, async (t) => {
  if (skip(t)) return;
  const c = ctx.client;
  // The feature gate is off by default (the typed-errors test saw a 403); the admin key turns it on.
  await c.request('/v1/orgs/org-default', { method: 'PATCH', json: { features: ['snapshots'] } });
  const forks = [];
  try {
    const name = `cp-${run}`;
    await sb.files.write('/home/user/cp.txt', 'before');
    const cp = await sb.checkpoint(name);
    assert.equal(cp.name, name);
    assert.ok(cp.bytes > 0);
    assert.deepEqual((await sb.checkpoints()).map((x) => x.name), [name]);
    await assert.rejects(sb.checkpoint(name), sdk.ConflictError);
    await sb.files.write('/home/user/cp.txt', 'after');
    await sb.rollback(name);
    assert.equal(sb.state, 'running');
    assert.equal(await sb.files.read('/home/user/cp.txt'), 'before');
    await assert.rejects(sb.rollback('no-such-checkpoint'), sdk.NotFoundError);

    const [f] = await sb.fork(name, { metadata: { family: run } });
    forks.push(f);
    assert.equal(f.state, 'running');
    assert.notEqual(f.id, sb.id);
    assert.equal(await f.files.read('/home/user/cp.txt'), 'before');

    const tar = new Uint8Array(await new Response(await sb.exportCheckpoint(name)).arrayBuffer());
    t.diagnostic(`export: ${tar.length} bytes`);
    assert.ok(tar.length > 1024);
    const imp = await c.sandboxes.import(tar, { metadata: { family: run } });
    forks.push(imp);
    assert.equal(imp.state, 'running');
    assert.equal((await imp.commands.run('cat /home/user/cp.txt')).stdout, 'before');

    // list follows every page: two sandboxes, one per page.
    const first = await c.sandboxes.listPage({ metadata: { family: run }, limit: 1 });
    assert.equal(first.sandboxes.length, 1);
    assert.ok(first.nextCursor, 'a first page of 1 of 2 has a next cursor');
    const ids = [];
    for await (const x of c.sandboxes.list({ metadata: { family: run }, limit: 1 })) ids.push(x.id);
    assert.deepEqual(ids.sort(), [f.id, imp.id].sort());
  } finally {
    for (const f of forks) await f.delete().catch(() => {});
    await c.request('/v1/orgs/org-default', { method: 'PATCH', json: { features: [] } }).catch(() => {});
  }
});
