"""Plain data records decoded from the API's JSON.

Each record keeps the JSON it was decoded from in ``raw``, so fields this
version of the SDK does not name are still reachable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

__all__ = [
    "OperationInfo",
    "Checkpoint",
    "FileInfo",
    "Template",
    "Build",
    "BuildEvent",
    "Event",
    "CommandResult",
    "OutputEvent",
    "NetworkLog",
    "DONE_STATES",
]

#: Operation states after which an operation changes no more.
DONE_STATES = frozenset({"succeeded", "failed", "cancelled"})


@dataclass
class OperationInfo:
    """The state of an asynchronous operation (create, delete, pause, …)."""

    id: str
    kind: str = ""
    state: str = ""
    target: str = ""
    reason: str = ""
    sandbox_id: str = ""
    created_at: str = ""
    updated_at: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def done(self) -> bool:
        """True once the operation succeeded, failed or was cancelled."""
        return self.state in DONE_STATES

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "OperationInfo":
        return cls(id=d.get("id", ""), kind=d.get("kind", ""), state=d.get("state", ""),
                   target=d.get("target", ""), reason=d.get("reason", ""),
                   sandbox_id=d.get("sandbox_id", ""), created_at=d.get("created_at", ""),
                   updated_at=d.get("updated_at", ""), raw=d)


@dataclass
class Checkpoint:
    """A named checkpoint of a sandbox."""

    name: str
    snapshot_id: str = ""
    bytes: int = 0
    created_at: str = ""

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Checkpoint":
        return cls(name=d.get("name", ""), snapshot_id=d.get("snapshot_id", ""),
                   bytes=int(d.get("bytes") or 0), created_at=d.get("created_at", ""))


@dataclass
class FileInfo:
    """A file or directory inside a sandbox (``type``: ``file``, ``dir``, ``symlink``, ``other``)."""

    path: str
    name: str
    type: str
    size: int = 0
    mode: str = ""
    uid: int = 0
    gid: int = 0
    owner: str = ""
    mod_time: str = ""
    target: str = ""

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "FileInfo":
        return cls(path=d.get("path", ""), name=d.get("name", ""), type=d.get("type", ""),
                   size=int(d.get("size") or 0), mode=d.get("mode", ""), uid=int(d.get("uid") or 0),
                   gid=int(d.get("gid") or 0), owner=d.get("owner", ""),
                   mod_time=d.get("mod_time", ""), target=d.get("target", ""))


@dataclass
class Template:
    """A template: ``name:tag`` pointing at content named by ``digest``."""

    name: str
    tag: str = ""
    digest: str = ""
    size_bytes: int = 0
    created_at: str = ""
    config: Optional[Dict[str, Any]] = None
    workers: List[str] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ref(self) -> str:
        """``name:tag``, or the digest when no name points at it."""
        return f"{self.name}:{self.tag}" if self.name else self.digest

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Template":
        return cls(name=d.get("name", ""), tag=d.get("tag", ""), digest=d.get("digest", ""),
                   size_bytes=int(d.get("size_bytes") or 0), created_at=d.get("created_at", ""),
                   config=d.get("config"), workers=list(d.get("workers") or []), raw=d)


@dataclass
class Build:
    """A template build (``state``: ``building``, ``ready`` or ``failed``)."""

    id: str
    state: str = ""
    spec: Dict[str, Any] = field(default_factory=dict)
    error: str = ""
    digest: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Build":
        return cls(id=d.get("id", ""), state=d.get("state", ""), spec=d.get("spec") or {},
                   error=d.get("error", "") or "", digest=d.get("digest", "") or "", raw=d)


@dataclass
class BuildEvent:
    """One progress event of a build (``type``: ``step``, ``output``, ``info``, ``done``, ``error``)."""

    seq: int
    type: str
    text: str = ""
    stream: str = ""
    step: Optional[Dict[str, Any]] = None
    digest: str = ""
    time: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "BuildEvent":
        return cls(seq=int(d.get("seq") or 0), type=d.get("type", ""), text=d.get("text", "") or "",
                   stream=d.get("stream", "") or "", step=d.get("step"), digest=d.get("digest", "") or "",
                   time=d.get("time", ""), raw=d)


@dataclass
class Event:
    """One event of the SSE streams: ``sandbox.state``, ``operation.state``, ``network.denied``.

    ``data`` is the sandbox, the operation or the denial after the change.
    """

    seq: int
    type: str
    sandbox_id: str = ""
    operation_id: str = ""
    org_id: str = ""
    data: Dict[str, Any] = field(default_factory=dict)
    time: str = ""

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Event":
        return cls(seq=int(d.get("seq") or 0), type=d.get("type", ""), sandbox_id=d.get("sandbox_id", "") or "",
                   operation_id=d.get("operation_id", "") or "", org_id=d.get("org_id", "") or "",
                   data=d.get("data") or {}, time=d.get("time", ""))


@dataclass
class OutputEvent:
    """A chunk of a command's output: ``stream`` is ``"stdout"`` or ``"stderr"``."""

    stream: str
    data: bytes
    offset: int = 0  #: the combined stdout+stderr offset after this chunk

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


