# The unmodified E2B Python SDK (package e2b, pinned as e2bPythonVersion in
# internal/e2e/e2b_template_test.go) against a real Airlock: the scenario of
# test/e2b/sdk.test.mjs, test by test, run twice — with the sync client
# (e2b.Sandbox) and with the async client (e2b.AsyncSandbox). Run by
# internal/e2e/e2b_python_test.go, which starts Airlock and sets:
#   E2B_API_URL = E2B_SANDBOX_URL = the server URL, E2B_API_KEY = an e2b_ key.
# By hand: E2B_API_URL=… E2B_SANDBOX_URL=… E2B_API_KEY=… python -m pytest -q test/e2b/sdk_test.py
#
# Each scenario is written once as a coroutine; every SDK call goes through
# aw(), which awaits what the async client returns and passes the sync
# client's plain values through. Where the two clients' APIs differ in shape
# (PTY output, watch, streamed reads, command callbacks) the test branches
# on the mode. All tests of one mode share one event loop, so the async
# client's connections stay on the loop they were made on.
import asyncio
import inspect
import os
import random
import re
import socket
import time
from datetime import datetime, timedelta, timezone
from urllib.parse import urlparse

import httpx
import pytest

from e2b import (
    AsyncSandbox,
    AsyncSecret,
    AuthenticationException,
    CommandExitException,
    FileType,
    NotFoundException,
    PtySize,
    Sandbox,
    SandboxQuery,
    SandboxState,
    Secret,
)

API_URL = os.environ.get("E2B_API_URL")
RUN = f"run-{int(time.time() * 1000)}-{random.randrange(10**6)}"

pytestmark = pytest.mark.skipif(
    not API_URL or not os.environ.get("E2B_API_KEY"),
    reason="E2B_API_URL and E2B_API_KEY are not set (internal/e2e/e2b_python_test.go sets them)",
)


async def aw(v):
    """The value of an SDK call: awaited for the async client, as is for the sync one."""
    if inspect.isawaitable(v):
        return await v
    return v


async def raises(exc, v, match=None):
    """Asserts that the SDK call v (a coroutine or a thunk) raises exc; returns it."""
    try:
        await aw(v() if callable(v) else v)
    except exc as e:
        if match is not None:
            assert re.search(match, str(e)), f"{e!r} does not match {match!r}"
        return e
    raise AssertionError(f"no {exc.__name__} raised")


async def eventually(what, f, tries=240, delay=0.5):
    """Polls f until it returns a truthy value (the bound only stops a broken system from hanging the suite)."""
    last = None
    for _ in range(tries):
        try:
            v = await aw(f())
            if v:
                return v
        except Exception as e:  # noqa: BLE001
            last = e
        await asyncio.sleep(delay)
    raise AssertionError(f"{what} did not happen" + (f": last error {last!r}" if last else ""))


def state(s):
    return getattr(s, "value", s)


class Env:
    def __init__(self, mode):
        self.mode = mode
        self.S = Sandbox if mode == "sync" else AsyncSandbox
        self.loop = asyncio.new_event_loop()
        self.sbx = None

    @property
    def is_async(self):
        return self.mode == "async"

    def run(self, coro_fn):
        self.loop.run_until_complete(asyncio.wait_for(coro_fn(self), 5 * 60))


@pytest.fixture(scope="module", params=["sync", "async"])
def env(request):
    e = Env(request.param)

    async def setup():
        e.sbx = await aw(
            e.S.create(
                "base",
                envs={"SUITE_VAR": "from-create"},
                metadata={"suite": RUN + "-" + e.mode, "role": "main"},
                timeout=20 * 60,
            )
        )

    e.loop.run_until_complete(setup())
    e.suite = RUN + "-" + e.mode
    yield e

    async def teardown():
        try:
            await aw(e.sbx.kill())
        except Exception:  # noqa: BLE001
            pass

    e.loop.run_until_complete(teardown())
    # Background commands left running (web servers, timeout=0) keep their
    # async handles' stream tasks pending: end them before the loop closes.
    async def drain():
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    e.loop.run_until_complete(drain())
    e.loop.close()


