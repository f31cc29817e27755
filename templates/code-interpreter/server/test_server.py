"""Tests of the code-interpreter server (server.py), run on the host.

The server runs as a subprocess on a free loopback port under Debian's
python3 (the interpreter with python3-jupyter-client and python3-ipykernel,
see host-deps.sh), and is driven by the real e2b-code-interpreter SDK: its
Sandbox pointed at the server with `sandbox_url` (what E2B_SANDBOX_URL sets),
so run_code, create_code_context, ... send their requests and parse the
answers with the SDK's own code. Wire shapes the SDK parses are also checked
raw with http.client (see test_execute_wire_shapes).

Run with ./test.sh (installs what is needed), or pytest in an environment
that has e2b-code-interpreter.
"""

import base64
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "server.py")
SERVER_PYTHON = os.environ.get("CODE_INTERPRETER_PYTHON", "/usr/bin/python3")
SERVER_MODULES = ["jupyter_client", "ipykernel", "matplotlib", "matplotlib_inline", "numpy", "pandas", "PIL"]


def _missing_server_modules():
    missing = []
    if shutil.which("bash") is None:
        missing.append("bash (not on PATH)")
    if not os.path.exists(SERVER_PYTHON):
        return missing + ["the interpreter itself (it does not exist)"]
    for m in SERVER_MODULES:
        r = subprocess.run([SERVER_PYTHON, "-c", "import " + m], capture_output=True)
        if r.returncode != 0:
            missing.append(m)
    return missing


_missing = _missing_server_modules()
if _missing:
    msg = ("code-interpreter server tests SKIPPED: %s cannot import %s "
           "(run templates/code-interpreter/server/host-deps.sh)" % (SERVER_PYTHON, ", ".join(_missing)))
    print(msg, file=sys.stderr)
    pytest.skip(msg, allow_module_level=True)

try:
    import httpx
    from e2b import ConnectionConfig, NotFoundException, SandboxException, TimeoutException
    from e2b_code_interpreter import Sandbox
    from packaging.version import Version
except ImportError as e:  # the raw-protocol tests still run
    Sandbox = None
    SDK_MISSING = "e2b-code-interpreter is not importable (%s): run templates/code-interpreter/server/test.sh" % e
    print("code-interpreter SDK tests SKIPPED: " + SDK_MISSING, file=sys.stderr)
else:
    SDK_MISSING = None

needs_sdk = pytest.mark.skipif(Sandbox is None, reason=SDK_MISSING or "")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


GLOBAL_ENVS = {"CI_GLOBAL": "from-envd", "CI_GLOBAL_QUOTED": "it's \"q\" $HOME"}


