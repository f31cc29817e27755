// The unmodified E2B JS SDK's Template() builder against a real Airlock:
// a build on the base template (RUN, COPY, ENV), a sandbox from it that
// sees what the build made, and Template.exists for a missing name.
// Run by internal/e2e/e2b_template_test.go (node --test template.mjs) with
// E2B_API_URL = E2B_SANDBOX_URL = the server URL, E2B_API_KEY = an e2b_ key.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { Sandbox, Template } from 'e2b'

const T = { timeout: 20 * 60_000 }
const RUN = `${Date.now().toString(36)}${Math.floor(Math.random() * 1e6).toString(36)}`

if (!process.env.E2B_API_URL || !process.env.E2B_API_KEY) {
  test('E2B template builds', { skip: 'E2B_API_URL and E2B_API_KEY are not set (internal/e2e/e2b_template_test.go sets them)' }, () => {})
} else {
  test('Template.exists is false for a missing template', T, async () => {
    assert.equal(await Template.exists(`missing-${RUN}`), false)
    assert.equal(await Template.exists('base'), true)
  })

  test('Template() builds; a sandbox from it sees the build', T, async () => {
    const ctx = fs.mkdtempSync(path.join(os.tmpdir(), 'e2b-template-'))
    fs.writeFileSync(path.join(ctx, 'hello.txt'), `hello from the JS SDK ${RUN}\n`)
    fs.mkdirSync(path.join(ctx, 'conf'))
    fs.writeFileSync(path.join(ctx, 'conf', 'app.ini'), 'answer=42\n')
    const name = `sdk-js-${RUN}`
    const template = Template({ fileContextPath: ctx })
      .fromTemplate('base')
      .runCmd(`echo built-by-run-${RUN} > /home/user/marker`)
      .runCmd('id -un > /opt/run-as-root', { user: 'root' })
      .copy('hello.txt', '/home/user/hello.txt')
      .copy('conf', '/opt/conf/')
      .setEnvs({ BUILT_WITH: 'e2b-js' })
    const logs = []
    const info = await Template.build(template, name, { onBuildLogs: (e) => logs.push(String(e)) })
    assert.equal(info.name, name)
    assert.ok(logs.some((l) => l.includes('RUN')), `build logs name the RUN steps: ${logs.join('\n')}`)
    assert.equal(await Template.exists(name), true)

    const sbx = await Sandbox.create(name, { timeoutMs: 5 * 60_000 })
    try {
      const r = await sbx.commands.run('cat /home/user/hello.txt /home/user/marker /opt/run-as-root /opt/conf/app.ini; echo "env=$BUILT_WITH"; stat -c %U /home/user/hello.txt')
      assert.equal(r.exitCode, 0)
      assert.equal(
        r.stdout,
        `hello from the JS SDK ${RUN}\nbuilt-by-run-${RUN}\nroot\nanswer=42\nenv=e2b-js\nuser\n`,
      )
    } finally {
      await sbx.kill()
    }

    // The same recipe again: every step is cached, the same content.
    const logs2 = []
    await Template.build(template, name, { onBuildLogs: (e) => logs2.push(String(e)) })
    assert.ok(logs2.some((l) => l.includes('(cached)')), `a rebuild reuses the cache: ${logs2.join('\n')}`)
    fs.rmSync(ctx, { recursive: true, force: true })
  })
}
