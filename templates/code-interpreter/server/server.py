#!/usr/bin/python3
"""Airlock's code-interpreter server: the E2B code-interpreter protocol.

Serves, by default on 0.0.0.0:49999, what the e2b-code-interpreter (Python)
and @e2b/code-interpreter (JS) SDKs call:

  GET    /health                   "OK" (JSON string) once the default Python
                                   context runs; 503 while it starts
  POST   /execute                  {"code", "context_id"?, "language"?,
                                   "env_vars"?} -> NDJSON stream, one JSON
                                   object a line: stdout, stderr, result,
                                   error, number_of_executions, keepalive,
                                   then end_of_execution
  POST   /contexts                 {"language"?, "cwd"?} -> {"id", "language", "cwd"}
  GET    /contexts                 [{"id", "language", "cwd"}, ...]
  DELETE /contexts/{id}            null
  POST   /contexts/{id}/restart    null

Languages: python (an IPython kernel through jupyter_client, Debian's
python3-jupyter-client and python3-ipykernel) and bash (one persistent bash
process per context: `cd`, variables and functions persist). A client that
disconnects during an execution (the SDK's `timeout`, a cancelled request)
interrupts it. Standard library only, besides jupyter_client.
"""

import argparse
import codecs
import datetime
import json
import os
import queue
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import urllib.request
from urllib.parse import urlsplit

DEFAULT_PORT = 49999
DEFAULT_CWD = "/home/user"
KEEPALIVE_SECONDS = 5.0
POLL_SECONDS = 0.2
INTERRUPT_GRACE_SECONDS = 10.0
MAX_BODY = 64 << 20
LANGUAGES = ("python", "bash")
# E2B's envd serves the sandbox's environment (its create-time envs) here;
# each context reads it once, at its first execution, as E2B's server does.
ENVS_URL = "http://127.0.0.1:49983/envs"

# Run in every new Python kernel, silently: pandas DataFrames get an
# "e2b/data" representation (the SDK's Result.data), as in E2B's template.
PYTHON_STARTUP = r'''
def __e2b_setup():
    import sys
    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    class E2BDataFormatter(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict, str)

        def __call__(self, obj):
            pandas = sys.modules.get("pandas")
            if pandas is None or not isinstance(obj, pandas.DataFrame):
                return super().__call__(obj)
            out = obj.to_dict(orient="list")
            for k, v in out.items():
                out[k] = [x.isoformat() if isinstance(x, pandas.Timestamp) else x for x in v]
            return out

    ip = get_ipython()
    ip.display_formatter.formatters["e2b/data"] = E2BDataFormatter(parent=ip.display_formatter)
__e2b_setup()
del __e2b_setup
'''


def log(*args):
    print("code-interpreter:", *args, file=sys.stderr, flush=True)


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def normalize_language(language):
    if not language:
        return "python"
    language = language.strip().lower()
    return {"js": "javascript", "ts": "typescript", "sh": "bash", "python3": "python"}.get(language, language)


# Airlock writes the sandbox's environment here before the sandbox counts
# as running (internal/worker SandboxEnvFile): this server may have been
# started in a template image, before the sandbox existed.
ENV_FILE = "/run/airlock-env.json"


def fetch_global_envs(access_token=None):
    """The sandbox's environment: Airlock's env file, else envd's /envs ({}
    when neither says anything usable)."""
    path = os.environ.get("CODE_INTERPRETER_ENV_FILE", ENV_FILE)
    if path:
        try:
            with open(path, "rb") as f:
                obj = json.loads(f.read(1 << 20))
            if isinstance(obj, dict):
                return {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, str) and valid_env_name(k)}
        except Exception:
            pass
    url = os.environ.get("CODE_INTERPRETER_ENVS_URL", ENVS_URL)
    if not url:
        return {}
    req = urllib.request.Request(url)
    if access_token:
        req.add_header("X-Access-Token", access_token)
    try:
        with urllib.request.urlopen(req, timeout=2) as r:
            obj = json.loads(r.read(1 << 20))
    except Exception:
        return {}
    if not isinstance(obj, dict):
        return {}
    return {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, str) and valid_env_name(k)}


