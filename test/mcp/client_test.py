"""Drives `airlock mcp` with the official Python MCP client library.

Run by internal/mcp's TestPythonMCPClient, which starts a real `airlock up`
and sets:
  AIRLOCK_BIN      the airlock binary
  AIRLOCK_URL      the API URL
  AIRLOCK_API_KEY  an API key of it
"""

import asyncio
import json
import os
import socket
import subprocess
import tempfile
import time

import httpx2
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

BIN = os.environ["AIRLOCK_BIN"]
URL = os.environ["AIRLOCK_URL"]
KEY = os.environ["AIRLOCK_API_KEY"]

TOOLS = {
    "create_sandbox", "list_sandboxes", "get_sandbox", "delete_sandbox",
    "run_command", "read_file", "write_file", "list_files",
    "pause_sandbox", "resume_sandbox", "suspend_sandbox", "wake_sandbox",
    "checkpoint_sandbox", "rollback_sandbox", "fork_sandbox",
}


async def call(s, name, **args):
    """Calls a tool that must succeed and returns its structured content."""
    r = await s.call_tool(name, args)
    text = " ".join(getattr(c, "text", "") for c in r.content)
    assert not r.is_error, f"{name}({args}) failed: {text}"
    assert r.structured_content is not None, f"{name}: no structured content"
    assert text, f"{name}: no text content"
    return r.structured_content


async def call_error(s, name, **args):
    """Calls a tool that must fail with a tool error; returns its text."""
    r = await s.call_tool(name, args)
    text = " ".join(getattr(c, "text", "") for c in r.content)
    assert r.is_error, f"{name}({args}) should have failed, got {r.structured_content}"
    return text


async def check_tools(s):
    tools = (await s.list_tools()).tools
    names = {t.name for t in tools}
    assert TOOLS <= names, f"missing tools: {TOOLS - names}"
    rc = next(t for t in tools if t.name == "run_command")
    props = rc.input_schema["properties"]
    for p in ("sandbox_id", "cmd", "argv", "cwd", "env", "stdin", "timeout_s"):
        assert p in props, f"run_command has no {p}"
        assert props[p].get("description"), f"run_command.{p} has no description"
    assert "sandbox_id" in rc.input_schema.get("required", [])


async def scenario(s):
    await check_tools(s)
    sb = await call(s, "create_sandbox", template="base", metadata={"test": "mcp-py"})
    sid = sb["id"]
    assert sid.startswith("sb-") and sb["state"] == "running", sb
    try:
        listed = await call(s, "list_sandboxes", metadata={"test": "mcp-py"})
        assert sid in [x["id"] for x in listed["sandboxes"]], listed

        got = await call(s, "get_sandbox", sandbox_id=sid)
        assert got["id"] == sid and got["state"] == "running"

        r = await call(s, "run_command", sandbox_id=sid, cmd="echo out; echo err >&2; exit 3")
        assert r["exit_code"] == 3 and r["stdout"] == "out\n" and r["stderr"] == "err\n", r
        assert r["timed_out"] is False

        r = await call(s, "run_command", sandbox_id=sid, argv=["cat"], stdin="piped in")
        assert r["exit_code"] == 0 and r["stdout"] == "piped in", r

        r = await call(s, "run_command", sandbox_id=sid, argv=["sh", "-c", "echo $FOO; pwd"],
                       env={"FOO": "bar"}, cwd="/tmp")
        assert r["stdout"] == "bar\n/tmp\n", r

        t0 = time.monotonic()
        r = await call(s, "run_command", sandbox_id=sid, argv=["sleep", "30"], timeout_s=2)
        assert r["timed_out"] is True and r["exit_code"] != 0, r
        assert time.monotonic() - t0 < 25, "the timeout did not cut the command short"

        r = await call(s, "run_command", sandbox_id=sid, cmd="head -c 100000 /dev/zero | tr '\\0' a")
        assert r["stdout_truncated"] is True and "truncated" in r["stdout"], r["stdout"][-200:]
        assert len(r["stdout"]) < 70000

        w = await call(s, "write_file", sandbox_id=sid, path="/tmp/mcp/hello.txt", content="héllo\nworld\n")
        assert w["size"] == len("héllo\nworld\n".encode())
        rf = await call(s, "read_file", sandbox_id=sid, path="/tmp/mcp/hello.txt")
        assert rf["content"] == "héllo\nworld\n", rf
        ls = await call(s, "list_files", sandbox_id=sid, path="/tmp/mcp")
        entry = next(e for e in ls["entries"] if e["name"] == "hello.txt")
        assert entry["type"] == "file" and entry["size"] == w["size"], ls

        await call(s, "run_command", sandbox_id=sid, cmd="printf 'a\\000\\377b' > /tmp/mcp/bin")
        msg = await call_error(s, "read_file", sandbox_id=sid, path="/tmp/mcp/bin")
        assert "binary" in msg, msg
        msg = await call_error(s, "read_file", sandbox_id=sid, path="/tmp/mcp/nope")
        assert msg, "no message for a missing file"

        p = await call(s, "pause_sandbox", sandbox_id=sid)
        assert p["state"] == "paused", p
        wk = await call(s, "wake_sandbox", sandbox_id=sid)
        assert wk["state"] == "running", wk
        r = await call(s, "run_command", sandbox_id=sid, cmd="cat /tmp/mcp/hello.txt")
        assert r["stdout"] == "héllo\nworld\n", r

        msg = await call_error(s, "get_sandbox", sandbox_id="sb-doesnotexist")
        assert "not" in msg.lower() and "404" in msg, msg
        msg = await call_error(s, "run_command", sandbox_id=sid)
        assert "cmd" in msg and "argv" in msg, msg
    finally:
        d = await call(s, "delete_sandbox", sandbox_id=sid)
        assert d["deleted"] is True
    r = await s.call_tool("get_sandbox", {"sandbox_id": sid})
    assert r.is_error or r.structured_content["state"] == "deleted", r