def test_bad_api_key_is_rejected(env):
    async def t(e):
        await raises(AuthenticationException, lambda: e.S.list(api_key="e2b_" + "0" * 40).next_items())
        await raises(AuthenticationException, lambda: e.S.create("base", api_key="e2b_" + "f" * 40))

    env.run(t)


def test_create_with_envs_and_metadata_get_info(env):
    async def t(e):
        sbx = e.sbx
        assert sbx.sandbox_id.startswith("sb-")
        r = await aw(sbx.commands.run('echo "$SUITE_VAR"; whoami; pwd'))
        assert r.stdout == "from-create\nuser\n/home/user\n"
        info = await aw(sbx.get_info())
        assert info.sandbox_id == sbx.sandbox_id
        assert state(info.state) == "running"
        assert info.metadata["suite"] == e.suite
        assert info.metadata["role"] == "main"
        assert info.end_at > info.started_at, "end_at after started_at"
        assert await aw(sbx.is_running())

    env.run(t)


def test_commands_run_streaming_exit_codes_large_output(env):
    async def t(e):
        sbx = e.sbx
        out, err = [], []
        r = await aw(
            sbx.commands.run(
                "for i in 1 2 3; do echo out$i; echo err$i >&2; done",
                on_stdout=out.append,
                on_stderr=err.append,
            )
        )
        assert r.exit_code == 0
        assert "".join(out) == "out1\nout2\nout3\n"
        assert "".join(err) == "err1\nerr2\nerr3\n"
        assert r.stdout == "out1\nout2\nout3\n"

        ex = await raises(CommandExitException, lambda: sbx.commands.run("echo before; exit 7"))
        assert ex.exit_code == 7
        assert ex.stdout == "before\n"

        envs = await aw(sbx.commands.run('echo "$A-$SUITE_VAR"', envs={"A": "cmd"}, cwd="/tmp"))
        assert envs.stdout == "cmd-from-create\n"

        n = 4 * 1024 * 1024
        big = await aw(sbx.commands.run(f"head -c {n} /dev/zero | tr '\\0' a"))
        assert len(big.stdout) == n
        assert re.fullmatch(r"a+", big.stdout)

    env.run(t)


def test_background_commands_wait_list_kill(env):
    async def t(e):
        sbx = e.sbx
        h = await aw(sbx.commands.run("echo started; sleep 1; echo finished", background=True))
        assert h.pid > 0
        r = await aw(h.wait())
        assert r.stdout == "started\nfinished\n"

        sleeper = await aw(sbx.commands.run("sleep 600", background=True, timeout=0))
        listed = await aw(sbx.commands.list())
        assert any(p.pid == sleeper.pid for p in listed), f"pid {sleeper.pid} in {listed}"
        assert await aw(sleeper.kill()) is True
        await raises(CommandExitException, lambda: sleeper.wait())
        assert await aw(sbx.commands.kill(999999)) is False

    env.run(t)


def test_send_stdin(env):
    async def t(e):
        sbx = e.sbx
        h = await aw(sbx.commands.run('read a; read b; echo "got:$a:$b"', background=True, stdin=True))
        await aw(sbx.commands.send_stdin(h.pid, "one\n"))
        await aw(sbx.commands.send_stdin(h.pid, "two\n"))
        r = await aw(h.wait())
        assert r.stdout == "got:one:two\n"

    env.run(t)


def test_pty_input_and_resize(env):
    async def t(e):
        sbx = e.sbx
        chunks = []
        if e.is_async:
            pty = await sbx.pty.create(PtySize(rows=24, cols=80), on_data=chunks.append)
        else:
            pty = sbx.pty.create(PtySize(rows=24, cols=80))
        await aw(sbx.pty.resize(pty.pid, PtySize(rows=40, cols=120)))
        await aw(sbx.pty.send_stdin(pty.pid, b"stty size; echo $((6*7))x\nexit\n"))
        try:
            if e.is_async:
                await pty.wait()
            else:
                pty.wait(on_pty=chunks.append)
        except Exception:  # noqa: BLE001 (as in JS: the exit status does not matter)
            pass
        text = b"".join(chunks).decode(errors="replace")
        assert re.search(r"40 120", text), text
        assert re.search(r"42x", text), text

    env.run(t)