def valid_env_name(k):
    return bool(k) and k.replace("_", "a").isalnum() and k.isascii() and not k[0].isdigit()


class ClientGone(Exception):
    """The HTTP client went away during an execution."""


class Emitter:
    """What an execution writes to: emit(obj) sends one NDJSON line, gone()
    tells whether the client has disconnected."""

    def __init__(self, emit, gone):
        self.emit = emit
        self.gone = gone


def result_message(data, is_main):
    """A Jupyter MIME bundle as E2B's result line (text/plain -> text, ...;
    MIME types without a field of their own go under extra)."""
    data = dict(data)
    out = {"type": "result"}
    text = data.pop("text/plain", None)
    if text and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    fields = [
        ("html", "text/html"), ("markdown", "text/markdown"), ("svg", "image/svg+xml"),
        ("png", "image/png"), ("jpeg", "image/jpeg"), ("pdf", "application/pdf"),
        ("latex", "text/latex"), ("json", "application/json"),
        ("javascript", "application/javascript"), ("data", "e2b/data"), ("chart", "e2b/chart"),
    ]
    if text is not None:
        out["text"] = text
    for name, mime in fields:
        v = data.pop(mime, None)
        if v is not None:
            out[name] = v
    out["extra"] = data
    out["is_main_result"] = is_main
    return out


