"""What the sync and async clients share: request building, answer decoding,
the attach WebSocket's frames and the SSE parser. Nothing here does I/O."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote, urlsplit, urlunsplit, urlencode, parse_qsl

from ._errors import AirlockError, Unavailable
from ._models import CommandResult, OutputEvent

DEFAULT_URL = "http://127.0.0.1:7070"
#: How often a dropped attachment is re-attached without progress (as the Go client).
ATTACH_RETRIES = 5
#: The largest frame payload the data plane takes.
MAX_FRAME_PAYLOAD = 1 << 20

# Frame kinds of the attach WebSocket (docs/api.md, "The attach WebSocket").
FRAME_STDOUT = 1
FRAME_STDERR = 2
FRAME_EXIT = 3
FRAME_STARTED = 4
FRAME_ERROR = 5
FRAME_STDIN = 16
FRAME_STDIN_CLOSE = 17
FRAME_SIGNAL = 18
FRAME_RESIZE = 19

#: WebSocket close code the worker uses while the sandbox is being suspended.
CLOSE_TRY_AGAIN = 1013

Params = List[Tuple[str, Union[str, int, float, bool, None]]]


def esc(s: str) -> str:
    """Escape one path segment."""
    return quote(s, safe="")


@dataclass
class Request:
    """One control-plane request, before a transport sends it."""

    method: str
    path: str
    params: Params = field(default_factory=list)
    json: Any = None
    headers: Dict[str, str] = field(default_factory=dict)


def resolve_config(url: Optional[str], api_key: Optional[str]) -> Tuple[str, str]:
    """The base URL and key: the arguments, else AIRLOCK_URL / AIRLOCK_API_KEY."""
    url = url or os.environ.get("AIRLOCK_URL") or DEFAULT_URL
    api_key = api_key if api_key is not None else os.environ.get("AIRLOCK_API_KEY", "")
    return url.rstrip("/"), api_key


def drop_none(d: Mapping[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


# --- sandboxes -------------------------------------------------------------

def create_sandbox(*, template: Optional[str] = None, metadata: Optional[Mapping[str, str]] = None,
                   env: Optional[Mapping[str, str]] = None, resources: Optional[Mapping[str, int]] = None,
                   timeout_s: Optional[int] = None, idle_suspend_after_s: Optional[int] = None,
                   auto_wake: Optional[bool] = None, public_traffic: Optional[bool] = None,
                   runtime: Optional[str] = None, network: Optional[Mapping[str, Any]] = None,
                   idempotency_key: Optional[str] = None) -> Request:
    body = drop_none({
        "template": template, "runtime": runtime,
        "resources": dict(resources) if resources else None,
        "env": dict(env) if env else None, "metadata": dict(metadata) if metadata else None,
        "timeout_s": timeout_s, "idle_suspend_after_s": idle_suspend_after_s,
        "auto_wake": auto_wake, "public_traffic": public_traffic,
        "network": dict(network) if network else None,
    })
    hdr = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    return Request("POST", "/v1/sandboxes", json=body, headers=hdr)


def fork_sandbox(sandbox_id: str, checkpoint: str, count: int = 1, *,
                 metadata: Optional[Mapping[str, str]] = None, env: Optional[Mapping[str, str]] = None,
                 timeout_s: Optional[int] = None, idle_suspend_after_s: Optional[int] = None,
                 auto_wake: Optional[bool] = None, idempotency_key: Optional[str] = None) -> Request:
    body = drop_none({
        "from_checkpoint": {"sandbox_id": sandbox_id, "checkpoint": checkpoint}, "count": count,
        "env": dict(env) if env else None, "metadata": dict(metadata) if metadata else None,
        "timeout_s": timeout_s, "idle_suspend_after_s": idle_suspend_after_s, "auto_wake": auto_wake,
    })
    hdr = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    return Request("POST", "/v1/sandboxes", json=body, headers=hdr)


def import_request_part(*, metadata: Optional[Mapping[str, str]] = None, env: Optional[Mapping[str, str]] = None,
                        timeout_s: Optional[int] = None, idle_suspend_after_s: Optional[int] = None,
                        auto_wake: Optional[bool] = None) -> bytes:
    """The JSON ``request`` part of a multipart import."""
    return json.dumps(drop_none({
        "import": "archive", "env": dict(env) if env else None,
        "metadata": dict(metadata) if metadata else None, "timeout_s": timeout_s,
        "idle_suspend_after_s": idle_suspend_after_s, "auto_wake": auto_wake,
    })).encode()


def list_sandboxes(*, state: Union[str, Sequence[str], None] = None, metadata: Optional[Mapping[str, str]] = None,
                   limit: Optional[int] = None, cursor: Optional[str] = None) -> Request:
    params: Params = []
    if state:
        params.append(("state", state if isinstance(state, str) else ",".join(state)))
    for k, v in (metadata or {}).items():
        params.append(("metadata", f"{k}={v}"))
    if limit:
        params.append(("limit", str(limit)))
    if cursor:
        params.append(("cursor", cursor))
    return Request("GET", "/v1/sandboxes", params=params)


def get_sandbox(sandbox_id: str) -> Request:
    return Request("GET", f"/v1/sandboxes/{esc(sandbox_id)}")


def lifecycle(sandbox_id: str, verb: str) -> Request:
    if verb == "delete":
        return Request("DELETE", f"/v1/sandboxes/{esc(sandbox_id)}")
    return Request("POST", f"/v1/sandboxes/{esc(sandbox_id)}/{verb}", json={})


def get_operation(op_id: str, wait: Optional[str] = None) -> Request:
    return Request("GET", f"/v1/operations/{esc(op_id)}", params=[("wait", wait)] if wait else [])


def create_checkpoint(sandbox_id: str, name: str) -> Request:
    return Request("POST", f"/v1/sandboxes/{esc(sandbox_id)}/checkpoints", json={"name": name})


def list_checkpoints(sandbox_id: str) -> Request:
    return Request("GET", f"/v1/sandboxes/{esc(sandbox_id)}/checkpoints")


def rollback(sandbox_id: str, checkpoint: str) -> Request:
    return Request("POST", f"/v1/sandboxes/{esc(sandbox_id)}/rollback", json={"checkpoint": checkpoint})


def export_checkpoint(sandbox_id: str, name: str) -> Request:
    return Request("GET", f"/v1/sandboxes/{esc(sandbox_id)}/checkpoints/{esc(name)}/export")


# --- commands and files ----------------------------------------------------

def create_command(sandbox_id: str, cmd: Optional[str] = None, *, argv: Optional[Sequence[str]] = None,
                   env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                   user: Optional[str] = None, stdin: bool = False, timeout_s: Optional[float] = None,
                   pty: Optional[Tuple[int, int]] = None) -> Request:
    if (cmd is None) == (argv is None):
        raise ValueError("pass exactly one of cmd (a shell line) and argv")
    body = drop_none({
        "cmd": cmd, "argv": list(argv) if argv is not None else None,
        "env": dict(env) if env else None, "cwd": cwd, "user": user,
        "stdin": True if stdin else None,
        "timeout_s": int(timeout_s) if timeout_s else None,
        "pty": {"cols": int(pty[0]), "rows": int(pty[1])} if pty else None,
    })
    return Request("POST", f"/v1/sandboxes/{esc(sandbox_id)}/commands", json=body)


def list_commands(sandbox_id: str, limit: Optional[int] = None, cursor: Optional[str] = None) -> Request:
    params: Params = []
    if limit:
        params.append(("limit", str(limit)))
    if cursor:
        params.append(("cursor", cursor))
    return Request("GET", f"/v1/sandboxes/{esc(sandbox_id)}/commands", params=params)


def files_session(sandbox_id: str) -> Request:
    return Request("POST", f"/v1/sandboxes/{esc(sandbox_id)}/files/session", json={})


def files_base(session_url: str, sandbox_id: str) -> str:
    """The data-plane base ``…/v1/sandboxes/{id}/files`` from a files session's url."""
    base = session_url.rstrip("/")
    if base.endswith("/files"):
        base = base[: -len("/files")]
    if "/v1/sandboxes/" not in base:
        base += f"/v1/sandboxes/{esc(sandbox_id)}"
    return base + "/files"


