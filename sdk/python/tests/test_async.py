"""The async client beyond the conformance scenario."""

from __future__ import annotations

import asyncio
import io
from typing import List, Tuple

import pytest

import airlock


@pytest.fixture
async def aclient(airlock_env: Tuple[str, str]):
    async with airlock.AsyncAirlock(url=airlock_env[0], api_key=airlock_env[1]) as c:
        yield c


async def test_async_commands_files_events(aclient: airlock.AsyncAirlock, run_id: str) -> None:
    async with await aclient.sandboxes.create(template="base", metadata={"async": run_id}) as sb:
        got: List[str] = []
        h = await sb.commands.start("echo a; sleep 0.2; echo b >&2", on_stdout=got.append)
        events = [(e.stream, e.text) async for e in h]
        assert events == [("stdout", "a\n"), ("stderr", "b\n")] and got == ["a\n"]
        assert (await h.wait()).exit_code == 0

        h = await sb.commands.start("for i in 1 2 3; do echo $i; sleep 0.3; done")
        first = await h.events().__anext__()
        await h.detach()
        h2 = await sb.commands.connect(h.id, h.token, offset=h.offset)
        assert first.text + (await h2.wait()).stdout == "1\n2\n3\n"

        h = await sb.commands.start(argv=["sleep", "60"])
        await asyncio.sleep(0.3)
        await h.signal("KILL")
        r = await h.wait()
        assert r.signal == "KILL" and r.exit_code == -1

        await sb.files.write("/home/user/x.bin", io.BytesIO(b"x" * 300000))
        chunks = [c async for c in sb.files.read_stream("/home/user/x.bin", chunk_size=65536)]
        assert b"".join(chunks) == b"x" * 300000

        await sb.suspend()
        assert sb.state == "suspended"
        async for ev in aclient.events(sandbox_id=sb.id):
            if ev.type == "sandbox.state" and ev.data.get("state") == "suspended":
                break
        await sb.wake()
        assert (await sb.commands.run("echo back")).stdout == "back\n"
        sid = sb.id
    assert (await aclient.sandboxes.get(sid)).state == "deleted"


async def test_async_typed_errors(airlock_env: Tuple[str, str]) -> None:
    async with airlock.AsyncAirlock(url=airlock_env[0], api_key="al_" + "1" * 40) as bad:
        with pytest.raises(airlock.Unauthorized):
            await bad.sandboxes.get("sb-" + "a" * 26)
    async with airlock.AsyncAirlock(url=airlock_env[0], api_key=airlock_env[1]) as c:
        with pytest.raises(airlock.NotFound):
            await c.sandboxes.get("sb-" + "a" * 26)