class PythonContext:
    """A Python context: one IPython kernel."""

    language = "python"

    def __init__(self, cid, cwd, runtime_dir):
        self.id = cid
        self.cwd = cwd
        self.lock = threading.Lock()
        self.runtime_dir = runtime_dir
        self.km = None
        self.kc = None
        self.global_envs = None
        self._start()

    def _start(self):
        from jupyter_client import KernelManager

        km = KernelManager(kernel_name="python3")
        km.connection_file = os.path.join(self.runtime_dir, "kernel-%s.json" % self.id)
        env = dict(os.environ)
        env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
        env.pop("JPY_PARENT_PID", None)
        km.start_kernel(cwd=self.cwd, env=env, extra_arguments=[
            "--InteractiveShell.colors=NoColor", "--HistoryManager.enabled=False"])
        kc = km.blocking_client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=120)
        except Exception:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
            raise
        self.km, self.kc = km, kc
        self._silent(PYTHON_STARTUP)

    def _stop(self):
        if self.kc is not None:
            try:
                self.kc.stop_channels()
            except Exception:
                pass
        if self.km is not None:
            try:
                self.km.shutdown_kernel(now=True)
            except Exception:
                pass
            try:
                self.km.cleanup_resources()
            except Exception:
                pass
        self.km = self.kc = None

    def restart(self):
        self._stop()
        self.global_envs = None
        self._start()

    def shutdown(self):
        self._stop()

    def _silent(self, code, timeout=60):
        """Runs code without output or history; returns its error message or None."""
        msg_id = self.kc.execute(code, silent=True, store_history=False, allow_stdin=False)
        err = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=POLL_SECONDS)
            except queue.Empty:
                if not self.km.is_alive():
                    return "the kernel died"
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "error":
                err = "%s: %s" % (msg["content"].get("ename"), msg["content"].get("evalue"))
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return err
        return "timed out"

    def execute(self, code, env_vars, out, access_token=None):
        if self.global_envs is None:
            self.global_envs = fetch_global_envs(access_token)
            if self.global_envs:
                self._silent("import os as __e2b_os\n__e2b_os.environ.update(%s)\ndel __e2b_os\n" % json.dumps(self.global_envs))
        if env_vars:
            keys = json.dumps(sorted(env_vars))
            err = self._silent(
                "import os as __e2b_os\n"
                "__e2b_saved_env = {k: __e2b_os.environ.get(k) for k in %s}\n"
                "__e2b_os.environ.update(%s)\n" % (keys, json.dumps(env_vars)))
            if err:
                out.emit({"type": "error", "name": "EnvVarsError", "value": err, "traceback": ""})
                return
        try:
            self._run(code, out)
        finally:
            if env_vars and self.kc is not None:
                self._silent(
                    "for __e2b_k, __e2b_v in __e2b_saved_env.items():\n"
                    "    if __e2b_v is None:\n"
                    "        __e2b_os.environ.pop(__e2b_k, None)\n"
                    "    else:\n"
                    "        __e2b_os.environ[__e2b_k] = __e2b_v\n"
                    "del __e2b_saved_env, __e2b_os\n"
                    "try:\n    del __e2b_k, __e2b_v\nexcept NameError:\n    pass\n")

    def _run(self, code, out):
        kc = self.kc
        msg_id = kc.execute(code, silent=False, store_history=True, allow_stdin=False, stop_on_error=True)
        errored = False
        last_write = time.monotonic()
        interrupted_at = None
        while True:
            if interrupted_at is None and out.gone():
                log("context %s: client disconnected, interrupting the kernel" % self.id)
                self.km.interrupt_kernel()
                interrupted_at = time.monotonic()
            if interrupted_at is not None and time.monotonic() - interrupted_at > INTERRUPT_GRACE_SECONDS:
                log("context %s: the kernel ignored the interrupt, restarting it" % self.id)
                self.restart()
                raise ClientGone()
            try:
                msg = kc.get_iopub_msg(timeout=POLL_SECONDS)
            except queue.Empty:
                if not self.km.is_alive():
                    self.restart()
                    self._send(out, interrupted_at, {"type": "error", "name": "ContextRestarting",
                                                     "value": "The kernel died; the context was restarted", "traceback": ""})
                    if interrupted_at is not None:
                        raise ClientGone()
                    return
                if interrupted_at is None and time.monotonic() - last_write >= KEEPALIVE_SECONDS:
                    self._send(out, interrupted_at, {"type": "keepalive"})
                    last_write = time.monotonic()
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            t, c = msg["msg_type"], msg["content"]
            line = None
            if t == "stream":
                date = msg["header"].get("date")
                stamp = date.isoformat() if hasattr(date, "isoformat") else (date or now_iso())
                line = {"type": "stdout" if c.get("name") == "stdout" else "stderr",
                        "text": c.get("text", ""), "timestamp": stamp}
            elif t == "execute_input":
                line = {"type": "number_of_executions", "execution_count": c.get("execution_count")}
            elif t in ("display_data", "update_display_data"):
                line = result_message(c.get("data", {}), False)
            elif t == "execute_result":
                line = result_message(c.get("data", {}), True)
            elif t == "error":
                if not errored:
                    errored = True
                    line = {"type": "error", "name": c.get("ename", ""), "value": c.get("evalue", ""),
                            "traceback": "\n".join(c.get("traceback", []))}
            elif t == "status" and c.get("execution_state") == "idle":
                break
            if line is not None:
                self._send(out, interrupted_at, line)
                last_write = time.monotonic()
        # The shell channel's execute_reply: an error not seen on iopub, an abort.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                reply = kc.get_shell_msg(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            if reply["parent_header"].get("msg_id") != msg_id:
                continue
            c = reply["content"]
            if c.get("status") == "error" and not errored:
                self._send(out, interrupted_at, {"type": "error", "name": c.get("ename", ""), "value": c.get("evalue", ""),
                                                 "traceback": "\n".join(c.get("traceback", []))})
            elif c.get("status") == "abort":
                self._send(out, interrupted_at, {"type": "error", "name": "ExecutionAborted",
                                                 "value": "Execution was aborted", "traceback": ""})
            break
        if interrupted_at is not None:
            raise ClientGone()

    @staticmethod
    def _send(out, interrupted_at, line):
        if interrupted_at is None:
            try:
                out.emit(line)
            except ClientGone:
                pass


