"""The unmodified e2b-code-interpreter Python SDK against Airlock's shipped
code-interpreter template, with only E2B_API_URL, E2B_SANDBOX_URL and
E2B_API_KEY set (what `airlock e2b env` prints). Run by internal/e2e
TestE2BCodeInterpreterPython; prints "ok: code interpreter" on success."""
import base64

from e2b_code_interpreter import Sandbox

sbx = Sandbox.create(timeout=120, envs={"GREETING": "hi from create"})
try:
    ex = sbx.run_code("import math; math.factorial(20)")
    assert ex.error is None, ex.error
    assert ex.text == "2432902008176640000", ex.text

    sbx.run_code("x = 41")
    ex = sbx.run_code("x + 1")
    assert ex.text == "42", ex.text

    ex = sbx.run_code("import os; os.environ.get('GREETING') == 'hi from create'")
    assert ex.text == "True", ("the create-time env does not reach the kernel", ex.text)

    ex = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.show()")
    assert ex.error is None, ex.error
    pngs = [r.png for r in ex.results if r.png]
    assert pngs and base64.b64decode(pngs[0])[:8] == b"\x89PNG\r\n\x1a\n", ex.results

    lines = []
    sbx.run_code("for i in range(3): print('line', i)", on_stdout=lambda m: lines.append(m.line))
    assert "".join(lines).strip().split("\n") == ["line 0", "line 1", "line 2"], lines

    ex = sbx.run_code("1/0")
    assert ex.error is not None and ex.error.name == "ZeroDivisionError", ex.error

    sbx.run_code("cd /tmp && X=7", language="bash")
    ex = sbx.run_code('echo "$X $(pwd)"', language="bash")
    assert "".join(ex.logs.stdout).strip() == "7 /tmp", ex.logs

    ctx = sbx.create_code_context(language="python")
    ex = sbx.run_code("x", context=ctx)
    assert ex.error is not None and ex.error.name == "NameError", ex.error
finally:
    sbx.kill()
print("ok: code interpreter")