def file_params(path: str, **extra: Any) -> Params:
    """The query of a data-plane files request: ``path`` and the options set."""
    params: Params = [("path", path)]
    for k, v in extra.items():
        if v is True:
            params.append((k, "1"))
        elif v not in (None, False, "", 0):
            params.append((k, str(v)))
    return params


def upload_plan(local: str, remote: str) -> Iterator[Tuple[str, str, Optional[str]]]:
    """What upload_dir does, in order: ``("dir", remote, None)`` to make and
    ``("file", remote, local)`` to copy, for the tree at ``local``."""
    remote = remote.rstrip("/") or "/"
    yield "dir", remote, None
    for root, dirs, files in os.walk(local):
        dirs.sort()
        rel = os.path.relpath(root, local)
        base = remote if rel == "." else remote.rstrip("/") + "/" + rel.replace(os.sep, "/")
        for d in dirs:
            yield "dir", f"{base.rstrip('/')}/{d}", None
        for f in sorted(files):
            yield "file", f"{base.rstrip('/')}/{f}", os.path.join(root, f)


def attach_url_for(files_url: str, command_id: str) -> str:
    """Derive a command's attach URL from the sandbox's files URL (same worker)."""
    base = files_url.rstrip("/")
    if base.endswith("/files"):
        base = base[: -len("/files")]
    u = urlsplit(base + f"/commands/{esc(command_id)}/attach")
    scheme = {"http": "ws", "https": "wss"}.get(u.scheme, u.scheme)
    return urlunsplit((scheme, u.netloc, u.path, u.query, ""))


