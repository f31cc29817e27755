"""Runs sdk/conformance/scenario.json step by step, as its README defines,
with the sync client and again with the async client."""

from __future__ import annotations

import contextlib
import json
import os
import re
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

import airlock

# AIRLOCK_CONFORMANCE_SCENARIO runs another scenario file (to try a change to it).
SCENARIO = Path(os.environ.get("AIRLOCK_CONFORMANCE_SCENARIO")
                or Path(__file__).resolve().parents[2] / "conformance" / "scenario.json")

ERROR_CLASSES = {
    "not_found": airlock.NotFound,
    "conflict": airlock.Conflict,
    "invalid": airlock.InvalidRequest,
    "quota_exceeded": airlock.QuotaExceeded,
}

# The expect keys each step may check (README "Steps"); any other is a scenario error.
EXPECT_KEYS = {
    "create": {"state", "template", "metadata"},
    "get": {"state"},
    "list": {"ids"},
    "run": {"exit_code", "stdout", "stderr", "timed_out"},
    "write_file": {"size"},
    "read_file": {"data"},
    "list_files": {"names"},
    "stat": {"type", "size", "name"},
    "mkdir": {"type"},
    "move": {"name"},
    "remove": set(),
    "pause": {"state"}, "resume": {"state"}, "suspend": {"state"}, "wake": {"state"}, "delete": {"state"},
}


def load_steps() -> List[Dict[str, Any]]:
    doc = json.loads(SCENARIO.read_text())
    assert doc["version"] == 1, f"scenario version {doc['version']} is not 1"
    return doc["steps"]


class Substituter:
    def __init__(self, run: str) -> None:
        self.run = run
        self.sandbox = ""

    def __call__(self, v: Any) -> Any:
        if isinstance(v, str):
            return v.replace("${run}", self.run).replace("${sdk}", "python").replace("${sandbox}", self.sandbox)
        if isinstance(v, list):
            return [self(x) for x in v]
        if isinstance(v, dict):
            return {k: self(x) for k, x in v.items()}
        return v


def check(step: Dict[str, Any], expect: Dict[str, Any], got: Dict[str, Any]) -> None:
    """Compare each expect key with what the step produced."""
    name = step["name"]
    for key, want in expect.items():
        assert key in got, f"step {name!r}: the runner produced no {key!r}"
        have = got[key]
        if key == "metadata":
            for k, v in want.items():
                assert have.get(k) == v, f"step {name!r}: metadata {k}={have.get(k)!r}, want {v!r}"
        elif key == "ids":
            assert sorted(have) == sorted(want), f"step {name!r}: ids {have}, want {want}"
        else:
            assert have == want, f"step {name!r}: {key} = {have!r}, want {want!r}"


def validate(step: Dict[str, Any]) -> Tuple[Dict[str, Any], Optional[str]]:
    do = step["do"]
    assert do in EXPECT_KEYS, f"step {step['name']!r}: unknown do {do!r}"
    expect = dict(step.get("expect") or {})
    err = expect.pop("error", None)
    extra = set(expect) - EXPECT_KEYS[do]
    assert not extra, f"step {step['name']!r}: expect keys {sorted(extra)} are not defined for {do!r}"
    if err is not None:
        assert err in ERROR_CLASSES, f"step {step['name']!r}: unknown error class {err!r}"
    return expect, err


@contextlib.contextmanager
def step_context(step: Dict[str, Any]) -> Iterator[None]:
    """Fail naming the step, whatever went wrong in it."""
    try:
        yield
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"step {step['name']!r} ({step['do']}) failed: {type(e).__name__}: {e}", pytrace=True)


def expect_error(step: Dict[str, Any], err: str, fn: Any) -> None:
    try:
        fn()
    except ERROR_CLASSES[err]:
        return
    raise AssertionError(f"succeeded; want the error {err!r}")