class BashContext:
    """A bash context: one persistent `bash --noprofile --norc` process. Each
    execution's code is sourced from a file (stdin /dev/null) in that shell, so
    `cd`, variables and functions persist; a random marker on stdout and
    stderr, with the exit status, ends it. SIGINT to the shell's process
    group interrupts it (a trap returns from the sourced file)."""

    language = "bash"

    def __init__(self, cid, cwd, runtime_dir):
        self.id = cid
        self.cwd = cwd
        self.lock = threading.Lock()
        self.dir = tempfile.mkdtemp(prefix="bash-%s-" % cid[:8], dir=runtime_dir)
        self.count = 0
        self.proc = None
        self.global_envs = None
        self._start()

    def _start(self):
        self.q = queue.Queue()
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, cwd=self.cwd, start_new_session=True, env=dict(os.environ))
        for name, f in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr)):
            threading.Thread(target=self._reader, args=(name, f, self.q), daemon=True).start()
        self._write("trap 'return 130 2>/dev/null' INT\n")

    @staticmethod
    def _reader(name, f, q):
        fd = f.fileno()
        while True:
            try:
                b = os.read(fd, 65536)
            except OSError:
                b = b""
            if not b:
                q.put((name, None))
                return
            q.put((name, b))

    def _write(self, s):
        self.proc.stdin.write(s.encode())
        self.proc.stdin.flush()

    def _kill(self):
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except Exception:
            pass
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except Exception:
                pass
        self.proc = None

    def restart(self):
        self._kill()
        self.count = 0
        self.global_envs = None
        self._start()

    def shutdown(self):
        self._kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def execute(self, code, env_vars, out, access_token=None):
        exports = []
        if self.global_envs is None:
            self.global_envs = fetch_global_envs(access_token)
            exports = ["export %s=%s" % (k, shlex_quote(v)) for k, v in sorted(self.global_envs.items())]
        self.count += 1
        marker = "\x1e__E2B_END_%s__" % uuid.uuid4().hex
        cell = os.path.join(self.dir, "cell-%d.sh" % self.count)
        with open(cell, "w") as f:
            f.write(code)
            if not code.endswith("\n"):
                f.write("\n")
        pre, post = [], []
        for i, (k, v) in enumerate(sorted((env_vars or {}).items())):
            if not valid_env_name(k):
                out.emit({"type": "error", "name": "EnvVarsError", "value": "%r is not an environment variable name" % k, "traceback": ""})
                return
            pre.append("__e2b_had_%d=${%s+x}; __e2b_old_%d=${%s-}; export %s=%s" % (i, k, i, k, k, shlex_quote(v)))
            post.append('if [ -n "$__e2b_had_%d" ]; then export %s="$__e2b_old_%d"; else unset %s; fi; unset __e2b_had_%d __e2b_old_%d'
                        % (i, k, i, k, i, i))
        script = "\n".join(exports + pre + [
            "source %s </dev/null" % shlex_quote(cell),
            "__e2b_rc=$?",
        ] + post + [
            "printf '%%s:%%d\\n' %s \"$__e2b_rc\"" % shlex_quote(marker),
            "printf '%%s\\n' %s >&2" % shlex_quote(marker),
            "unset __e2b_rc",
        ]) + "\n"
        out.emit({"type": "number_of_executions", "execution_count": self.count})
        try:
            self._write(script)
        except OSError:
            self.restart()
            out.emit({"type": "error", "name": "ContextRestarting", "value": "The shell had exited; the context was restarted", "traceback": ""})
            return
        state = {n: {"buf": "", "dec": codecs.getincrementaldecoder("utf-8")("replace"), "done": False}
                 for n in ("stdout", "stderr")}
        rc = None
        exited = False
        interrupted_at = None
        last_write = time.monotonic()

        def send(line):
            if interrupted_at is None:
                try:
                    out.emit(line)
                except ClientGone:
                    pass

        while not (state["stdout"]["done"] and state["stderr"]["done"]):
            if interrupted_at is None and out.gone():
                log("context %s: client disconnected, interrupting bash" % self.id)
                try:
                    os.killpg(self.proc.pid, signal.SIGINT)
                except OSError:
                    pass
                interrupted_at = time.monotonic()
            if interrupted_at is not None and time.monotonic() - interrupted_at > INTERRUPT_GRACE_SECONDS:
                self.restart()
                break
            try:
                name, b = self.q.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if interrupted_at is None and time.monotonic() - last_write >= KEEPALIVE_SECONDS:
                    send({"type": "keepalive"})
                    last_write = time.monotonic()
                continue
            st = state[name]
            if st["done"]:
                continue
            if b is None:
                st["done"] = True
                exited = True
                text = st["buf"] + st["dec"].decode(b"", final=True)
                st["buf"] = ""
                if text:
                    send({"type": name, "text": text, "timestamp": now_iso()})
                continue
            st["buf"] += st["dec"].decode(b)
            i = st["buf"].find(marker)
            if i >= 0:
                text = st["buf"][:i]
                rest = st["buf"][i + len(marker):]
                st["done"] = True
                if name == "stdout" and rest.startswith(":"):
                    try:
                        rc = int(rest[1:].split("\n", 1)[0])
                    except ValueError:
                        rc = None
                st["buf"] = ""
            else:
                keep = partial_suffix(st["buf"], marker)
                text = st["buf"][:len(st["buf"]) - keep]
                st["buf"] = st["buf"][len(st["buf"]) - keep:]
            if text:
                send({"type": name, "text": text, "timestamp": now_iso()})
                last_write = time.monotonic()
        if exited:
            status = None
            if self.proc is not None:
                try:
                    status = self.proc.wait(timeout=5)
                except Exception:
                    pass
            self.restart()
            send({"type": "error", "name": "ContextRestarting",
                  "value": "bash exited (status %s); the context was restarted with a new shell in %s" % (status, self.cwd),
                  "traceback": ""})
        elif rc:
            send({"type": "error", "name": "Error", "value": str(rc), "traceback": ""})
        try:
            os.unlink(cell)
        except OSError:
            pass
        if interrupted_at is not None:
            raise ClientGone()