def test_files_write_read_list_exists_get_info_make_dir_rename_remove(env):
    async def t(e):
        sbx = e.sbx
        d = f"/home/user/files-{e.suite}"
        assert await aw(sbx.files.make_dir(d)) is True
        assert await aw(sbx.files.make_dir(d)) is False

        w = await aw(sbx.files.write(f"{d}/hello.txt", "hello world"))
        assert w.path == f"{d}/hello.txt"
        assert await aw(sbx.files.read(f"{d}/hello.txt")) == "hello world"

        data = bytes(range(256))
        await aw(sbx.files.write(f"{d}/bin.dat", data))
        back = await aw(sbx.files.read(f"{d}/bin.dat", format="bytes"))
        assert bytes(back) == data

        many = await aw(
            sbx.files.write_files(
                [
                    {"path": f"{d}/m/a.txt", "data": "A"},
                    {"path": f"{d}/m/b.txt", "data": "B"},
                ]
            )
        )
        assert len(many) == 2

        stream = await aw(sbx.files.read(f"{d}/m/a.txt", format="stream"))
        s = b""
        if e.is_async:
            async for c in stream:
                s += c
        else:
            for c in stream:
                s += c
        assert s.decode() == "A"

        names = sorted(x.name for x in await aw(sbx.files.list(d)))
        assert names == ["bin.dat", "hello.txt", "m"]

        assert await aw(sbx.files.exists(f"{d}/hello.txt")) is True
        assert await aw(sbx.files.exists(f"{d}/nope")) is False

        info = await aw(sbx.files.get_info(f"{d}/bin.dat"))
        assert info.type == FileType.FILE
        assert info.size == 256
        assert info.name == "bin.dat"
        assert (await aw(sbx.files.get_info(f"{d}/m"))).type == FileType.DIR

        moved = await aw(sbx.files.rename(f"{d}/hello.txt", f"{d}/moved.txt"))
        assert moved.path == f"{d}/moved.txt"
        assert await aw(sbx.files.exists(f"{d}/hello.txt")) is False

        await aw(sbx.files.remove(f"{d}/m"))
        assert await aw(sbx.files.exists(f"{d}/m")) is False
        await raises(NotFoundException, lambda: sbx.files.read(f"{d}/m/a.txt"))

        # Written files belong to the default user, as in E2B.
        own = await aw(sbx.commands.run(f"stat -c %U {d}/moved.txt"))
        assert own.stdout.strip() == "user"

    env.run(t)


def test_files_watch_dir(env):
    async def t(e):
        sbx = e.sbx
        d = f"/home/user/watch-{e.suite}"
        await aw(sbx.files.make_dir(d))
        events = []
        if e.is_async:
            handle = await sbx.files.watch_dir(d, events.append)
        else:
            # The sync client polls: CreateWatcher, then GetWatcherEvents.
            handle = sbx.files.watch_dir(d)
        await aw(sbx.files.write(f"{d}/new.txt", "x"))

        def seen():
            if not e.is_async:
                events.extend(handle.get_new_events())
            return any(ev.name == "new.txt" for ev in events)

        await eventually("a watch event for new.txt", seen)
        await aw(handle.stop())

    env.run(t)


def test_web_server_reached_through_header_routing(env):
    async def t(e):
        sbx = e.sbx
        await aw(sbx.files.write("/tmp/www/index.html", "served from the sandbox"))
        await aw(sbx.commands.run("cd /tmp/www && python3 -m http.server 8000", background=True, timeout=0))

        def get():
            res = httpx.get(
                f"{API_URL}/index.html",
                headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8000"},
            )
            return res.text if res.status_code == 200 else None

        body = await eventually("the web server answering", get)
        assert body == "served from the sandbox"
        assert sbx.get_host(8000) == f"8000-{sbx.sandbox_id}.{sbx.sandbox_domain or 'e2b.app'}"

    env.run(t)