def run_result(r: airlock.CommandResult) -> Dict[str, Any]:
    return {"exit_code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr, "timed_out": r.timed_out}


def run_args(a: Dict[str, Any]) -> Dict[str, Any]:
    return {"argv": a.get("argv"), "env": a.get("env"), "cwd": a.get("cwd"), "stdin": a.get("stdin"),
            "timeout_s": a.get("timeout_s")}


def test_scenario_is_well_formed() -> None:
    for step in load_steps():
        validate(step)


def test_conformance_sync(client: airlock.Airlock) -> None:
    sub = Substituter(uuid.uuid4().hex[:12])
    current: Optional[airlock.Sandbox] = None

    def target(a: Dict[str, Any]) -> airlock.Sandbox:
        if a.get("id"):
            return client.sandboxes.get(a["id"])
        assert current is not None, "no current sandbox"
        return current

    def do_step(do: str, a: Dict[str, Any]) -> Dict[str, Any]:
        nonlocal current
        if do == "create":
            sb = client.sandboxes.create(template=a.get("template"), metadata=a.get("metadata"), env=a.get("env"))
            current = sb
            sub.sandbox = sb.id
            return {"state": sb.state, "template": sb.template, "metadata": sb.metadata}
        if do == "get":
            return {"state": target(a).refresh().state}
        if do == "list":
            return {"ids": [s.id for s in client.sandboxes.list(metadata=a.get("metadata"))]}
        sb = target(a)
        if do == "run":
            return run_result(sb.commands.run(a.get("cmd"), **run_args(a)))
        if do == "write_file":
            return {"size": sb.files.write(a["path"], a["data"]).size}
        if do == "read_file":
            return {"data": sb.files.read(a["path"]).decode()}
        if do == "list_files":
            return {"names": [e.name for e in sb.files.list(a["path"])]}
        if do == "stat":
            fi = sb.files.stat(a["path"])
            return {"type": fi.type, "size": fi.size, "name": fi.name}
        if do == "mkdir":
            return {"type": sb.files.mkdir(a["path"]).type}
        if do == "move":
            return {"name": sb.files.move(a["from"], a["to"]).name}
        if do == "remove":
            sb.files.remove(a["path"], recursive=bool(a.get("recursive")))
            return {}
        getattr(sb, do)()  # pause, resume, suspend, wake, delete: waits for the operation
        return {"state": client.sandboxes.get(sb.id).state}

    try:
        for step in load_steps():
            expect, err = validate(step)
            a = sub(step.get("args") or {})
            with step_context(step):
                if err is not None:
                    expect_error(step, err, lambda: do_step(step["do"], a))
                    continue
                check(step, sub(expect), do_step(step["do"], a))
    finally:
        if current is not None:
            try:
                current.delete()
            except airlock.NotFound:
                pass


async def test_conformance_async(airlock_env: Tuple[str, str]) -> None:
    url, key = airlock_env
    sub = Substituter(uuid.uuid4().hex[:12])
    current: Optional[airlock.AsyncSandbox] = None
    async with airlock.AsyncAirlock(url=url, api_key=key) as client:

        async def target(a: Dict[str, Any]) -> airlock.AsyncSandbox:
            if a.get("id"):
                return await client.sandboxes.get(a["id"])
            assert current is not None, "no current sandbox"
            return current

        async def do_step(do: str, a: Dict[str, Any]) -> Dict[str, Any]:
            nonlocal current
            if do == "create":
                sb = await client.sandboxes.create(template=a.get("template"), metadata=a.get("metadata"),
                                                   env=a.get("env"))
                current = sb
                sub.sandbox = sb.id
                return {"state": sb.state, "template": sb.template, "metadata": sb.metadata}
            if do == "get":
                return {"state": (await (await target(a)).refresh()).state}
            if do == "list":
                return {"ids": [s.id async for s in client.sandboxes.list(metadata=a.get("metadata"))]}
            sb = await target(a)
            if do == "run":
                return run_result(await sb.commands.run(a.get("cmd"), **run_args(a)))
            if do == "write_file":
                return {"size": (await sb.files.write(a["path"], a["data"])).size}
            if do == "read_file":
                return {"data": (await sb.files.read(a["path"])).decode()}
            if do == "list_files":
                return {"names": [e.name for e in await sb.files.list(a["path"])]}
            if do == "stat":
                fi = await sb.files.stat(a["path"])
                return {"type": fi.type, "size": fi.size, "name": fi.name}
            if do == "mkdir":
                return {"type": (await sb.files.mkdir(a["path"])).type}
            if do == "move":
                return {"name": (await sb.files.move(a["from"], a["to"])).name}
            if do == "remove":
                await sb.files.remove(a["path"], recursive=bool(a.get("recursive")))
                return {}
            await getattr(sb, do)()
            return {"state": (await client.sandboxes.get(sb.id)).state}

        try:
            for step in load_steps():
                expect, err = validate(step)
                a = sub(step.get("args") or {})
                with step_context(step):
                    if err is not None:
                        try:
                            await do_step(step["do"], a)
                        except ERROR_CLASSES[err]:
                            continue
                        raise AssertionError(f"succeeded; want the error {err!r}")
                    check(step, sub(expect), await do_step(step["do"], a))
        finally:
            if current is not None:
                try:
                    await current.delete()
                except airlock.NotFound:
                    pass
