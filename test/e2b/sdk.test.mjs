// The unmodified E2B JS SDK (npm e2b, pinned in package.json) against a real
// Airlock. Run by internal/e2e/e2b_test.go, which starts Airlock and sets:
//   E2B_API_URL = E2B_SANDBOX_URL = the server URL, E2B_API_KEY = an e2b_ key.
// By hand: E2B_API_URL=… E2B_SANDBOX_URL=… E2B_API_KEY=… node --test test/e2b/
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import {
  Sandbox,
  CommandExitError,
  NotFoundError,
  AuthenticationError,
  FileType,
  Secret,
  Volume,
} from 'e2b'

const apiUrl = process.env.E2B_API_URL
const T = { timeout: 5 * 60_000 }
const RUN = `run-${Date.now()}-${Math.floor(Math.random() * 1e6)}`

if (!apiUrl || !process.env.E2B_API_KEY) {
  test('E2B SDK suite', { skip: 'E2B_API_URL and E2B_API_KEY are not set (internal/e2e/e2b_test.go sets them)' }, () => {})
} else {
  suite()
}

// eventually polls f until it returns a truthy value (bounded, no timing
// assertion: the bound only stops a broken system from hanging the suite).
async function eventually(what, f, tries = 240, delayMs = 500) {
  let last
  for (let i = 0; i < tries; i++) {
    try {
      const v = await f()
      if (v) return v
    } catch (e) {
      last = e
    }
    await new Promise((r) => setTimeout(r, delayMs))
  }
  throw new Error(`${what} did not happen${last ? `: last error ${last}` : ''}`)
}