def shlex_quote(s):
    import shlex
    return shlex.quote(s)


def partial_suffix(buf, marker):
    """Length of the longest suffix of buf that is a proper prefix of marker."""
    n = min(len(buf), len(marker) - 1)
    for k in range(n, 0, -1):
        if marker.startswith(buf[-k:]):
            return k
    return 0


class Contexts:
    def __init__(self, runtime_dir):
        self.runtime_dir = runtime_dir
        self.lock = threading.Lock()
        self.by_id = {}
        self.default = {}
        self.default_locks = {lang: threading.Lock() for lang in LANGUAGES}
        self.ready = threading.Event()
        self.start_error = None

    def create(self, language, cwd):
        if language not in LANGUAGES:
            raise ValueError("language %r is not supported here (supported: %s)" % (language, ", ".join(LANGUAGES)))
        if not os.path.isdir(cwd):
            raise ValueError("cwd %s is not a directory" % cwd)
        cid = str(uuid.uuid4())
        cls = PythonContext if language == "python" else BashContext
        ctx = cls(cid, cwd, self.runtime_dir)
        with self.lock:
            self.by_id[cid] = ctx
        return ctx

    def get(self, cid):
        with self.lock:
            return self.by_id.get(cid)

    def get_default(self, language):
        if language not in LANGUAGES:
            raise ValueError("language %r is not supported here (supported: %s)" % (language, ", ".join(LANGUAGES)))
        with self.default_locks[language]:
            with self.lock:
                cid = self.default.get(language)
                ctx = self.by_id.get(cid) if cid else None
            if ctx is None:
                ctx = self.create(language, default_cwd())
                with self.lock:
                    self.default[language] = ctx.id
            return ctx

    def remove(self, cid):
        with self.lock:
            ctx = self.by_id.pop(cid, None)
            for lang, d in list(self.default.items()):
                if d == cid:
                    del self.default[lang]
        if ctx is not None:
            with ctx.lock:
                ctx.shutdown()
        return ctx

    def all(self):
        with self.lock:
            return list(self.by_id.values())

    def shutdown(self):
        for ctx in self.all():
            try:
                ctx.shutdown()
            except Exception:
                pass