class Envd:
    """Stands in for envd's GET /envs (the sandbox's create-time envs), which
    the server reads once per context."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, HTTPServer

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps(GLOBAL_ENVS if self.path == "/envs" else {}).encode()
                self.send_response(200 if self.path == "/envs" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.srv = HTTPServer(("127.0.0.1", 0), H)
        self.url = "http://127.0.0.1:%d/envs" % self.srv.server_address[1]
        self.thread = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()


class Server:
    def __init__(self, envs_url=""):
        self.port = free_port()
        self.home = tempfile.mkdtemp(prefix="ci-home-")
        self.log = open(os.path.join(self.home, ".server.log"), "w+")
        env = dict(os.environ, CODE_INTERPRETER_CWD=self.home, CODE_INTERPRETER_ENVS_URL=envs_url)
        env.pop("MPLBACKEND", None)
        self.proc = subprocess.Popen(
            [SERVER_PYTHON, SERVER, "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 180
        while True:
            status, body = None, ""
            try:
                status, body = self.request("GET", "/health")
            except OSError:
                pass
            if status == 200:
                assert json.loads(body) == "OK"
                return
            if self.proc.poll() is not None or time.monotonic() > deadline or status == 500:
                raise AssertionError("server did not become healthy (status %s %s); log:\n%s" % (status, body, self.logs()))
            time.sleep(0.2)

    def logs(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def request(self, method, path, body=None, timeout=120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            headers = {}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            c.request(method, path, body=data, headers=headers)
            r = c.getresponse()
            return r.status, r.read().decode()
        finally:
            c.close()

    def execute_lines(self, body):
        status, text = self.request("POST", "/execute", body)
        assert status == 200, text
        assert text.endswith("\n")
        return [json.loads(line) for line in text.splitlines()]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture(scope="module")
def server():
    envd = Envd()
    s = Server(envs_url=envd.url)
    yield s
    s.stop()
    envd.stop()


@pytest.fixture(scope="module")
def sbx(server):
    if Sandbox is None:
        pytest.skip(SDK_MISSING)
    # What E2B_SANDBOX_URL does: every request of the SDK to this URL, with
    # the E2b-Sandbox-Id / E2b-Sandbox-Port headers (ignored by the server;
    # Airlock's router reads them).
    cfg = ConnectionConfig(api_key="e2b_" + "0" * 40, sandbox_url="http://127.0.0.1:%d" % server.port)
    return Sandbox(sandbox_id="host-test", envd_version=Version("0.4.0"), envd_access_token=None,
                   sandbox_domain=None, connection_config=cfg)


# --- raw protocol -----------------------------------------------------------


def test_execute_wire_shapes(server):
    # The lines e2b_code_interpreter/models.py _parse_output reads: "type";
    # stdout/stderr "text" and "timestamp"; result: every other key goes to
    # Result(**data) (text, html, png, ..., is_main_result, extra); error
    # "name", "value", "traceback"; number_of_executions "execution_count".
    # code_interpreter_sync.py run_code reads them with response.iter_lines().
    lines = server.execute_lines({"code": "import math\nprint('hi')\nmath.factorial(20)", "language": "python"})
    types = [l["type"] for l in lines]
    assert types == ["number_of_executions", "stdout", "result", "end_of_execution"], lines
    assert isinstance(lines[0]["execution_count"], int)
    assert lines[1]["text"] == "hi\n" and isinstance(lines[1]["timestamp"], str)
    assert lines[2] == {"type": "result", "text": "2432902008176640000", "extra": {}, "is_main_result": True}

    lines = server.execute_lines({"code": "1/0"})
    err = [l for l in lines if l["type"] == "error"]
    assert len(err) == 1 and err[0]["name"] == "ZeroDivisionError" and err[0]["value"] == "division by zero"
    assert "1/0" in err[0]["traceback"] and "\x1b[" not in err[0]["traceback"]
    assert lines[-1] == {"type": "end_of_execution"}


def test_execute_errors(server):
    status, text = server.request("POST", "/execute", {"code": "1", "language": "python", "context_id": "x"})
    assert status == 400 and "Only one of context_id or language" in text
    status, text = server.request("POST", "/execute", {"code": "1", "context_id": "no-such-context"})
    assert status == 404 and "no-such-context" in text
    status, text = server.request("POST", "/execute", {"code": "1", "language": "cobol"})
    assert status == 400 and "cobol" in text
    status, text = server.request("POST", "/execute", {"language": "python"})
    assert status == 422


# --- through the SDK ----------------------------------------------------------


@needs_sdk
def test_factorial(sbx):
    ex = sbx.run_code("import math; math.factorial(20)")
    assert ex.error is None
    assert ex.text == "2432902008176640000"
    assert [r.is_main_result for r in ex.results] == [True]
    assert isinstance(ex.execution_count, int)


@needs_sdk
def test_matplotlib_png(sbx):
    ex = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nplt.show()")
    assert ex.error is None, ex.error
    pngs = [r for r in ex.results if r.png]
    assert len(pngs) == 1 and not pngs[0].is_main_result
    assert base64.b64decode(pngs[0].png).startswith(PNG_MAGIC)
    assert "png" in pngs[0].formats()

    # A figure as the cell's last expression: the main result carries the PNG.
    ex = sbx.run_code("fig, ax = plt.subplots()\nax.bar(['a', 'b'], [1, 2])\nfig")
    assert ex.error is None, ex.error
    main = [r for r in ex.results if r.is_main_result]
    assert len(main) == 1 and main[0].png
    assert base64.b64decode(main[0].png).startswith(PNG_MAGIC)
    assert main[0].text.startswith("<Figure")


@needs_sdk
def test_rich_results(sbx):
    ex = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    assert ex.error is None, ex.error
    r = ex.results[0]
    assert r.is_main_result and "<table" in r.html
    assert r.data == {"a": [1, 2], "b": ["x", "y"]}

    ex = sbx.run_code("from IPython.display import JSON, HTML, display\n"
                      "display(HTML('<b>bold</b>'))\nJSON({'k': [1, 2]})")
    assert ex.error is None, ex.error
    html = [r for r in ex.results if r.html == "<b>bold</b>"]
    assert len(html) == 1 and not html[0].is_main_result
    main = [r for r in ex.results if r.is_main_result]
    assert len(main) == 1 and main[0].json == {"k": [1, 2]}

    ex = sbx.run_code("'quoted'")
    assert ex.text == "quoted"


@needs_sdk
def test_state_persists(sbx):
    sbx.run_code("persisted = 41")
    assert sbx.run_code("persisted + 1").text == "42"
    ctx = sbx.create_code_context()
    sbx.run_code("def f(n):\n    return n * 2", context=ctx)
    assert sbx.run_code("f(21)", context=ctx).text == "42"


@needs_sdk
def test_contexts_are_isolated(sbx, server):
    sbx.run_code("isolated = 'default'")
    other = sbx.create_code_context(cwd=server.home)
    assert other.language == "python" and other.cwd == server.home
    ex = sbx.run_code("isolated", context=other)
    assert ex.error is not None and ex.error.name == "NameError"
    sbx.run_code("isolated = 'other'", context=other)
    assert sbx.run_code("isolated").text == "default"
    assert sbx.run_code("import os; os.getcwd()", context=other).text == server.home


@needs_sdk
def test_exception(sbx):
    ex = sbx.run_code("def g():\n    raise ValueError('boom')\ng()")
    assert ex.results == []
    assert ex.error.name == "ValueError"
    assert ex.error.value == "boom"
    assert "raise ValueError('boom')" in ex.error.traceback
    assert "Traceback" in ex.error.traceback


@needs_sdk
def test_stdout_streams_in_order(sbx, server):
    # The cell waits for a file that only the on_stdout callback creates:
    # unless "ready" reaches the SDK while the cell still runs, the cell never
    # ends and run_code raises its timeout.
    flag = os.path.join(server.home, "stream-flag")
    events = []

    def on_stdout(m):
        events.append(("stdout", m.line))
        if m.line.startswith("ready"):
            open(flag, "w").close()

    code = ("import os, sys, time\n"
            "print('ready', flush=True)\n"
            "while not os.path.exists(%r):\n    time.sleep(0.05)\n"
            "print('err', file=sys.stderr, flush=True)\n"
            "print('done', flush=True)\n"
            "'last'") % flag
    ex = sbx.run_code(code, on_stdout=on_stdout,
                      on_stderr=lambda m: events.append(("stderr", m.line)),
                      on_result=lambda r: events.append(("result", r.text)), timeout=120)
    assert ex.error is None, ex.error
    assert events == [("stdout", "ready\n"), ("stderr", "err\n"), ("stdout", "done\n"), ("result", "last")]
    assert ex.logs.stdout == ["ready\n", "done\n"] and ex.logs.stderr == ["err\n"]


@needs_sdk
def test_python_env_vars(sbx):
    ex = sbx.run_code("import os; print(os.environ.get('CI_FOO'))", envs={"CI_FOO": "b'a\"r $x"})
    assert ex.logs.stdout == ["b'a\"r $x\n"]
    assert sbx.run_code("import os; str(os.environ.get('CI_FOO'))").text == "None"


@needs_sdk
def test_bash(sbx, server):
    sub = os.path.join(server.home, "sub dir")
    os.makedirs(sub, exist_ok=True)
    ctx = sbx.create_code_context(language="bash", cwd=server.home)
    assert ctx.language == "bash"
    ex = sbx.run_code("cd 'sub dir'\nV=7\nfn() { echo \"fn:$1\"; }", context=ctx)
    assert ex.error is None, ex.error
    ex = sbx.run_code("pwd; echo $V; fn x", context=ctx)
    assert "".join(ex.logs.stdout) == "%s\n7\nfn:x\n" % sub
    # Per-execution env vars, gone afterwards.
    assert sbx.run_code("echo $FOO", context=ctx, envs={"FOO": "bar baz"}).logs.stdout == ["bar baz\n"]
    assert sbx.run_code("echo ${FOO:-default}", context=ctx).logs.stdout == ["default\n"]
    # A failing command: stderr and an error with the exit status.
    ex = sbx.run_code("echo out; ls /nonexistent-dir-for-test", context=ctx)
    assert ex.logs.stdout == ["out\n"] and "nonexistent-dir-for-test" in "".join(ex.logs.stderr)
    assert ex.error is not None and ex.error.value == "2"
    # `exit` ends the shell: an error, then a fresh shell in the context's cwd.
    ex = sbx.run_code("exit 3", context=ctx)
    assert ex.error is not None and ex.error.name == "ContextRestarting"
    assert "".join(sbx.run_code("pwd; echo ${V:-unset}", context=ctx).logs.stdout) == "%s\nunset\n" % server.home
    # The default bash context, by language.
    sbx.run_code("W=default-bash", language="bash")
    assert sbx.run_code("echo $W", language="bash").logs.stdout == ["default-bash\n"]


@needs_sdk
def test_timeout_interrupts(sbx):
    # The SDK's timeout closes the connection; the server interrupts the
    # execution, and the context (with its state) serves the next one.
    sbx.run_code("kept = 'yes'")
    with pytest.raises(TimeoutException):
        sbx.run_code("while True:\n    pass", timeout=2)
    ex = sbx.run_code("kept", timeout=60)
    assert ex.error is None and ex.text == "yes"

    sbx.run_code("K=kept-bash", language="bash")
    with pytest.raises(TimeoutException):
        sbx.run_code("sleep 600; echo never", language="bash", timeout=2)
    ex = sbx.run_code("echo $K", language="bash", timeout=60)
    assert ex.error is None and ex.logs.stdout == ["kept-bash\n"]


@needs_sdk
def test_context_lifecycle(sbx):
    ctx = sbx.create_code_context()
    assert ctx.id in [c.id for c in sbx.list_code_contexts()]
    sbx.run_code("gone_after_restart = 1", context=ctx)
    sbx.restart_code_context(ctx)
    ex = sbx.run_code("gone_after_restart", context=ctx)
    assert ex.error is not None and ex.error.name == "NameError"
    sbx.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in sbx.list_code_contexts()]
    with pytest.raises(NotFoundException):
        sbx.run_code("1", context=ctx)
    with pytest.raises(NotFoundException):
        sbx.remove_code_context(ctx.id)
    with pytest.raises(SandboxException):
        sbx.create_code_context(language="cobol")


@needs_sdk
def test_sandbox_envs(sbx):
    # The sandbox's environment (envd's /envs) in every context; a
    # per-execution value overrides it for that execution only.
    for ctx in (None, sbx.create_code_context()):
        assert sbx.run_code("import os; os.environ['CI_GLOBAL']", context=ctx).text == "from-envd"
        ex = sbx.run_code("import os; print(os.environ['CI_GLOBAL'], os.environ['CI_GLOBAL_QUOTED'])",
                          context=ctx, envs={"CI_GLOBAL": "override"})
        assert ex.logs.stdout == ["override %s\n" % GLOBAL_ENVS["CI_GLOBAL_QUOTED"]]
        assert sbx.run_code("import os; os.environ['CI_GLOBAL']", context=ctx).text == "from-envd"
    ctx = sbx.create_code_context(language="bash")
    assert "".join(sbx.run_code('echo "$CI_GLOBAL|$CI_GLOBAL_QUOTED"', context=ctx).logs.stdout) == \
        "from-envd|%s\n" % GLOBAL_ENVS["CI_GLOBAL_QUOTED"]
    assert sbx.run_code("echo $CI_GLOBAL", context=ctx, envs={"CI_GLOBAL": "override"}).logs.stdout == ["override\n"]
    assert sbx.run_code("echo $CI_GLOBAL", context=ctx).logs.stdout == ["from-envd\n"]