def with_offset(attach_url: str, offset: int) -> str:
    u = urlsplit(attach_url)
    q = [(k, v) for k, v in parse_qsl(u.query) if k != "offset"] + [("offset", str(offset))]
    return urlunsplit((u.scheme, u.netloc, u.path, urlencode(q), u.fragment))


# --- templates, builds, network, orgs -------------------------------------

def template_import(name: str, ref: Optional[str] = None) -> Request:
    params: Params = [("name", name)]
    if ref:
        params.append(("ref", ref))
    return Request("POST", "/v1/templates", params=params, headers={"Content-Type": "application/x-tar"})


def build_events(build_id: str, after: int, wait: str = "30s") -> Request:
    return Request("GET", f"/v1/templates/builds/{esc(build_id)}/events",
                   params=[("after", str(after)), ("wait", wait)])


def network_set(sandbox_id: str, profile: Optional[str], policy: Optional[Mapping[str, Any]]) -> Request:
    if (profile is None) == (policy is None):
        raise ValueError("pass exactly one of profile and policy")
    body = {"profile": profile} if profile is not None else {"policy": dict(policy or {})}
    return Request("PUT", f"/v1/sandboxes/{esc(sandbox_id)}/network", json=body)


def network_log(sandbox_id: str, after: int = 0, limit: Optional[int] = None) -> Request:
    params: Params = [("after", str(after))] if after else []
    if limit:
        params.append(("limit", str(limit)))
    return Request("GET", f"/v1/sandboxes/{esc(sandbox_id)}/network/log", params=params)


def update_org(org_id: str, *, features: Optional[Sequence[str]] = None,
               idle_suspend_after_s: Optional[int] = None, quotas: Optional[Mapping[str, int]] = None,
               network: Optional[Mapping[str, Any]] = None) -> Request:
    body = drop_none({"features": list(features) if features is not None else None,
                      "idle_suspend_after_s": idle_suspend_after_s,
                      "quotas": dict(quotas) if quotas else None,
                      "network": dict(network) if network else None})
    return Request("PATCH", f"/v1/orgs/{esc(org_id)}", json=body)


def events_path(sandbox_id: Optional[str]) -> str:
    return f"/v1/sandboxes/{esc(sandbox_id)}/events" if sandbox_id else "/v1/events"


