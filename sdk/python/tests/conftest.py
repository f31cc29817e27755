"""Fixtures: a real Airlock for the whole session.

With AIRLOCK_URL and AIRLOCK_API_KEY both set, the tests use that Airlock.
Otherwise they start ``airlock up`` themselves (as root, with the binary from
AIRLOCK_BIN, default <repo>/bin/airlock) in a temporary data dir, and stop it
at the end."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Iterator, Tuple

import pytest

import airlock

REPO = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=5) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001 - not up yet
        return False


def _tail(path: Path, n: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


@pytest.fixture(scope="session")
def airlock_env() -> Iterator[Tuple[str, str]]:
    """(url, admin key) of the Airlock under test."""
    url, key = os.environ.get("AIRLOCK_URL"), os.environ.get("AIRLOCK_API_KEY")
    if url and key:
        yield url.rstrip("/"), key
        return
    binary = Path(os.environ.get("AIRLOCK_BIN") or REPO / "bin" / "airlock")
    if os.geteuid() != 0:
        pytest.skip("SKIPPED LOUDLY: starting `airlock up` needs root (or set AIRLOCK_URL and AIRLOCK_API_KEY)")
    if not binary.exists():
        pytest.skip(f"SKIPPED LOUDLY: no airlock binary at {binary}: run ./scripts/build.sh or set AIRLOCK_BIN")
    tmp = Path(tempfile.mkdtemp(prefix="airlock-sdk-python-"))
    cache = os.environ.get("AIRLOCK_TEST_CACHE")
    if cache:
        # Each shared directory must exist: a dangling link makes `airlock up`'s mkdir fail.
        for name in ("cache", "bin", "build-cache"):
            os.makedirs(os.path.join(cache, name), exist_ok=True)
            os.symlink(os.path.join(cache, name), tmp / name)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp / "up.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen([str(binary), "up", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp),
                             "--build-templates", "", "--qemu=false"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (_healthy(url) and (tmp / "admin.key").exists()):
            if proc.poll() is not None:
                pytest.fail(f"airlock up exited with {proc.returncode}; the tail of {log_path}:\n{_tail(log_path)}")
            if time.monotonic() > deadline:
                pytest.fail(f"airlock up not healthy after 5 min; the tail of {log_path}:\n{_tail(log_path)}")
            time.sleep(0.5)
        key = (tmp / "admin.key").read_text().strip()
        yield url, key
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        subprocess.run(["umount", "-l", str(tmp / "runsc" / "null-netns")],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if os.environ.get("AIRLOCK_TEST_KEEP_LOG"):
            print(f"\n--- tail of {log_path}\n{_tail(log_path)}")
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def client(airlock_env: Tuple[str, str]) -> Iterator[airlock.Airlock]:
    """A sync client with the admin key."""
    url, key = airlock_env
    c = airlock.Airlock(url=url, api_key=key)
    yield c
    c.close()


@pytest.fixture
def run_id() -> str:
    """A fresh id (lowercase letters and digits) for metadata and names."""
    return uuid.uuid4().hex[:12]


@pytest.fixture
def sandbox(client: airlock.Airlock, run_id: str) -> Iterator[airlock.Sandbox]:
    """A running sandbox of the template base, deleted afterwards."""
    sb = client.sandboxes.create(template="base", metadata={"sdk-test": run_id})
    try:
        yield sb
    finally:
        try:
            sb.delete()
        except airlock.NotFound:
            pass