def test_allow_public_traffic_false_ports_need_the_traffic_access_token(env):
    async def t(e):
        sbx = e.sbx
        priv = await aw(e.S.create("base", network={"allow_public_traffic": False}, timeout=5 * 60))
        try:
            assert re.match(r"^tt_", priv.traffic_access_token or "")
            assert sbx.traffic_access_token is None  # E2B's default: public
            await aw(priv.files.write("/tmp/www/index.html", "private page"))
            await aw(priv.commands.run("cd /tmp/www && python3 -m http.server 8002", background=True, timeout=0))
            hdr = {"E2b-Sandbox-Id": priv.sandbox_id, "E2b-Sandbox-Port": "8002"}

            def get():
                res = httpx.get(
                    f"{API_URL}/index.html",
                    headers={**hdr, "e2b-traffic-access-token": priv.traffic_access_token},
                )
                return res.text if res.status_code == 200 else None

            body = await eventually("the private web server answering", get)
            assert body == "private page"
            res = httpx.get(f"{API_URL}/index.html", headers=hdr)
            assert res.status_code == 401
            assert re.search(r"traffic token", res.json()["message"])
            info = await aw(priv.get_info())
            assert (info.network or {}).get("allow_public_traffic") is False, info.network
            again = await aw(e.S.connect(priv.sandbox_id))
            assert again.traffic_access_token == priv.traffic_access_token
        finally:
            try:
                await aw(priv.kill())
            except Exception:  # noqa: BLE001
                pass

    env.run(t)


UPGRADE_ECHO = "\n".join(
    [
        "import http.server",
        "class H(http.server.BaseHTTPRequestHandler):",
        "    protocol_version = 'HTTP/1.1'",
        "    def do_GET(self):",
        "        self.send_response(101)",
        "        self.send_header('Upgrade', 'echo')",
        "        self.send_header('Connection', 'Upgrade')",
        "        self.end_headers()",
        "        self.wfile.flush()",
        "        while True:",
        "            line = self.rfile.readline()",
        "            if not line:",
        "                break",
        "            self.wfile.write(b'echo:' + line)",
        "            self.wfile.flush()",
        "http.server.HTTPServer(('127.0.0.1', 8001), H).serve_forever()",
    ]
)


def test_an_upgraded_connection_to_a_port_in_the_sandbox(env):
    async def t(e):
        sbx = e.sbx
        await aw(sbx.files.write("/tmp/upgrade_echo.py", UPGRADE_ECHO))
        await aw(sbx.commands.run("python3 /tmp/upgrade_echo.py", background=True, timeout=0))
        u = urlparse(API_URL)

        def upgrade():
            sock = socket.create_connection((u.hostname, u.port or 80), timeout=30)
            req = (
                f"GET /chat HTTP/1.1\r\nHost: {u.netloc}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n"
                f"E2b-Sandbox-Id: {sbx.sandbox_id}\r\nE2b-Sandbox-Port: 8001\r\n\r\n"
            )
            sock.sendall(req.encode())
            head = b""
            while b"\r\n\r\n" not in head:
                c = sock.recv(4096)
                if not c:
                    break
                head += c
            status = head.split(b"\r\n", 1)[0]
            if b" 101 " not in status + b" ":
                sock.close()
                raise AssertionError(f"no upgrade: {status!r}")
            return sock, head.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in head else b""

        sock, rest = await eventually("the upgrade server answering", upgrade)
        try:
            sock.sendall(b"ping\n")
            buf = rest
            while b"\n" not in buf:
                c = sock.recv(4096)
                if not c:
                    break
                buf += c
        finally:
            sock.close()
        assert buf.decode() == "echo:ping\n"

    env.run(t)


def test_get_metrics(env):
    async def t(e):
        m = await aw(e.sbx.get_metrics())
        assert isinstance(m, list) and len(m) >= 1, f"metrics: {m}"
        for x in m:
            assert x.cpu_count >= 1
            assert x.mem_total > 0

    env.run(t)


def test_list_with_metadata_and_state_filters(env):
    async def t(e):
        S, sbx = e.S, e.sbx
        other = await aw(S.create("base", metadata={"suite": e.suite, "role": "other"}, timeout=10 * 60))
        try:
            mine = await aw(S.list(query=SandboxQuery(metadata={"suite": e.suite})).next_items())
            assert sorted(s.sandbox_id for s in mine) == sorted([sbx.sandbox_id, other.sandbox_id])
            main = await aw(S.list(query=SandboxQuery(metadata={"suite": e.suite, "role": "main"})).next_items())
            assert [s.sandbox_id for s in main] == [sbx.sandbox_id]
            running = await aw(
                S.list(query=SandboxQuery(metadata={"suite": e.suite}, state=[SandboxState.RUNNING])).next_items()
            )
            assert len(running) == 2
            paused = await aw(
                S.list(query=SandboxQuery(metadata={"suite": e.suite}, state=[SandboxState.PAUSED])).next_items()
            )
            assert len(paused) == 0
            p = S.list(query=SandboxQuery(metadata={"suite": e.suite}), limit=1)
            first = await aw(p.next_items())
            assert len(first) == 1
            assert p.has_next is True
            second = await aw(p.next_items())
            assert len(second) == 1
            assert first[0].sandbox_id != second[0].sandbox_id
        finally:
            await aw(other.kill())

    env.run(t)


