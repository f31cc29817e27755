// Drives envd with the unmodified E2B JS SDK in debug mode (E2B_DEBUG=true:
// no control plane; E2B_SANDBOX_URL points at envd). Run by TestSDKDebugMode.
import assert from 'node:assert/strict'

const { Sandbox, CommandExitError, FileType, NotFoundError } = await import(process.env.E2B_MODULE)

const until = async (what, fn) => {
  for (let i = 0; i < 600; i++) {
    if (await fn()) return
    await new Promise((r) => setTimeout(r, 50))
  }
  throw new Error(`timed out waiting for ${what}`)
}
const step = (name) => console.log(`step: ${name}`)

const sbx = await Sandbox.create()

step('commands.run streaming')
let streamed = ''
const r = await sbx.commands.run('echo hello; echo err >&2', { onStdout: (d) => (streamed += d) })
assert.equal(r.stdout, 'hello\n')
assert.equal(r.stderr, 'err\n')
assert.equal(r.exitCode, 0)
assert.equal(streamed, 'hello\n')

step('exit codes')
await assert.rejects(sbx.commands.run('exit 3'), (e) => e instanceof CommandExitError && e.exitCode === 3)

step('envs, default user, home, login shell')
const who = await sbx.commands.run('echo "$FOO $(id -un) $(pwd) $0"', { envs: { FOO: 'bar' } })
assert.equal(who.stdout, 'bar user /home/user /bin/bash\n')
const asRoot = await sbx.commands.run('id -un', { user: 'root' })
assert.equal(asRoot.stdout, 'root\n')

step('large output')
const big = await sbx.commands.run("head -c 3000000 /dev/zero | tr '\\0' x")
assert.equal(big.stdout.length, 3000000)

step('background, list, kill')
const bg = await sbx.commands.run('sleep 100', { background: true })
assert.ok((await sbx.commands.list()).some((p) => p.pid === bg.pid))
assert.equal(await sbx.commands.kill(bg.pid), true)
await assert.rejects(bg.wait())
assert.equal(await sbx.commands.kill(bg.pid), false)

step('sendStdin, closeStdin')
const cat = await sbx.commands.run('cat', { background: true, stdin: true })
await sbx.commands.sendStdin(cat.pid, 'hi\n')
await sbx.commands.closeStdin(cat.pid)
assert.equal((await cat.wait()).stdout, 'hi\n')

step('connect')
const slow = await sbx.commands.run('read x; echo "got $x"', { background: true, stdin: true })
const again = await sbx.commands.connect(slow.pid)
await sbx.commands.sendStdin(slow.pid, 'there\n')
assert.equal((await again.wait()).stdout, 'got there\n')

step('pty')
let term = ''
const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => (term += new TextDecoder().decode(d)) })
await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size\n'))
await until('24 80', () => term.includes('24 80'))
await sbx.pty.resize(pty.pid, { cols: 100, rows: 40 })
await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size; exit\n'))
await pty.wait()
assert.ok(term.includes('40 100'), term)

step('files')
await sbx.files.write('/home/user/a/b.txt', 'hello file')
assert.equal(await sbx.files.read('/home/user/a/b.txt'), 'hello file')
await sbx.files.write([{ path: 'm1.txt', data: 'one' }, { path: 'm2.txt', data: new Uint8Array([116, 119, 111]) }])
assert.equal(await sbx.files.read('m2.txt'), 'two')
assert.deepEqual(Array.from(await sbx.files.read('m1.txt', { format: 'bytes' })), [111, 110, 101])
const names = (await sbx.files.list('/home/user')).map((e) => e.name)
assert.ok(names.includes('a') && names.includes('m1.txt'), names.join(','))
assert.equal(await sbx.files.exists('nope'), false)
const info = await sbx.files.getInfo('m1.txt')
assert.equal(info.type, FileType.FILE)
assert.equal(info.size, 3)
assert.equal(await sbx.files.makeDir('newdir'), true)
assert.equal(await sbx.files.makeDir('newdir'), false)
await sbx.files.rename('m1.txt', 'm3.txt')
assert.equal(await sbx.files.exists('m3.txt'), true)
await sbx.files.remove('m3.txt')
assert.equal(await sbx.files.exists('m3.txt'), false)
await assert.rejects(sbx.files.read('missing.txt'), (e) => e instanceof NotFoundError)

step('watchDir')
const events = []
const w = await sbx.files.watchDir('/home/user/newdir', (e) => events.push(e), { recursive: true })
await sbx.files.write('/home/user/newdir/sub/w.txt', 'x')
await until('watch event', () => events.some((e) => e.name === 'sub/w.txt'))
await w.stop()

step('isRunning')
assert.equal(await sbx.isRunning(), true)
console.log('ok')