@dataclass
class CommandResult:
    """How a command ended, with its collected output.

    ``exit_code`` is -1 when a signal ended it (``signal`` names it);
    ``timed_out`` says its ``timeout_s`` passed; ``error`` is set when the
    program could not be started.
    """

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    signal: str = ""
    timed_out: bool = False
    error: str = ""
    stdout_bytes: bytes = field(default=b"", repr=False)
    stderr_bytes: bytes = field(default=b"", repr=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.signal and not self.timed_out and not self.error

    @classmethod
    def from_exit(cls, payload: bytes, stdout: bytes, stderr: bytes) -> "CommandResult":
        d = json.loads(payload.decode("utf-8") or "{}")
        return cls(exit_code=int(d.get("exit_code", 0)), signal=d.get("signal", "") or "",
                   timed_out=bool(d.get("timed_out", False)), error=d.get("error", "") or "",
                   stdout=stdout.decode("utf-8", "replace"), stderr=stderr.decode("utf-8", "replace"),
                   stdout_bytes=stdout, stderr_bytes=stderr)


@dataclass
class NetworkLog:
    """A page of a sandbox's network log; pass ``next`` as ``after`` to read on."""

    entries: List[Dict[str, Any]]
    next: int = 0
    missed: int = 0
    reset: bool = False
    note: str = ""

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "NetworkLog":
        return cls(entries=list(d.get("entries") or []), next=int(d.get("next") or 0),
                   missed=int(d.get("missed") or 0), reset=bool(d.get("reset", False)),
                   note=d.get("note", "") or "")


class SandboxBase:
    """The fields of a sandbox record, shared by :class:`~airlock.Sandbox` and
    :class:`~airlock.AsyncSandbox`. ``raw`` is the last JSON received."""

    id: str
    state: str
    desired_state: str
    template: str
    template_digest: str
    runtime: str
    reason: str
    metadata: Dict[str, str]
    env: Dict[str, str]
    resources: Dict[str, int]
    timeout_s: int
    idle_suspend_after_s: int
    traffic_token: str
    created_at: str
    raw: Dict[str, Any]

    def _update(self, d: Dict[str, Any]) -> None:
        self.raw = d
        self.id = d.get("id", "")
        self.state = d.get("state", "")
        self.desired_state = d.get("desired_state", "")
        self.template = d.get("template", "")
        self.template_digest = d.get("template_digest", "")
        self.runtime = d.get("runtime", "")
        self.reason = d.get("reason", "") or ""
        self.metadata = dict(d.get("metadata") or {})
        self.env = dict(d.get("env") or {})
        self.resources = dict(d.get("resources") or {})
        self.timeout_s = int(d.get("timeout_s") or 0)
        self.idle_suspend_after_s = int(d.get("idle_suspend_after_s") or 0)
        self.traffic_token = d.get("traffic_token", "") or ""
        self.created_at = d.get("created_at", "")

    @property
    def checkpoint_list(self) -> List[Checkpoint]:
        """The checkpoints listed in the record (as of the last refresh)."""
        return [Checkpoint.from_json(c) for c in self.raw.get("checkpoints") or []]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, state={self.state!r}, template={self.template!r})"