def test_set_timeout_the_sandbox_ends_when_it_expires(env):
    async def t(e):
        s = await aw(e.S.create("base", metadata={"suite": e.suite, "role": "timeout"}))
        await aw(s.set_timeout(2))

        async def ended():
            return not await aw(s.is_running())

        await eventually("the sandbox ending after its timeout", ended)
        await raises(NotFoundException, lambda: s.get_info())

    env.run(t)


def test_kill_is_running_false_connect_raises_not_found(env):
    async def t(e):
        S = e.S
        s = await aw(S.create("base", metadata={"suite": e.suite, "role": "kill"}))
        assert await aw(s.is_running()) is True
        assert await aw(s.kill()) is True
        assert await aw(s.is_running()) is False
        await raises(NotFoundException, lambda: S.connect(s.sandbox_id))
        assert await aw(S.kill(s.sandbox_id)) is False

    env.run(t)


def test_pause_then_connect_resumes_with_files_and_a_background_process(env):
    async def t(e):
        S = e.S
        s = await aw(S.create("base", metadata={"suite": e.suite, "role": "pause"}, timeout=10 * 60))
        try:
            await aw(s.files.write("/home/user/kept.txt", "kept across pause"))
            bg = await aw(s.commands.run("sleep 900", background=True, timeout=0))
            assert await aw(s.pause()) is True
            assert await aw(s.is_running()) is False
            assert state((await aw(s.get_info())).state) == "paused"
            assert await aw(s.pause()) is False, "pausing a paused sandbox answers False (409)"

            back = await aw(S.connect(s.sandbox_id))
            assert await aw(back.is_running()) is True
            assert await aw(back.files.read("/home/user/kept.txt")) == "kept across pause"
            procs = await aw(back.commands.list())
            assert any(p.pid == bg.pid for p in procs), f"pid {bg.pid} survives: {procs}"
        finally:
            try:
                await aw(s.kill())
            except Exception:  # noqa: BLE001
                pass

    env.run(t)


def test_commands_connect_reattaches_close_stdin_ends_input(env):
    async def t(e):
        sbx = e.sbx
        h = await aw(sbx.commands.run("for i in 1 2 3; do echo tick$i; sleep 0.3; done", background=True))
        seen = []
        if e.is_async:
            again = await sbx.commands.connect(h.pid, on_stdout=seen.append)
            r = await again.wait()
        else:
            again = sbx.commands.connect(h.pid)
            r = again.wait(on_stdout=seen.append)
        assert r.exit_code == 0
        assert re.search(r"tick3", r.stdout + "".join(seen))

        cat = await aw(sbx.commands.run("cat; echo done", background=True, stdin=True))
        await aw(sbx.commands.send_stdin(cat.pid, "abc"))
        await aw(sbx.commands.close_stdin(cat.pid))
        assert (await aw(cat.wait())).stdout == "abcdone\n"

    env.run(t)


def test_files_gzip_octet_stream_signed_upload_and_download_urls(env):
    async def t(e):
        sbx = e.sbx
        await aw(sbx.files.write("/home/user/gz.txt", "compressed both ways", gzip=True))
        assert await aw(sbx.files.read("/home/user/gz.txt", gzip=True)) == "compressed both ways"
        await aw(sbx.files.write("/home/user/octet.txt", "raw body", use_octet_stream=True))
        assert await aw(sbx.files.read("/home/user/octet.txt")) == "raw body"

        # With E2B_SANDBOX_URL the signed URLs carry no sandbox id: the caller
        # adds the routing header (see docs/e2b.md).
        route = {"E2b-Sandbox-Id": sbx.sandbox_id}
        up = sbx.upload_url("/home/user/signed.txt", use_signature_expiration=60)
        assert re.search(r"signature=v1_", up), up
        res = httpx.post(up, files={"file": ("/home/user/signed.txt", b"via signed url")}, headers=route)
        assert res.status_code == 200, res.text
        down = sbx.download_url("/home/user/signed.txt")
        got = httpx.get(down, headers=route)
        assert got.status_code == 200
        assert got.text == "via signed url"
        forged = httpx.get(re.sub(r"signature=[^&]+", "signature=v1_forged", down), headers=route)
        assert forged.status_code == 401

    env.run(t)