function suite() {
  let sbx

  before(async () => {
    sbx = await Sandbox.create('base', {
      envs: { SUITE_VAR: 'from-create' },
      metadata: { suite: RUN, role: 'main' },
      timeoutMs: 20 * 60_000,
    })
  })

  after(async () => {
    if (sbx) await sbx.kill().catch(() => {})
  })

  test('a bad API key is rejected', T, async () => {
    const p = Sandbox.list({ apiKey: 'e2b_' + '0'.repeat(40) })
    await assert.rejects(p.nextItems(), AuthenticationError)
    await assert.rejects(Sandbox.create('base', { apiKey: 'e2b_' + 'f'.repeat(40) }), AuthenticationError)
  })

  test('create with envs and metadata; getInfo', T, async () => {
    assert.match(sbx.sandboxId, /^sb-/)
    const r = await sbx.commands.run('echo "$SUITE_VAR"; whoami; pwd')
    assert.equal(r.stdout, 'from-create\nuser\n/home/user\n')
    const info = await sbx.getInfo()
    assert.equal(info.sandboxId, sbx.sandboxId)
    assert.equal(info.state, 'running')
    assert.equal(info.metadata.suite, RUN)
    assert.equal(info.metadata.role, 'main')
    assert.ok(info.endAt > info.startedAt, 'endAt after startedAt')
    assert.ok(await sbx.isRunning())
  })

  test('commands.run: streaming, exit codes, CommandExitError, large output', T, async () => {
    const out = []
    const err = []
    const r = await sbx.commands.run('for i in 1 2 3; do echo out$i; echo err$i >&2; done', {
      onStdout: (d) => out.push(d),
      onStderr: (d) => err.push(d),
    })
    assert.equal(r.exitCode, 0)
    assert.equal(out.join(''), 'out1\nout2\nout3\n')
    assert.equal(err.join(''), 'err1\nerr2\nerr3\n')
    assert.equal(r.stdout, 'out1\nout2\nout3\n')

    await assert.rejects(sbx.commands.run('echo before; exit 7'), (e) => {
      assert.ok(e instanceof CommandExitError, `got ${e}`)
      assert.equal(e.exitCode, 7)
      assert.equal(e.stdout, 'before\n')
      return true
    })

    const envs = await sbx.commands.run('echo "$A-$SUITE_VAR"', { envs: { A: 'cmd' }, cwd: '/tmp' })
    assert.equal(envs.stdout, 'cmd-from-create\n')

    const n = 4 * 1024 * 1024
    const big = await sbx.commands.run(`head -c ${n} /dev/zero | tr '\\0' a`)
    assert.equal(big.stdout.length, n)
    assert.ok(/^a+$/.test(big.stdout))
  })

  test('background commands: wait, list, kill', T, async () => {
    const h = await sbx.commands.run('echo started; sleep 1; echo finished', { background: true })
    assert.ok(h.pid > 0)
    const r = await h.wait()
    assert.equal(r.stdout, 'started\nfinished\n')

    const sleeper = await sbx.commands.run('sleep 600', { background: true, timeoutMs: 0 })
    const listed = await sbx.commands.list()
    assert.ok(listed.some((p) => p.pid === sleeper.pid), `pid ${sleeper.pid} in ${JSON.stringify(listed)}`)
    assert.equal(await sleeper.kill(), true)
    await assert.rejects(sleeper.wait(), CommandExitError)
    assert.equal(await sbx.commands.kill(999999), false)
  })

  test('sendStdin', T, async () => {
    const h = await sbx.commands.run('read a; read b; echo "got:$a:$b"', { background: true, stdin: true })
    await sbx.commands.sendStdin(h.pid, 'one\n')
    await sbx.commands.sendStdin(h.pid, 'two\n')
    const r = await h.wait()
    assert.equal(r.stdout, 'got:one:two\n')
  })

  test('PTY: input and resize', T, async () => {
    const chunks = []
    const dec = new TextDecoder()
    const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => chunks.push(dec.decode(d)) })
    const enc = new TextEncoder()
    await sbx.pty.resize(pty.pid, { cols: 120, rows: 40 })
    await sbx.pty.sendInput(pty.pid, enc.encode('stty size; echo $((6*7))x\nexit\n'))
    await pty.wait().catch(() => {})
    const text = chunks.join('')
    assert.match(text, /40 120/)
    assert.match(text, /42x/)
  })

  test('files: write, read, list, exists, getInfo, makeDir, rename, remove', T, async () => {
    const dir = `/home/user/files-${RUN}`
    assert.equal(await sbx.files.makeDir(dir), true)
    assert.equal(await sbx.files.makeDir(dir), false)

    const w = await sbx.files.write(`${dir}/hello.txt`, 'hello world')
    assert.equal(w.path, `${dir}/hello.txt`)
    assert.equal(await sbx.files.read(`${dir}/hello.txt`), 'hello world')

    const bytes = new Uint8Array(256).map((_, i) => i)
    await sbx.files.write(`${dir}/bin.dat`, bytes.buffer)
    const back = await sbx.files.read(`${dir}/bin.dat`, { format: 'bytes' })
    assert.deepEqual(Array.from(back), Array.from(bytes))

    const many = await sbx.files.write([
      { path: `${dir}/m/a.txt`, data: 'A' },
      { path: `${dir}/m/b.txt`, data: 'B' },
    ])
    assert.equal(many.length, 2)

    const stream = await sbx.files.read(`${dir}/m/a.txt`, { format: 'stream' })
    let s = ''
    for await (const c of stream) s += new TextDecoder().decode(c)
    assert.equal(s, 'A')

    const names = (await sbx.files.list(dir)).map((e) => e.name).sort()
    assert.deepEqual(names, ['bin.dat', 'hello.txt', 'm'])

    assert.equal(await sbx.files.exists(`${dir}/hello.txt`), true)
    assert.equal(await sbx.files.exists(`${dir}/nope`), false)

    const info = await sbx.files.getInfo(`${dir}/bin.dat`)
    assert.equal(info.type, FileType.FILE)
    assert.equal(info.size, 256)
    assert.equal(info.name, 'bin.dat')
    assert.equal((await sbx.files.getInfo(`${dir}/m`)).type, FileType.DIR)

    const moved = await sbx.files.rename(`${dir}/hello.txt`, `${dir}/moved.txt`)
    assert.equal(moved.path, `${dir}/moved.txt`)
    assert.equal(await sbx.files.exists(`${dir}/hello.txt`), false)

    await sbx.files.remove(`${dir}/m`)
    assert.equal(await sbx.files.exists(`${dir}/m`), false)
    await assert.rejects(sbx.files.read(`${dir}/m/a.txt`), NotFoundError)

    // Written files belong to the default user, as in E2B.
    const own = await sbx.commands.run(`stat -c %U ${dir}/moved.txt`)
    assert.equal(own.stdout.trim(), 'user')
  })

  test('files.watchDir', T, async () => {
    const dir = `/home/user/watch-${RUN}`
    await sbx.files.makeDir(dir)
    const events = []
    const handle = await sbx.files.watchDir(dir, (e) => events.push(e))
    await sbx.files.write(`${dir}/new.txt`, 'x')
    await eventually('a watch event for new.txt', () => events.some((e) => e.name === 'new.txt'))
    await handle.stop()
  })

  test('web server in the sandbox reached through header routing', T, async () => {
    await sbx.files.write('/tmp/www/index.html', 'served from the sandbox')
    await sbx.commands.run('cd /tmp/www && python3 -m http.server 8000', { background: true, timeoutMs: 0 })
    const body = await eventually('the web server answering', async () => {
      const res = await fetch(`${apiUrl}/index.html`, {
        headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' },
      })
      return res.status === 200 ? res.text() : undefined
    })
    assert.equal(body, 'served from the sandbox')
    assert.equal(sbx.getHost(8000), `8000-${sbx.sandboxId}.${sbx.sandboxDomain ?? 'e2b.app'}`)
  })

  test('allowPublicTraffic false: ports need the trafficAccessToken', T, async () => {
    const priv = await Sandbox.create('base', { network: { allowPublicTraffic: false }, timeoutMs: 5 * 60_000 })
    try {
      assert.match(priv.trafficAccessToken ?? '', /^tt_/)
      assert.equal(sbx.trafficAccessToken, undefined) // E2B's default: public
      await priv.files.write('/tmp/www/index.html', 'private page')
      await priv.commands.run('cd /tmp/www && python3 -m http.server 8002', { background: true, timeoutMs: 0 })
      const hdr = { 'E2b-Sandbox-Id': priv.sandboxId, 'E2b-Sandbox-Port': '8002' }
      const body = await eventually('the private web server answering', async () => {
        const res = await fetch(`${apiUrl}/index.html`, { headers: { ...hdr, 'e2b-traffic-access-token': priv.trafficAccessToken } })
        return res.status === 200 ? res.text() : undefined
      })
      assert.equal(body, 'private page')
      const res = await fetch(`${apiUrl}/index.html`, { headers: hdr })
      assert.equal(res.status, 401)
      assert.match((await res.json()).message, /traffic token/)
      const info = await priv.getInfo()
      assert.equal(info.network?.allowPublicTraffic, false)
      const again = await Sandbox.connect(priv.sandboxId)
      assert.equal(again.trafficAccessToken, priv.trafficAccessToken)
    } finally {
      await priv.kill().catch(() => {})
    }
  })

  test('an upgraded connection (as a WebSocket) to a port in the sandbox', T, async () => {
    await sbx.files.write(
      '/tmp/upgrade_echo.py',
      [
        'import http.server',
        'class H(http.server.BaseHTTPRequestHandler):',
        "    protocol_version = 'HTTP/1.1'",
        '    def do_GET(self):',
        '        self.send_response(101)',
        "        self.send_header('Upgrade', 'echo')",
        "        self.send_header('Connection', 'Upgrade')",
        '        self.end_headers()',
        '        self.wfile.flush()',
        '        while True:',
        '            line = self.rfile.readline()',
        '            if not line:',
        '                break',
        "            self.wfile.write(b'echo:' + line)",
        '            self.wfile.flush()',
        "http.server.HTTPServer(('127.0.0.1', 8001), H).serve_forever()",
      ].join('\n'),
    )
    await sbx.commands.run('python3 /tmp/upgrade_echo.py', { background: true, timeoutMs: 0 })
    const u = new URL(apiUrl)
    const upgrade = () =>
      new Promise((resolve, reject) => {
        const req = http.request({
          host: u.hostname,
          port: u.port,
          path: '/chat',
          agent: false, // no keep-alive socket left behind
          headers: { Connection: 'Upgrade', Upgrade: 'echo', 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8001' },
        })
        req.on('upgrade', (res, socket) => resolve(socket))
        req.on('response', (res) => {
          res.resume()
          reject(new Error(`no upgrade: ${res.statusCode}`))
        })
        req.on('error', reject)
        req.end()
      })
    const socket = await eventually('the upgrade server answering', upgrade)
    const reply = await new Promise((resolve, reject) => {
      let buf = ''
      socket.on('data', (d) => {
        buf += d.toString()
        if (buf.includes('\n')) resolve(buf)
      })
      socket.on('error', reject)
      socket.write('ping\n')
    })
    socket.destroy()
    assert.equal(reply, 'echo:ping\n')
  })

  test('getMetrics', T, async () => {
    const m = await sbx.getMetrics()
    assert.ok(Array.isArray(m) && m.length >= 1, `metrics: ${JSON.stringify(m)}`)
    for (const x of m) {
      assert.ok(x.cpuCount >= 1)
      assert.ok(x.memTotal > 0)
    }
  })

  test('Sandbox.list with metadata and state filters', T, async () => {
    const other = await Sandbox.create('base', { metadata: { suite: RUN, role: 'other' }, timeoutMs: 10 * 60_000 })
    try {
      const mine = await Sandbox.list({ query: { metadata: { suite: RUN } } }).nextItems()
      assert.deepEqual(mine.map((s) => s.sandboxId).sort(), [sbx.sandboxId, other.sandboxId].sort())
      const main = await Sandbox.list({ query: { metadata: { suite: RUN, role: 'main' } } }).nextItems()
      assert.deepEqual(main.map((s) => s.sandboxId), [sbx.sandboxId])
      const running = await Sandbox.list({ query: { metadata: { suite: RUN }, state: ['running'] } }).nextItems()
      assert.equal(running.length, 2)
      const paused = await Sandbox.list({ query: { metadata: { suite: RUN }, state: ['paused'] } }).nextItems()
      assert.equal(paused.length, 0)
      const p = Sandbox.list({ query: { metadata: { suite: RUN } }, limit: 1 })
      const first = await p.nextItems()
      assert.equal(first.length, 1)
      assert.equal(p.hasNext, true)
      const second = await p.nextItems()
      assert.equal(second.length, 1)
      assert.notEqual(first[0].sandboxId, second[0].sandboxId)
    } finally {
      await other.kill()
    }
  })

  test('setTimeout: the sandbox ends when it expires', T, async () => {
    const s = await Sandbox.create('base', { metadata: { suite: RUN, role: 'timeout' } })
    await s.setTimeout(2_000)
    await eventually('the sandbox ending after its timeout', async () => !(await s.isRunning()))
    await assert.rejects(s.getInfo(), NotFoundError)
  })

  test('kill: isRunning false, connect throws NotFoundError', T, async () => {
    const s = await Sandbox.create('base', { metadata: { suite: RUN, role: 'kill' } })
    assert.equal(await s.isRunning(), true)
    assert.equal(await s.kill(), true)
    assert.equal(await s.isRunning(), false)
    await assert.rejects(Sandbox.connect(s.sandboxId), NotFoundError)
    assert.equal(await Sandbox.kill(s.sandboxId), false)
  })

  test('pause, then connect resumes with files and a background process', T, async () => {
    const s = await Sandbox.create('base', { metadata: { suite: RUN, role: 'pause' }, timeoutMs: 10 * 60_000 })
    try {
      await s.files.write('/home/user/kept.txt', 'kept across pause')
      const bg = await s.commands.run('sleep 900', { background: true, timeoutMs: 0 })
      assert.equal(await s.pause(), true)
      assert.equal(await s.isRunning(), false)
      assert.equal((await s.getInfo()).state, 'paused')
      assert.equal(await s.pause(), false, 'pausing a paused sandbox answers false (409)')

      const back = await Sandbox.connect(s.sandboxId)
      assert.equal(await back.isRunning(), true)
      assert.equal(await back.files.read('/home/user/kept.txt'), 'kept across pause')
      const procs = await back.commands.list()
      assert.ok(procs.some((p) => p.pid === bg.pid), `pid ${bg.pid} survives: ${JSON.stringify(procs)}`)
    } finally {
      await s.kill().catch(() => {})
    }
  })

  test('commands.connect reattaches; closeStdin ends input', T, async () => {
    const h = await sbx.commands.run('for i in 1 2 3; do echo tick$i; sleep 0.3; done', { background: true })
    const seen = []
    const again = await sbx.commands.connect(h.pid, { onStdout: (d) => seen.push(d) })
    const r = await again.wait()
    assert.equal(r.exitCode, 0)
    assert.match(r.stdout + seen.join(''), /tick3/)

    const cat = await sbx.commands.run('cat; echo done', { background: true, stdin: true })
    await sbx.commands.sendStdin(cat.pid, 'abc')
    await sbx.commands.closeStdin(cat.pid)
    assert.equal((await cat.wait()).stdout, 'abcdone\n')
  })

  test('files: gzip, octet-stream, signed upload and download URLs', T, async () => {
    await sbx.files.write('/home/user/gz.txt', 'compressed both ways', { gzip: true })
    assert.equal(await sbx.files.read('/home/user/gz.txt', { gzip: true }), 'compressed both ways')
    await sbx.files.write('/home/user/octet.txt', 'raw body', { useOctetStream: true })
    assert.equal(await sbx.files.read('/home/user/octet.txt'), 'raw body')

    // With E2B_SANDBOX_URL the signed URLs carry no sandbox id: the caller
    // adds the routing header (see docs/e2b.md).
    const route = { 'E2b-Sandbox-Id': sbx.sandboxId }
    const up = await sbx.uploadUrl('/home/user/signed.txt', { useSignatureExpiration: 60_000 })
    assert.match(up, /signature=v1_/)
    const form = new FormData()
    form.append('file', new Blob(['via signed url']), '/home/user/signed.txt')
    const res = await fetch(up, { method: 'POST', body: form, headers: route })
    assert.equal(res.status, 200, await res.clone().text())
    const down = await sbx.downloadUrl('/home/user/signed.txt')
    const got = await fetch(down, { headers: route })
    assert.equal(got.status, 200)
    assert.equal(await got.text(), 'via signed url')
    const forged = await fetch(down.replace(/signature=[^&]+/, 'signature=v1_forged'), { headers: route })
    assert.equal(forged.status, 401)
  })

  test('updateNetwork replaces the egress lists; getInfo reports them', T, async () => {
    await sbx.updateNetwork({ allowOut: ['203.0.113.7'], denyOut: ['0.0.0.0/0'] })
    const info = await sbx.getInfo()
    assert.equal(info.allowInternetAccess, false)
    assert.deepEqual(info.network.allowOut, ['203.0.113.7'])
    assert.deepEqual(info.network.denyOut, ['0.0.0.0/0'])
    await sbx.updateNetwork({}) // omitted fields are cleared: the org's default again
    const after = await sbx.getInfo()
    assert.equal(after.allowInternetAccess, true)
    assert.equal(after.network.allowOut, undefined)
  })

  test('unsupported calls fail fast and name the gap', T, async () => {
    await assert.rejects(Volume.create('v'), /not supported by Airlock/)
    await assert.rejects(
      Sandbox.create('base', { mcp: { exa: { apiKey: 'x' } } }),
      /MCP gateways are not supported/,
    )
  })

  test('createSnapshot, Sandbox.create from it, listSnapshots, deleteSnapshot', T, async () => {
    await sbx.files.write('/home/user/snap.txt', 'in the snapshot')
    const snap = await sbx.createSnapshot({ name: 'suite-snap' })
    assert.equal(snap.snapshotId, `${sbx.sandboxId}:suite-snap`)
    await sbx.files.write('/home/user/snap.txt', 'after the snapshot')
    const listed = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
    assert.ok(listed.some((x) => x.snapshotId === snap.snapshotId), JSON.stringify(listed))
    const all = []
    const pages = Sandbox.listSnapshots({ limit: 2 })
    while (pages.hasNext) all.push(...(await pages.nextItems()))
    assert.ok(all.some((x) => x.snapshotId === snap.snapshotId), 'the paged list of all snapshots holds it')
    const fromSnap = await Sandbox.create(snap.snapshotId, { metadata: { suite: RUN, role: 'from-snapshot' } })
    try {
      assert.equal(await fromSnap.files.read('/home/user/snap.txt'), 'in the snapshot')
      assert.equal((await fromSnap.commands.run('echo $SUITE_VAR')).stdout, 'from-create\n')
    } finally {
      await fromSnap.kill()
    }
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false, 'a deleted snapshot is gone (404 → false)')
    const after = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
    assert.ok(!after.some((x) => x.snapshotId === snap.snapshotId))
    await assert.rejects(Sandbox.create(snap.snapshotId), /not found|no checkpoint/)
  })

  test('fork: two sandboxes from the running one, each with its state', T, async () => {
    await sbx.files.write('/home/user/fork.txt', 'before the fork')
    const forks = await sbx.fork({ count: 2, timeoutMs: 5 * 60_000 })
    try {
      assert.equal(forks.length, 2)
      for (const f of forks) {
        assert.ok(!(f instanceof Error), String(f))
        assert.notEqual(f.sandboxId, sbx.sandboxId)
        assert.equal(await f.files.read('/home/user/fork.txt'), 'before the fork')
      }
      await forks[0].files.write('/home/user/fork.txt', 'changed in fork 0')
      assert.equal(await forks[1].files.read('/home/user/fork.txt'), 'before the fork', 'forks are independent')
      assert.equal(await sbx.files.read('/home/user/fork.txt'), 'before the fork', 'the source keeps running unchanged')
    } finally {
      for (const f of forks) if (!(f instanceof Error)) await f.kill().catch(() => {})
    }
  })

  test('autoResume: traffic to a paused sandbox wakes it; without it, it fails', T, async () => {
    const auto = await Sandbox.create('base', { metadata: { suite: RUN, role: 'autoresume' }, lifecycle: { onTimeout: 'pause', autoResume: true } })
    const manual = await Sandbox.create('base', { metadata: { suite: RUN, role: 'manual' } })
    try {
      assert.equal((await auto.getInfo()).lifecycle?.autoResume, true)
      assert.equal((await manual.getInfo()).lifecycle?.autoResume, false)
      await auto.files.write('/home/user/a.txt', 'kept')
      assert.equal(await auto.pause(), true)
      assert.equal(await manual.pause(), true)
      assert.equal((await auto.getInfo()).state, 'paused')
      assert.equal(await auto.files.read('/home/user/a.txt'), 'kept', 'the read woke the sandbox')
      assert.equal((await auto.getInfo()).state, 'running')
      await assert.rejects(manual.commands.run('true'), /not running|paused|resume/)
    } finally {
      await auto.kill().catch(() => {})
      await manual.kill().catch(() => {})
    }
  })

  test('Sandbox.list: order, template and startedAfter before paging', T, async () => {
    const t0 = new Date(Date.now() - 1000)
    const a = await Sandbox.create('base', { metadata: { suite: RUN, role: 'order-a' } })
    const b = await Sandbox.create('base', { metadata: { suite: RUN, role: 'order-b' } })
    try {
      const ids = async (opts) => {
        const out = []
        const p = Sandbox.list(opts)
        while (p.hasNext) out.push(...(await p.nextItems()).map((s) => s.sandboxId))
        return out
      }
      const q = { metadata: { suite: RUN }, startedAfter: t0 }
      assert.deepEqual(await ids({ query: q, limit: 1 }), [b.sandboxId, a.sandboxId], 'newest first by default, pages of one')
      assert.deepEqual(await ids({ query: q, order: 'asc', limit: 1 }), [a.sandboxId, b.sandboxId])
      assert.deepEqual(await ids({ query: { ...q, template: 'nope' } }), [])
      assert.deepEqual((await ids({ query: { ...q, template: 'base' }, order: 'asc' })), [a.sandboxId, b.sandboxId])
      const odd = await Sandbox.create('base', { metadata: { suite: RUN, 'a b&c': 'x=y%z/1' } })
      try {
        assert.deepEqual(await ids({ query: { metadata: { 'a b&c': 'x=y%z/1' } } }), [odd.sandboxId], 'reserved characters in metadata')
      } finally {
        await odd.kill()
      }
    } finally {
      await a.kill()
      await b.kill()
    }
  })

  test('getHost names the answered domain', T, async () => {
    const host = new URL(apiUrl).host.replace(/^127\.0\.0\.1(?=:|$)/, 'localhost')
    assert.equal(sbx.getHost(8000), `8000-${sbx.sandboxId}.${host}`)
  })

  test('secrets: create, getInfo, list, update, exists, destroy', T, async () => {
    const name = `suite-${RUN}`.toLowerCase().replace(/[^a-z0-9-]/g, '-').slice(0, 60)
    const info = await Secret.create(name, 'v1')
    assert.equal(info.name, name)
    assert.equal(info.secretId, `sec_${name}`)
    assert.equal((await Secret.getInfo(info.secretId)).name, name)
    const listed = []
    const p = Secret.list()
    while (p.hasNext) listed.push(...(await p.nextItems()))
    assert.ok(listed.some((x) => x.name === name), JSON.stringify(listed))
    await Secret.update(info.secretId, 'v2')
    assert.equal(await Secret.exists(info.secretId), true)
    await assert.rejects(Secret.create(name, 'again'), /already exists/)
    await Secret.destroy(info.secretId)
    assert.equal(await Secret.exists(info.secretId), false)
  })

  test('autoPause: the sandbox is paused at its timeout and connect resumes it', T, async () => {
    const s = await Sandbox.create('base', {
      metadata: { suite: RUN, role: 'autopause' },
      lifecycle: { onTimeout: 'pause' },
    })
    try {
      await s.files.write('/home/user/auto.txt', 'still here')
      assert.equal((await s.getInfo()).lifecycle?.onTimeout, 'pause')
      await s.setTimeout(2_000)
      await eventually('the sandbox pausing at its timeout', async () => (await s.getInfo()).state === 'paused')
      assert.equal(await s.isRunning(), false)
      const back = await Sandbox.connect(s.sandboxId, { timeoutMs: 120_000 })
      assert.equal(await back.files.read('/home/user/auto.txt'), 'still here')
      const info = await back.getInfo()
      assert.equal(info.state, 'running')
      assert.ok(info.endAt.getTime() > Date.now() + 60_000, `a resumed sandbox gets a fresh timeout: ${info.endAt}`)
    } finally {
      await s.kill().catch(() => {})
    }
  })
}
