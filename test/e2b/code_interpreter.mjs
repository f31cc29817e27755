// The unmodified @e2b/code-interpreter JS SDK against Airlock's shipped
// code-interpreter template (alias code-interpreter-v1, the SDK's default),
// with only E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set (what
// `airlock e2b env` prints). Run by internal/e2e TestE2BCodeInterpreterJS.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'

test('runCode: a value, state across calls, a PNG chart, bash', { timeout: 300_000 }, async () => {
  const sbx = await Sandbox.create({ timeoutMs: 120_000, envs: { GREETING: 'hi from create' } })
  try {
    let ex = await sbx.runCode('import math; math.factorial(20)')
    assert.equal(ex.error, undefined)
    assert.equal(ex.text, '2432902008176640000')

    await sbx.runCode('x = 41')
    ex = await sbx.runCode('x + 1')
    assert.equal(ex.text, '42')

    ex = await sbx.runCode('import os; os.environ.get("GREETING") == "hi from create"')
    assert.equal(ex.text, 'True', 'the create-time env reaches the kernel')

    ex = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.show()')
    assert.equal(ex.error, undefined)
    const png = ex.results.find((r) => r.png)
    assert.ok(png, 'a PNG result')
    assert.equal(Buffer.from(png.png, 'base64').subarray(0, 8).toString('hex'), '89504e470d0a1a0a')

    const stdout = []
    ex = await sbx.runCode('for i in range(3): print("line", i)', { onStdout: (m) => stdout.push(m.line) })
    assert.deepEqual(stdout.join('').trim().split('\n'), ['line 0', 'line 1', 'line 2'], 'streamed stdout, in order')

    ex = await sbx.runCode('1/0')
    assert.equal(ex.error.name, 'ZeroDivisionError')

    ex = await sbx.runCode('cd /tmp && X=7', { language: 'bash' })
    ex = await sbx.runCode('echo "$X $(pwd)"', { language: 'bash' })
    assert.equal(ex.logs.stdout.join('').trim(), '7 /tmp')

    const ctx = await sbx.createCodeContext({ language: 'python' })
    ex = await sbx.runCode('x', { context: ctx })
    assert.equal(ex.error.name, 'NameError', 'a new context does not see x')
  } finally {
    await sbx.kill()
  }
})