def test_update_network_replaces_the_egress_lists_get_info_reports_them(env):
    async def t(e):
        sbx = e.sbx
        await aw(sbx.update_network({"allow_out": ["203.0.113.7"], "deny_out": ["0.0.0.0/0"]}))
        info = await aw(sbx.get_info())
        assert info.allow_internet_access is False
        assert info.network["allow_out"] == ["203.0.113.7"]
        assert info.network["deny_out"] == ["0.0.0.0/0"]
        await aw(sbx.update_network({}))  # omitted fields are cleared: the org's default again
        after = await aw(sbx.get_info())
        assert after.allow_internet_access is True
        assert (after.network or {}).get("allow_out") is None

    env.run(t)


def test_unsupported_calls_fail_fast_and_name_the_gap(env):
    async def t(e):
        S = e.S
        await raises(Exception, lambda: S.create("base", mcp={"exa": {"apiKey": "x"}}), match=r"MCP gateways are not supported")
        await raises(Exception, lambda: e.sbx.create_snapshot(mode="filesystem"), match=r"not supported by Airlock")

    env.run(t)


async def all_items(paginator):
    out = []
    while paginator.has_next:
        out.extend(await aw(paginator.next_items()))
    return out


def test_snapshots_create_from_list_delete(env):
    async def t(e):
        S, sbx = e.S, e.sbx
        await aw(sbx.files.write("/home/user/snap.txt", "in the snapshot"))
        snap = await aw(sbx.create_snapshot(name=f"suite-snap-{e.mode}"))
        assert snap.snapshot_id == f"{sbx.sandbox_id}:suite-snap-{e.mode}"
        await aw(sbx.files.write("/home/user/snap.txt", "after the snapshot"))
        mine = await all_items(S.list_snapshots(sandbox_id=sbx.sandbox_id))
        assert any(x.snapshot_id == snap.snapshot_id for x in mine), mine
        everything = await all_items(S.list_snapshots(limit=2))
        assert any(x.snapshot_id == snap.snapshot_id for x in everything)
        child = await aw(S.create(snap.snapshot_id, metadata={"suite": e.suite, "role": "from-snapshot"}))
        try:
            assert await aw(child.files.read("/home/user/snap.txt")) == "in the snapshot"
        finally:
            await aw(child.kill())
        assert await aw(S.delete_snapshot(snap.snapshot_id)) is True
        assert await aw(S.delete_snapshot(snap.snapshot_id)) is False
        after = await all_items(S.list_snapshots(sandbox_id=sbx.sandbox_id))
        assert not any(x.snapshot_id == snap.snapshot_id for x in after)

    env.run(t)


def test_fork_two_independent_sandboxes(env):
    async def t(e):
        sbx = e.sbx
        await aw(sbx.files.write("/home/user/fork.txt", "before the fork"))
        forks = await aw(sbx.fork(count=2, timeout=300))
        try:
            assert len(forks) == 2
            for f in forks:
                assert not isinstance(f, Exception), f
                assert f.sandbox_id != sbx.sandbox_id
                assert await aw(f.files.read("/home/user/fork.txt")) == "before the fork"
            await aw(forks[0].files.write("/home/user/fork.txt", "changed"))
            assert await aw(forks[1].files.read("/home/user/fork.txt")) == "before the fork"
        finally:
            for f in forks:
                if not isinstance(f, Exception):
                    await aw(f.kill())

    env.run(t)