def test_stdio():
    async def main():
        params = StdioServerParameters(command=BIN, args=["mcp"],
                                       env={"AIRLOCK_URL": URL, "AIRLOCK_API_KEY": KEY})
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                await scenario(s)
    asyncio.run(main())


def free_port():
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def test_streamable_http():
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}/mcp"
    # No default key: every request must bring its own.
    env = {k: v for k, v in os.environ.items() if k != "AIRLOCK_API_KEY"}
    env["AIRLOCK_DATA_DIR"] = tempfile.mkdtemp()  # no admin.key there
    env["AIRLOCK_URL"] = URL
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([BIN, "mcp", "--listen", f"127.0.0.1:{port}"], env=env,
                            stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, "airlock mcp --listen exited"
                assert time.monotonic() < deadline, "airlock mcp --listen did not listen"
                time.sleep(0.1)

        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "t", "version": "0"}}}
        hdr = {"Accept": "application/json, text/event-stream"}
        r = httpx2.post(endpoint, json=init, headers=hdr)
        assert r.status_code == 401, (r.status_code, r.text)
        r = httpx2.post(endpoint, json=init, headers={**hdr, "Authorization": "Basic eDp5"})
        assert r.status_code == 401, (r.status_code, r.text)

        async def main():
            # A wrong key reaches the API, which refuses it: a tool error.
            async with create_mcp_http_client(headers={"Authorization": "Bearer not-a-key"}) as hc:
                async with streamable_http_client(endpoint, http_client=hc) as streams:
                    async with ClientSession(streams[0], streams[1]) as s:
                        await s.initialize()
                        msg = await call_error(s, "list_sandboxes")
                        assert "401" in msg, msg
            async with create_mcp_http_client(headers={"Authorization": "Bearer " + KEY}) as hc:
                async with streamable_http_client(endpoint, http_client=hc) as streams:
                    async with ClientSession(streams[0], streams[1]) as s:
                        await s.initialize()
                        await check_tools(s)
                        sb = await call(s, "create_sandbox", metadata={"test": "mcp-http"})
                        try:
                            r = await call(s, "run_command", sandbox_id=sb["id"], cmd="echo via http; exit 3")
                            assert r["exit_code"] == 3 and r["stdout"] == "via http\n", r
                        finally:
                            await call(s, "delete_sandbox", sandbox_id=sb["id"])
        asyncio.run(main())
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.seek(0)
        print(log.read().decode(errors="replace"))