# --- the attach WebSocket ---------------------------------------------------

def frame(kind: int, payload: bytes = b"") -> bytes:
    return bytes([kind]) + payload


def stdin_frames(data: Union[bytes, str]) -> Iterable[bytes]:
    """Split stdin into frames of at most MAX_FRAME_PAYLOAD bytes."""
    b = data.encode() if isinstance(data, str) else bytes(data)
    for i in range(0, len(b), MAX_FRAME_PAYLOAD):
        yield frame(FRAME_STDIN, b[i:i + MAX_FRAME_PAYLOAD])


def signal_frame(sig: Union[str, int]) -> bytes:
    return frame(FRAME_SIGNAL, json.dumps({"signal": str(sig)}).encode())


def resize_frame(cols: int, rows: int) -> bytes:
    return frame(FRAME_RESIZE, json.dumps({"cols": int(cols), "rows": int(rows)}).encode())


class StreamLost(Exception):
    """An attachment ended without an exit frame; re-attach from the offset."""


class AttachState:
    """Follows one command across attachments: the offset reached, the output
    collected (if asked) and the exit. Both clients feed it frames."""

    def __init__(self, offset: int = 0, collect: bool = True) -> None:
        self.offset = offset
        self.collect = collect
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.result: Optional[CommandResult] = None
        self.process: Optional[Dict[str, Any]] = None

    def feed(self, msg: Union[bytes, str]) -> Optional[OutputEvent]:
        """Handle one WebSocket message; returns an output event or None.

        Raises :class:`Unavailable` for an error frame (the stream ended)."""
        if isinstance(msg, str) or not msg:
            return None
        kind, payload = msg[0], bytes(msg[1:])
        if kind in (FRAME_STDOUT, FRAME_STDERR):
            self.offset += len(payload)
            stream = "stdout" if kind == FRAME_STDOUT else "stderr"
            if self.collect:
                (self.stdout if kind == FRAME_STDOUT else self.stderr).extend(payload)
            return OutputEvent(stream, payload, self.offset)
        if kind == FRAME_EXIT:
            self.result = CommandResult.from_exit(payload, bytes(self.stdout), bytes(self.stderr))
        elif kind == FRAME_STARTED:
            try:
                self.process = json.loads(payload.decode() or "{}")
            except ValueError:
                self.process = {}
        elif kind == FRAME_ERROR:
            try:
                message = json.loads(payload.decode()).get("message", "")
            except ValueError:
                message = payload.decode("utf-8", "replace")
            raise Unavailable(f"command stream: {message}", code="unavailable")
        return None


#: How long a re-attach after close code 1013 keeps retrying while the
#: sandbox's suspend (and the wake the re-attach asks for) are in progress.
SUSPEND_REATTACH_S = 180.0


def close_code(e: BaseException) -> Optional[int]:
    """The close code the peer sent with a websockets ConnectionClosed, if any."""
    rcvd = getattr(e, "rcvd", None)
    return getattr(rcvd, "code", None)


def transient_while_suspending(err: BaseException) -> bool:
    """A 409 naming an operation in progress: after a 1013 close, the suspend
    is still being written; the re-attach retries until the wake can start."""
    from ._errors import Conflict
    return isinstance(err, Conflict) and ("in progress" in err.message or "wait for it and retry" in err.message)


def retryable(err: BaseException) -> bool:
    """Whether a failed attach is worth re-trying (as the Go client's dpRetryable)."""
    if isinstance(err, AirlockError):
        return isinstance(err, Unavailable) or err.status >= 500 or err.status == 0
    return True


# --- Server-Sent Events -----------------------------------------------------

class SSEParser:
    """Feeds lines of a text/event-stream, returning each event's data."""

    def __init__(self) -> None:
        self._data: List[str] = []

    def line(self, line: str) -> Optional[str]:
        line = line.rstrip("\r\n")
        if line == "":
            if not self._data:
                return None
            data, self._data = "\n".join(self._data), []
            return data
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        return None