def test_auto_resume_traffic_wakes_a_paused_sandbox(env):
    async def t(e):
        S = e.S
        auto = await aw(S.create("base", metadata={"suite": e.suite, "role": "autoresume"}, lifecycle={"on_timeout": "pause", "auto_resume": True}))
        manual = await aw(S.create("base", metadata={"suite": e.suite, "role": "manual"}))
        try:
            assert ((await aw(auto.get_info())).lifecycle or {}).get("auto_resume") is True
            await aw(auto.files.write("/home/user/a.txt", "kept"))
            await aw(auto.pause())
            await aw(manual.pause())
            assert state((await aw(auto.get_info())).state) == "paused"
            assert await aw(auto.files.read("/home/user/a.txt")) == "kept"
            assert state((await aw(auto.get_info())).state) == "running"
            await raises(Exception, lambda: manual.commands.run("true"), match=r"not running|paused|resume")
        finally:
            await aw(auto.kill())
            await aw(manual.kill())

    env.run(t)


def test_list_order_template_started_after_before_paging(env):
    async def t(e):
        S = e.S
        t0 = datetime.now(timezone.utc) - timedelta(seconds=1)
        a = await aw(S.create("base", metadata={"suite": e.suite, "role": "order-a"}))
        b = await aw(S.create("base", metadata={"suite": e.suite, "role": "order-b"}))
        try:
            async def ids(**kw):
                return [x.sandbox_id for x in await all_items(S.list(**kw))]

            q = dict(metadata={"suite": e.suite}, started_after=t0)
            assert await ids(query=SandboxQuery(**q), limit=1) == [b.sandbox_id, a.sandbox_id]
            assert await ids(query=SandboxQuery(**q), limit=1, order="asc") == [a.sandbox_id, b.sandbox_id]
            assert await ids(query=SandboxQuery(template="nope", **q)) == []
            odd = await aw(S.create("base", metadata={"suite": e.suite, "a b&c": "x=y%z/1"}))
            try:
                assert await ids(query=SandboxQuery(metadata={"a b&c": "x=y%z/1"})) == [odd.sandbox_id]
            finally:
                await aw(odd.kill())
        finally:
            await aw(a.kill())
            await aw(b.kill())

    env.run(t)


def test_get_host_names_the_answered_domain(env):
    async def t(e):
        host = urlparse(API_URL).netloc.replace("127.0.0.1", "localhost", 1)
        assert e.sbx.get_host(8000) == f"8000-{e.sbx.sandbox_id}.{host}"

    env.run(t)


def test_secrets_create_get_list_update_destroy(env):
    async def t(e):
        Sec = Secret if e.mode == "sync" else AsyncSecret
        name = re.sub(r"[^a-z0-9-]", "-", f"suite-{e.suite}".lower())[:60]
        info = await aw(Sec.create(name, "v1"))
        assert info.name == name and info.secret_id == f"sec_{name}"
        assert (await aw(Sec.get_info(info.secret_id))).name == name
        assert any(x.name == name for x in await all_items(Sec.list()))
        await aw(Sec.update(info.secret_id, "v2"))
        assert await aw(Sec.exists(info.secret_id)) is True
        await aw(Sec.destroy(info.secret_id))
        assert await aw(Sec.exists(info.secret_id)) is False

    env.run(t)


def test_auto_pause_paused_at_its_timeout_and_connect_resumes_it(env):
    async def t(e):
        S = e.S
        s = await aw(S.create("base", metadata={"suite": e.suite, "role": "autopause"}, lifecycle={"on_timeout": "pause"}))
        try:
            await aw(s.files.write("/home/user/auto.txt", "still here"))
            assert ((await aw(s.get_info())).lifecycle or {}).get("on_timeout") == "pause"
            await aw(s.set_timeout(2))

            async def paused():
                return state((await aw(s.get_info())).state) == "paused"

            await eventually("the sandbox pausing at its timeout", paused)
            assert await aw(s.is_running()) is False
            back = await aw(S.connect(s.sandbox_id, timeout=120))
            assert await aw(back.files.read("/home/user/auto.txt")) == "still here"
            info = await aw(back.get_info())
            assert state(info.state) == "running"
            end = info.end_at if info.end_at.tzinfo else info.end_at.replace(tzinfo=timezone.utc)
            assert end > datetime.now(timezone.utc) + timedelta(seconds=60), (
                f"a resumed sandbox gets a fresh timeout: {info.end_at}"
            )
        finally:
            try:
                await aw(s.kill())
            except Exception:  # noqa: BLE001
                pass

    env.run(t)