def default_cwd():
    cwd = os.environ.get("CODE_INTERPRETER_CWD") or DEFAULT_CWD
    return cwd if os.path.isdir(cwd) else os.getcwd()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "airlock-code-interpreter/1"
    contexts = None  # set by main

    def log_message(self, fmt, *args):
        if os.environ.get("CODE_INTERPRETER_DEBUG"):
            log(fmt % args)

    def _cors(self):
        self.send_header("Access-Control-Allow-Origin", "*")

    def send_body(self, status, body, ctype):
        b = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(b)))
        self._cors()
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(b)

    def send_json(self, status, obj):
        self.send_body(status, json.dumps(obj), "application/json")

    def send_text(self, status, text):
        self.send_body(status, text, "text/plain; charset=utf-8")

    def read_json(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                raw += self.rfile.read(size)
                self.rfile.readline()
                if len(raw) > MAX_BODY:
                    raise ValueError("the body is too large")
        else:
            n = int(self.headers.get("Content-Length") or 0)
            if n > MAX_BODY:
                raise ValueError("the body is too large")
            raw = self.rfile.read(n) if n else b""
        if not raw.strip():
            return {}
        obj = json.loads(raw)
        if not isinstance(obj, dict):
            raise ValueError("the body must be a JSON object")
        return obj

    def route(self):
        parts = [p for p in urlsplit(self.path).path.split("/") if p]
        return parts

    def do_OPTIONS(self):
        self.send_response(204)
        self._cors()
        self.send_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS")
        self.send_header("Access-Control-Allow-Headers", self.headers.get("Access-Control-Request-Headers", "*"))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        parts = self.route()
        if parts == ["health"]:
            c = self.contexts
            if c.start_error:
                return self.send_text(500, "the default Python context failed to start: %s" % c.start_error)
            if not c.ready.is_set():
                return self.send_text(503, "starting")
            return self.send_json(200, "OK")
        if parts == ["contexts"]:
            return self.send_json(200, [{"id": x.id, "language": x.language, "cwd": x.cwd} for x in self.contexts.all()])
        self.send_text(404, "Not Found")

    def do_DELETE(self):
        parts = self.route()
        if len(parts) == 2 and parts[0] == "contexts":
            if self.contexts.remove(parts[1]) is None:
                return self.send_text(404, "Context %s not found" % parts[1])
            return self.send_json(200, None)
        self.send_text(404, "Not Found")

    def do_POST(self):
        parts = self.route()
        try:
            body = self.read_json()
        except (ValueError, UnicodeDecodeError) as e:
            return self.send_text(400, "invalid request body: %s" % e)
        if parts == ["execute"]:
            return self.execute(body)
        if parts == ["contexts"]:
            language = normalize_language(body.get("language"))
            cwd = body.get("cwd") or default_cwd()
            if not isinstance(cwd, str):
                return self.send_text(400, "cwd must be a string")
            try:
                ctx = self.contexts.create(language, cwd)
            except ValueError as e:
                return self.send_text(400, str(e))
            except Exception as e:
                log("create context:", traceback.format_exc())
                return self.send_text(500, "Failed to create context: %s" % e)
            return self.send_json(200, {"id": ctx.id, "language": ctx.language, "cwd": ctx.cwd})
        if len(parts) == 3 and parts[0] == "contexts" and parts[2] == "restart":
            ctx = self.contexts.get(parts[1])
            if ctx is None:
                return self.send_text(404, "Context %s not found" % parts[1])
            try:
                with ctx.lock:
                    ctx.restart()
            except Exception as e:
                return self.send_text(500, "Failed to restart context %s: %s" % (parts[1], e))
            return self.send_json(200, None)
        self.send_text(404, "Not Found")

    def execute(self, body):
        code = body.get("code")
        if not isinstance(code, str):
            return self.send_text(422, "code must be a string")
        context_id, language = body.get("context_id"), body.get("language")
        env_vars = body.get("env_vars") or {}
        if not isinstance(env_vars, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()):
            return self.send_text(422, "env_vars must be an object of strings")
        if context_id and language:
            return self.send_text(400, "Only one of context_id or language can be provided")
        if context_id:
            ctx = self.contexts.get(context_id)
            if ctx is None:
                return self.send_text(404, "Context %s not found" % context_id)
        else:
            try:
                ctx = self.contexts.get_default(normalize_language(language))
            except ValueError as e:
                return self.send_text(400, str(e))
            except Exception as e:
                log("default context:", traceback.format_exc())
                return self.send_text(500, "Failed to create context: %s" % e)

        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache")
        self._cors()
        self.end_headers()
        sock = self.connection
        broken = threading.Event()

        def emit(obj):
            if broken.is_set():
                raise ClientGone()
            data = (json.dumps(obj) + "\n").encode()
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            except OSError:
                broken.set()
                raise ClientGone()

        def gone():
            if broken.is_set():
                return True
            try:
                r, _, _ = select.select([sock], [], [], 0)
                if r and sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    broken.set()
            except BlockingIOError:
                pass
            except OSError:
                broken.set()
            return broken.is_set()

        out = Emitter(emit, gone)
        with ctx.lock:
            try:
                ctx.execute(code, env_vars, out, access_token=self.headers.get("X-Access-Token"))
            except ClientGone:
                self.close_connection = True
                return
            except Exception as e:
                log("execute:", traceback.format_exc())
                try:
                    emit({"type": "error", "name": type(e).__name__, "value": str(e), "traceback": traceback.format_exc()})
                except ClientGone:
                    self.close_connection = True
                    return
        try:
            emit({"type": "end_of_execution"})
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (ClientGone, OSError):
            self.close_connection = True


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main(argv=None):
    p = argparse.ArgumentParser(description="E2B code-interpreter protocol server")
    p.add_argument("--host", default=os.environ.get("CODE_INTERPRETER_HOST", "0.0.0.0"))
    p.add_argument("--port", type=int, default=int(os.environ.get("CODE_INTERPRETER_PORT", DEFAULT_PORT)))
    args = p.parse_args(argv)

    # ipykernel's debugger warns about frozen modules on every kernel start.
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    runtime_dir = tempfile.mkdtemp(prefix="code-interpreter-")
    contexts = Contexts(runtime_dir)
    Handler.contexts = contexts
    srv = Server((args.host, args.port), Handler)
    log("listening on %s:%d" % srv.server_address[:2])

    def start_default():
        try:
            contexts.get_default("python")
            contexts.ready.set()
            log("default python context ready")
        except Exception as e:
            contexts.start_error = "%s: %s" % (type(e).__name__, e)
            log("default python context:", traceback.format_exc())

    threading.Thread(target=start_default, daemon=True).start()

    def stop(signum, frame):
        threading.Thread(target=srv.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        srv.serve_forever(poll_interval=0.5)
    finally:
        contexts.shutdown()
        shutil.rmtree(runtime_dir, ignore_errors=True)
        log("stopped")


if __name__ == "__main__":
    main()
