"""The synchronous client: :class:`Airlock`."""

from __future__ import annotations

import codecs
import hashlib
import io
import json
import os
import time
from typing import (IO, Any, Generator, cast, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union)

import httpx
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect as ws_connect

from . import _api
from ._api import AttachState, Request
from ._errors import AirlockError, NotFound, OperationFailed, Unauthorized, Unavailable, error_from_response
from ._models import (Build, BuildEvent, Checkpoint, CommandResult, Event, FileInfo, NetworkLog,
                      OperationInfo, OutputEvent, SandboxBase, Template)

__all__ = ["Airlock", "Sandbox", "Operation", "CommandHandle", "SandboxPage"]

Data = Union[bytes, bytearray, str, IO[bytes]]
OutputCallback = Callable[[str], Any]
_CHUNK = 256 << 10
_SESSION_TTL = 50 * 60  # files tokens last an hour; renew well before


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code // 100 != 2:
        body = resp.read()
        raise error_from_response(resp.status_code, body, resp.headers)


def _iter_file(f: IO[bytes]) -> Iterator[bytes]:
    while True:
        chunk = f.read(_CHUNK)
        if not chunk:
            return
        yield chunk.encode() if isinstance(chunk, str) else chunk


def _body(data: Data) -> Tuple[Any, Dict[str, str]]:
    """httpx content for bytes, text or a file object (streamed), and a
    Content-Length header when the size is known."""
    if isinstance(data, str):
        data = data.encode()
    if isinstance(data, (bytes, bytearray)):
        return bytes(data), {}
    hdr: Dict[str, str] = {}
    try:
        st = os.fstat(data.fileno())
        import stat as _stat
        if _stat.S_ISREG(st.st_mode):
            hdr["Content-Length"] = str(st.st_size - data.tell())
    except (AttributeError, OSError, io.UnsupportedOperation):
        pass
    return _iter_file(data), hdr


class _Transport:
    """The control-plane HTTP client: auth, typed errors."""

    def __init__(self, url: str, api_key: str, timeout: float, http: Optional[httpx.Client]) -> None:
        self.url = url
        self.api_key = api_key
        self.http = http or httpx.Client(timeout=httpx.Timeout(timeout, connect=10.0))
        self.owns_http = http is None

    def headers(self, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        h = {"Accept": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        h.update(extra or {})
        return h

    def send(self, req: Request, *, content: Any = None, files: Any = None, stream: bool = False,
             timeout: Any = httpx.USE_CLIENT_DEFAULT) -> httpx.Response:
        try:
            r = self.http.build_request(req.method, self.url + req.path, params=req.params or None,
                                        json=req.json if content is None and files is None else None,
                                        content=content, files=files, headers=self.headers(req.headers),
                                        timeout=timeout)
            resp = self.http.send(r, stream=stream)
        except httpx.TransportError as e:
            raise Unavailable(f"{req.method} {req.path}: {e}") from e
        if resp.status_code // 100 != 2:
            try:
                _raise_for(resp)
            finally:
                resp.close()
        return resp

    def json(self, req: Request, **kw: Any) -> Any:
        resp = self.send(req, **kw)
        if not resp.content:
            return None
        return resp.json()


class Operation:
    """An asynchronous operation; :meth:`wait` follows it to its end."""

    def __init__(self, client: "Airlock", info: Dict[str, Any]) -> None:
        self._client = client
        self.info = OperationInfo.from_json(info)

    id = property(lambda self: self.info.id)
    kind = property(lambda self: self.info.kind)
    state = property(lambda self: self.info.state)
    target = property(lambda self: self.info.target)
    reason = property(lambda self: self.info.reason)
    sandbox_id = property(lambda self: self.info.sandbox_id)
    done = property(lambda self: self.info.done)

    def refresh(self) -> "Operation":
        """Read the operation again."""
        self.info = OperationInfo.from_json(self._client._t.json(_api.get_operation(self.id)))
        return self

    def wait(self, timeout: Optional[float] = None) -> "Operation":
        """Long-poll until the operation is done; raises :class:`OperationFailed`
        if it failed or was cancelled, :class:`TimeoutError` after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.info.done:
            try:
                d = self._client._t.json(_api.get_operation(self.id, "30s"), timeout=httpx.Timeout(75.0, connect=10.0))
                self.info = OperationInfo.from_json(d)
            except AirlockError as e:
                if e.status in (429, 503):
                    time.sleep(max(getattr(e, "retry_after", None) or 1.0, 1.0))
                else:
                    raise
            if deadline is not None and not self.info.done and time.monotonic() > deadline:
                raise TimeoutError(f"operation {self.id} still {self.state} after {timeout} s")
        if self.info.state != "succeeded":
            raise OperationFailed(self.info)
        return self

    def __repr__(self) -> str:
        return f"Operation(id={self.id!r}, kind={self.kind!r}, state={self.state!r})"


class SandboxPage:
    """One page of :meth:`Sandboxes.list_page`; ``next_cursor`` is None on the last."""

    def __init__(self, sandboxes: List["Sandbox"], next_cursor: Optional[str]) -> None:
        self.sandboxes = sandboxes
        self.next_cursor = next_cursor

    def __iter__(self) -> Iterator["Sandbox"]:
        return iter(self.sandboxes)

    def __len__(self) -> int:
        return len(self.sandboxes)


class Sandbox(SandboxBase):
    """A sandbox. Use it as a context manager to delete it on exit."""

    #: The operation that made the sandbox (create, fork, import), when known.
    operation: Optional["Operation"] = None

    def __init__(self, client: "Airlock", data: Dict[str, Any]) -> None:
        self._client = client
        self._update(data)
        self.commands = Commands(self)
        self.files = Files(self)
        self.network = Network(self)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.delete()
        except NotFound:
            pass

    def refresh(self) -> "Sandbox":
        """Read the sandbox's record again (``state`` etc. are updated)."""
        self._update(self._client._t.json(_api.get_sandbox(self.id)))
        return self

    def _lifecycle(self, verb: str, wait: bool) -> Operation:
        op = Operation(self._client, self._client._t.json(_api.lifecycle(self.id, verb))["operation"])
        if wait:
            op.wait()
            try:
                self.refresh()
            except NotFound:
                self.state = "deleted"
        return op

    def pause(self, wait: bool = True) -> Operation:
        """Stop every process, keeping memory resident (``running`` → ``paused``)."""
        return self._lifecycle("pause", wait)

    def resume(self, wait: bool = True) -> Operation:
        """Continue a paused sandbox."""
        return self._lifecycle("resume", wait)

    def suspend(self, wait: bool = True) -> Operation:
        """Write memory and files to the snapshot store and release the runtime."""
        return self._lifecycle("suspend", wait)

    def wake(self, wait: bool = True) -> Operation:
        """Restore a suspended (or resume a paused) sandbox."""
        return self._lifecycle("wake", wait)

    def delete(self, wait: bool = True) -> Operation:
        """Delete the sandbox (and its checkpoints)."""
        return self._lifecycle("delete", wait)

    def checkpoint(self, name: str, wait: bool = True) -> Operation:
        """Take a named checkpoint (feature gate ``snapshots``)."""
        op = Operation(self._client, self._client._t.json(_api.create_checkpoint(self.id, name))["operation"])
        return op.wait() if wait else op

    def checkpoints(self) -> List[Checkpoint]:
        """The completed checkpoints, oldest first."""
        d = self._client._t.json(_api.list_checkpoints(self.id))
        return [Checkpoint.from_json(c) for c in d.get("checkpoints") or []]

    def rollback(self, checkpoint: str, wait: bool = True) -> Operation:
        """Return memory, processes and files to a checkpoint."""
        op = Operation(self._client, self._client._t.json(_api.rollback(self.id, checkpoint))["operation"])
        if wait:
            op.wait()
            self.refresh()
        return op

    def export_checkpoint(self, name: str, dest: IO[bytes]) -> int:
        """Stream a checkpoint's portable archive into ``dest``; returns the bytes written.

        A failure in the middle raises; keep the archive only if this returns."""
        resp = self._client._t.send(_api.export_checkpoint(self.id, name), stream=True,
                                    timeout=httpx.Timeout(None, connect=10.0))
        n = 0
        try:
            for chunk in resp.iter_bytes(_CHUNK):
                dest.write(chunk)
                n += len(chunk)
        except httpx.HTTPError as e:
            raise Unavailable(f"export {self.id}/{name} cut short after {n} bytes: {e}") from e
        finally:
            resp.close()
        return n


class Sandboxes:
    """``client.sandboxes``: create, list, get, fork and import sandboxes."""

    def __init__(self, client: "Airlock") -> None:
        self._client = client

    def create(self, template: Optional[str] = None, *, metadata: Optional[Mapping[str, str]] = None,
               env: Optional[Mapping[str, str]] = None, resources: Optional[Mapping[str, int]] = None,
               timeout_s: Optional[int] = None, idle_suspend_after_s: Optional[int] = None,
               auto_wake: Optional[bool] = None, public_traffic: Optional[bool] = None,
               runtime: Optional[str] = None, network: Optional[Mapping[str, Any]] = None,
               idempotency_key: Optional[str] = None, wait: bool = True) -> Sandbox:
        """Create a sandbox; with ``wait`` (the default) return once it runs.

        ``resources`` takes ``vcpus``, ``memory_mib``, ``disk_mib``."""
        req = _api.create_sandbox(template=template, metadata=metadata, env=env, resources=resources,
                                  timeout_s=timeout_s, idle_suspend_after_s=idle_suspend_after_s,
                                  auto_wake=auto_wake, public_traffic=public_traffic, runtime=runtime,
                                  network=network, idempotency_key=idempotency_key)
        return self._finish(self._client._t.json(req), wait)

    def _finish(self, d: Dict[str, Any], wait: bool) -> Sandbox:
        """The sandbox of a create/fork/import answer, waited for if asked."""
        sb = Sandbox(self._client, d["sandbox"])
        op = sb.operation = Operation(self._client, d["operation"])
        if wait:
            op.wait()
            sb.refresh()
        return sb

    def get(self, sandbox_id: str) -> Sandbox:
        """The sandbox with this id (a deleted one is returned with state ``deleted``)."""
        return Sandbox(self._client, self._client._t.json(_api.get_sandbox(sandbox_id)))

    def list_page(self, *, state: Union[str, Sequence[str], None] = None,
                  metadata: Optional[Mapping[str, str]] = None, limit: Optional[int] = None,
                  cursor: Optional[str] = None) -> SandboxPage:
        """One page of sandboxes; pass its ``next_cursor`` as ``cursor`` for the next."""
        d = self._client._t.json(_api.list_sandboxes(state=state, metadata=metadata, limit=limit, cursor=cursor))
        return SandboxPage([Sandbox(self._client, s) for s in d.get("sandboxes") or []], d.get("next_cursor") or None)

    def list(self, *, state: Union[str, Sequence[str], None] = None,
             metadata: Optional[Mapping[str, str]] = None, limit: Optional[int] = None) -> Generator[Sandbox, None, None]:
        """Every sandbox matching the filters, fetching pages of ``limit`` as needed."""
        cursor: Optional[str] = None
        while True:
            page = self.list_page(state=state, metadata=metadata, limit=limit, cursor=cursor)
            yield from page.sandboxes
            if not page.next_cursor or page.next_cursor == cursor:
                return
            cursor = page.next_cursor

    def fork(self, sandbox_id: str, checkpoint: str, count: int = 1, *,
             metadata: Optional[Mapping[str, str]] = None, env: Optional[Mapping[str, str]] = None,
             timeout_s: Optional[int] = None, idle_suspend_after_s: Optional[int] = None,
             auto_wake: Optional[bool] = None, idempotency_key: Optional[str] = None,
             wait: bool = True) -> List[Sandbox]:
        """Start ``count`` sandboxes from a checkpoint of ``sandbox_id``."""
        d = self._client._t.json(_api.fork_sandbox(sandbox_id, checkpoint, count, metadata=metadata, env=env,
                                                   timeout_s=timeout_s, idle_suspend_after_s=idle_suspend_after_s,
                                                   auto_wake=auto_wake, idempotency_key=idempotency_key))
        forks = d.get("forks") or [{"sandbox": d["sandbox"], "operation": d["operation"]}]
        return [self._finish(f, wait) for f in forks]

    def import_checkpoint(self, archive: IO[bytes], *, metadata: Optional[Mapping[str, str]] = None,
                          env: Optional[Mapping[str, str]] = None, timeout_s: Optional[int] = None,
                          idle_suspend_after_s: Optional[int] = None, auto_wake: Optional[bool] = None,
                          idempotency_key: Optional[str] = None, wait: bool = True) -> Sandbox:
        """Create a sandbox from an exported archive (streamed as multipart)."""
        meta = _api.import_request_part(metadata=metadata, env=env, timeout_s=timeout_s,
                                        idle_suspend_after_s=idle_suspend_after_s, auto_wake=auto_wake)
        req = Request("POST", "/v1/sandboxes", headers={"Idempotency-Key": idempotency_key} if idempotency_key else {})
        files = [("request", (None, meta, "application/json")),
                 ("archive", ("archive.tar", archive, "application/x-tar"))]
        resp = self._client._t.send(req, files=files, timeout=httpx.Timeout(None, connect=10.0))
        return self._finish(resp.json(), wait)


# --- commands ---------------------------------------------------------------

def _ws_error(e: BaseException) -> AirlockError:
    if isinstance(e, InvalidStatus):
        r = e.response
        return error_from_response(r.status_code, bytes(r.body or b""), r.headers)
    if isinstance(e, AirlockError):
        return e
    return Unavailable(f"attach: {e}")


def _ws_open(url: str, token: str) -> ClientConnection:
    kw: Dict[str, Any] = dict(additional_headers={"Authorization": f"Bearer {token}"},
                              max_size=_api.MAX_FRAME_PAYLOAD + 1024, open_timeout=30,
                              ping_interval=20, ping_timeout=60)
    try:
        # websockets >= 17 wants legacy=True to return the connection directly
        return ws_connect(url, legacy=True, **kw)  # type: ignore[no-any-return,unused-ignore]
    except TypeError:
        return cast(ClientConnection, ws_connect(url, **kw))


class CommandHandle:
    """A command started with :meth:`Commands.start`.

    Iterate it for :class:`OutputEvent` chunks until the command exits;
    :meth:`wait` returns the :class:`CommandResult`. A dropped attachment
    (or close code 1013 while the sandbox is suspended) is re-attached from
    the output offset reached, so nothing is lost or repeated. ``id``,
    ``token`` and ``offset`` are what :meth:`Commands.connect` needs to
    re-attach later."""

    def __init__(self, *, id: str, attach_url: str, token: str, offset: int = 0,
                 on_stdout: Optional[OutputCallback] = None, on_stderr: Optional[OutputCallback] = None,
                 pending_stdin: Optional[bytes] = None, close_stdin: bool = False) -> None:
        self.id = id
        self.attach_url = attach_url
        self.token = token
        self._state = AttachState(offset)
        self._on = {"stdout": on_stdout, "stderr": on_stderr}
        self._dec = {"stdout": codecs.getincrementaldecoder("utf-8")("replace"),
                     "stderr": codecs.getincrementaldecoder("utf-8")("replace")}
        self._ws: Optional[ClientConnection] = None
        self._pending_stdin = pending_stdin
        self._close_stdin = close_stdin
        self._failures = 0
        self._try_again_until = 0.0

    @property
    def offset(self) -> int:
        """The combined stdout+stderr offset received so far."""
        return self._state.offset

    @property
    def result(self) -> Optional[CommandResult]:
        """The result once the command exited, else None."""
        return self._state.result

    @property
    def process(self) -> Optional[Dict[str, Any]]:
        """The process info of the last ``started`` frame (pid, argv, …)."""
        return self._state.process

    def _attach(self) -> ClientConnection:
        while True:
            try:
                ws = _ws_open(_api.with_offset(self.attach_url, self._state.offset), self.token)
            except Exception as e:  # noqa: BLE001 - classified below
                err = _ws_error(e)
                if (self._try_again_until and time.monotonic() < self._try_again_until
                        and _api.transient_while_suspending(err)):
                    time.sleep(0.5)
                    continue
                if not _api.retryable(err) or self._failures >= _api.ATTACH_RETRIES:
                    raise err from e
                self._failures += 1
                time.sleep(0.2 * self._failures)
                continue
            self._ws = ws
            if self._pending_stdin is not None:
                for f in _api.stdin_frames(self._pending_stdin):
                    ws.send(f)
                self._pending_stdin = None
            if self._close_stdin:
                ws.send(_api.frame(_api.FRAME_STDIN_CLOSE))
                self._close_stdin = False
            return ws

    def _conn(self) -> ClientConnection:
        return self._ws if self._ws is not None else self._attach()

    def __iter__(self) -> Iterator[OutputEvent]:
        return self.events()

    def events(self) -> Generator[OutputEvent, None, None]:
        """Output chunks until the command exits (callbacks are called too)."""
        while self._state.result is None:
            ws = self._conn()
            progressed = False
            try:
                while self._state.result is None:
                    ev = self._state.feed(ws.recv())
                    if ev is not None:
                        progressed = True
                        cb = self._on[ev.stream]
                        if cb is not None:
                            text = self._dec[ev.stream].decode(ev.data)
                            if text:
                                cb(text)
                        yield ev
            except (ConnectionClosed, OSError, TimeoutError) as e:
                self._drop()
                if _api.close_code(e) == _api.CLOSE_TRY_AGAIN:  # the sandbox is being suspended
                    self._try_again_until = time.monotonic() + _api.SUSPEND_REATTACH_S
                if progressed:
                    self._failures = 0
                if self._failures >= _api.ATTACH_RETRIES:
                    raise Unavailable(f"command {self.id}: stream lost after {self._failures} re-attaches: {e}") from e
                self._failures += 1
                time.sleep(0.1 * self._failures)
                continue
            except BaseException:
                self._drop()
                raise
        self.detach()

    def wait(self) -> CommandResult:
        """Follow the output to the end and return the result."""
        for _ in self.events():
            pass
        assert self._state.result is not None
        return self._state.result

    def send_stdin(self, data: Union[bytes, str]) -> None:
        """Send bytes (or text, as UTF-8) to the command's stdin (needs ``stdin=True`` or ``pty``)."""
        ws = self._conn()
        for f in _api.stdin_frames(data):
            ws.send(f)

    def close_stdin(self) -> None:
        """End the command's stdin after what was sent."""
        self._conn().send(_api.frame(_api.FRAME_STDIN_CLOSE))

    def signal(self, sig: Union[str, int] = "TERM") -> None:
        """Send a signal (``"TERM"``, ``"KILL"``, ``"INT"``, … or a number) to the command."""
        self._conn().send(_api.signal_frame(sig))

    def kill(self) -> None:
        """Send ``KILL``."""
        self.signal("KILL")

    def resize(self, cols: int, rows: int) -> None:
        """Change the size of a ``pty`` command's terminal."""
        self._conn().send(_api.resize_frame(cols, rows))

    def _drop(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                ws.close()
            except Exception:  # noqa: BLE001
                pass

    def detach(self) -> None:
        """Close the attachment; the command keeps running."""
        self._drop()

    def __enter__(self) -> "CommandHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.detach()


class Commands:
    """``sandbox.commands``: run commands in the sandbox."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def start(self, cmd: Optional[str] = None, *, argv: Optional[Sequence[str]] = None,
              env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None, user: Optional[str] = None,
              stdin: Union[bytes, str, bool, None] = None, timeout_s: Optional[float] = None,
              pty: Optional[Tuple[int, int]] = None, on_stdout: Optional[OutputCallback] = None,
              on_stderr: Optional[OutputCallback] = None) -> CommandHandle:
        """Start a command (``cmd`` runs as ``bash -lc``; or ``argv``) and attach to it.

        ``stdin``: bytes/text to send (then stdin is closed), or ``True`` to
        send it yourself with :meth:`CommandHandle.send_stdin`. ``pty``:
        ``(cols, rows)`` to run on a pseudo-terminal."""
        data = stdin if isinstance(stdin, (bytes, str)) else None
        req = _api.create_command(self._sb.id, cmd, argv=argv, env=env, cwd=cwd, user=user,
                                  stdin=bool(stdin) or data is not None, timeout_s=timeout_s, pty=pty)
        d = self._sb._client._t.json(req)
        h = CommandHandle(id=d["id"], attach_url=d["attach_url"], token=d["token"], on_stdout=on_stdout,
                          on_stderr=on_stderr, pending_stdin=data.encode() if isinstance(data, str) else data,
                          close_stdin=data is not None)
        h._attach()  # the first attach starts the process
        return h

    def run(self, cmd: Optional[str] = None, *, argv: Optional[Sequence[str]] = None,
            env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None, user: Optional[str] = None,
            stdin: Union[bytes, str, None] = None, timeout_s: Optional[float] = None,
            on_stdout: Optional[OutputCallback] = None, on_stderr: Optional[OutputCallback] = None) -> CommandResult:
        """Run a command to completion and return its exit and output.

        A non-zero exit is not an error: check ``result.exit_code``."""
        return self.start(cmd, argv=argv, env=env, cwd=cwd, user=user, stdin=stdin, timeout_s=timeout_s,
                          on_stdout=on_stdout, on_stderr=on_stderr).wait()

    def connect(self, command_id: str, token: str, *, offset: int = 0, attach_url: Optional[str] = None,
                on_stdout: Optional[OutputCallback] = None, on_stderr: Optional[OutputCallback] = None) -> CommandHandle:
        """Re-attach to a running (or finished) command from ``offset``.

        ``token`` is the command's token (``handle.token``); without
        ``attach_url`` it is derived from the sandbox's data-plane URL."""
        if attach_url is None:
            attach_url = _api.attach_url_for(self._sb.files._session()[0], command_id)
        h = CommandHandle(id=command_id, attach_url=attach_url, token=token, offset=offset,
                          on_stdout=on_stdout, on_stderr=on_stderr)
        h._attach()
        return h

    def list(self) -> List[Dict[str, Any]]:
        """The sandbox's processes, running and finished (every page)."""
        out: List[Dict[str, Any]] = []
        cursor: Optional[str] = None
        while True:
            d = self._sb._client._t.json(_api.list_commands(self._sb.id, cursor=cursor))
            out.extend(d.get("commands") or [])
            cursor = d.get("next_cursor") or None
            if not cursor:
                return out


# --- files --------------------------------------------------------------------

class Files:
    """``sandbox.files``: the sandbox's filesystem, over the worker's data plane."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox
        self._url: Optional[str] = None
        self._token = ""
        self._at = 0.0

    def _session(self, renew: bool = False) -> Tuple[str, str]:
        if renew or self._url is None or time.monotonic() - self._at > _SESSION_TTL:
            d = self._sb._client._t.json(_api.files_session(self._sb.id))
            self._url, self._token, self._at = _api.files_base(d["url"], self._sb.id), d["token"], time.monotonic()
        return self._url, self._token

    def _send(self, method: str, op: str, params: Optional[_api.Params] = None, *, json_body: Any = None,
              content: Any = None, headers: Optional[Dict[str, str]] = None, stream: bool = False,
              retry: bool = True) -> httpx.Response:
        url, token = self._session()
        http = self._sb._client._t.http
        hdr = {"Authorization": f"Bearer {token}", **(headers or {})}
        try:
            r = http.build_request(method, url + op, params=params or None, json=json_body, content=content, headers=hdr,
                                   timeout=httpx.Timeout(None, connect=10.0) if stream or content is not None else httpx.USE_CLIENT_DEFAULT)
            resp = http.send(r, stream=stream)
        except httpx.TransportError as e:
            raise Unavailable(f"data plane {method} {op}: {e}") from e
        if resp.status_code // 100 != 2:
            try:
                _raise_for(resp)
            except Unauthorized:
                if retry and not hasattr(content, "__next__"):
                    self._session(renew=True)
                    return self._send(method, op, params, json_body=json_body, content=content,
                                      headers=headers, stream=stream, retry=False)
                raise
            finally:
                resp.close()
        return resp

    def write(self, path: str, data: Data, *, mode: Optional[str] = None, owner: Optional[str] = None) -> FileInfo:
        """Write (replace) the file at ``path`` with bytes, text or a file object
        (streamed); parents are created. Returns the written file's info."""
        params = _api.file_params(path, mode=mode, owner=owner)
        content, hdr = _body(data)
        hdr["Content-Type"] = "application/octet-stream"
        return FileInfo.from_json(self._send("PUT", "/content", params, content=content, headers=hdr).json())

    def read(self, path: str) -> bytes:
        """The whole content of the file at ``path``."""
        return self._send("GET", "/content", [("path", path)]).content

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The file's content decoded as text."""
        return self.read(path).decode(encoding)

    def read_stream(self, path: str, chunk_size: int = _CHUNK) -> Generator[bytes, None, None]:
        """The file's content in chunks, streamed (close the iterator to stop early)."""
        resp = self._send("GET", "/content", [("path", path)], stream=True)
        try:
            yield from resp.iter_bytes(chunk_size)
        finally:
            resp.close()

    def read_to(self, path: str, dest: IO[bytes]) -> int:
        """Stream the file into ``dest``; returns the bytes copied."""
        n = 0
        for chunk in self.read_stream(path):
            dest.write(chunk)
            n += len(chunk)
        return n

    def stat(self, path: str) -> FileInfo:
        """Describe ``path`` (a final symlink is not followed)."""
        return FileInfo.from_json(self._send("GET", "/stat", [("path", path)]).json())

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        try:
            self.stat(path)
            return True
        except NotFound:
            return False

    def list_page(self, path: str, *, limit: Optional[int] = None,
                  cursor: Optional[str] = None) -> Tuple[List[FileInfo], Optional[str]]:
        """One page of a directory's entries (sorted by name) and the next cursor."""
        params = _api.file_params(path, limit=limit, cursor=cursor)
        d = self._send("GET", "/list", params).json()
        return [FileInfo.from_json(e) for e in d.get("entries") or []], d.get("next_cursor") or None

    def list(self, path: str) -> List[FileInfo]:
        """Every entry of the directory at ``path``, sorted by name."""
        out: List[FileInfo] = []
        cursor: Optional[str] = None
        while True:
            entries, nxt = self.list_page(path, cursor=cursor)
            out.extend(entries)
            if not nxt or nxt == cursor:
                return out
            cursor = nxt

    def mkdir(self, path: str, *, mode: Optional[str] = None, owner: Optional[str] = None) -> FileInfo:
        """Make a directory and its parents."""
        body = _api.drop_none({"path": path, "mode": mode, "owner": owner})
        return FileInfo.from_json(self._send("POST", "/mkdir", json_body=body).json())

    def move(self, src: str, dst: str) -> FileInfo:
        """Move (rename) ``src`` to ``dst``; returns the entry at ``dst``."""
        return FileInfo.from_json(self._send("POST", "/move", json_body={"from": src, "to": dst}).json())

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove ``path``; a non-empty directory needs ``recursive=True``."""
        params = _api.file_params(path, recursive=recursive)
        self._send("DELETE", "", params).close()

    def upload_dir(self, local: Union[str, "os.PathLike[str]"], remote: str) -> int:
        """Copy a local directory tree to ``remote``; returns the number of files."""
        n = 0
        for _kind, dst, src in _api.upload_plan(os.fspath(local), remote):
            if src is None:
                self.mkdir(dst)
                continue
            with open(src, "rb") as fh:
                self.write(dst, fh)
            n += 1
        return n

    def download_dir(self, remote: str, local: Union[str, "os.PathLike[str]"]) -> int:
        """Copy the directory tree at ``remote`` into ``local``; returns the number of files."""
        n = 0
        local = os.fspath(local)
        os.makedirs(local, exist_ok=True)
        for e in self.list(remote):
            dst = os.path.join(local, e.name)
            if e.type == "dir":
                n += self.download_dir(e.path or f"{remote.rstrip('/')}/{e.name}", dst)
            elif e.type == "file":
                with open(dst, "wb") as fh:
                    self.read_to(e.path or f"{remote.rstrip('/')}/{e.name}", fh)
                n += 1
        return n


# --- network ------------------------------------------------------------------

class Network:
    """``sandbox.network``: the sandbox's egress policy and network log."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def get(self) -> Optional[Dict[str, Any]]:
        """``{"profile": …, "policy": {…}}`` (None for sandboxes from before policies)."""
        return cast(Optional[Dict[str, Any]], self._sb._client._t.json(Request("GET", f"/v1/sandboxes/{_api.esc(self._sb.id)}/network")))

    def set(self, *, profile: Optional[str] = None, policy: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """Replace the policy with a named profile or an inline policy (docs/network.md)."""
        return cast(Dict[str, Any], self._sb._client._t.json(_api.network_set(self._sb.id, profile, policy)))

    def log(self, after: int = 0, limit: Optional[int] = None) -> NetworkLog:
        """Entries of the network log after ``after`` (pass ``log.next`` to read on)."""
        return NetworkLog.from_json(self._sb._client._t.json(_api.network_log(self._sb.id, after, limit)))


# --- templates and builds -----------------------------------------------------

class Builds:
    """``client.templates.builds``: template builds (docs/templates.md)."""

    def __init__(self, client: "Airlock") -> None:
        self._client = client

    def has_file(self, hash: str) -> bool:
        """Whether the org has uploaded the COPY input with this sha256."""
        try:
            self._client._t.send(Request("HEAD", f"/v1/templates/files/{_api.esc(hash)}")).close()
            return True
        except NotFound:
            return False

    def upload_file(self, data: bytes) -> str:
        """Upload a COPY input (a tar, optionally gzip'ed); returns its sha256 hash."""
        h = hashlib.sha256(data).hexdigest()
        if not self.has_file(h):
            self._client._t.send(Request("PUT", f"/v1/templates/files/{h}"), content=data).close()
        return h

    def start(self, spec: Mapping[str, Any]) -> Build:
        """Start a build of a ``BuildSpec`` (``name``, ``tag``, ``from``, ``steps``, …)."""
        return Build.from_json(self._client._t.json(Request("POST", "/v1/templates/builds", json=dict(spec))))

    def get(self, build_id: str) -> Build:
        """A build by id, with its state and step reports."""
        return Build.from_json(self._client._t.json(Request("GET", f"/v1/templates/builds/{_api.esc(build_id)}")))

    def list(self, limit: Optional[int] = None) -> List[Build]:
        """The org's builds, newest first."""
        params: _api.Params = [("limit", str(limit))] if limit else []
        d = self._client._t.json(Request("GET", "/v1/templates/builds", params=params))
        return [Build.from_json(b) for b in d.get("builds") or []]

    def events(self, build_id: str, after: int = 0) -> Generator[BuildEvent, None, None]:
        """Progress events until the build is ``ready`` or ``failed`` (long polls)."""
        while True:
            d = self._client._t.json(_api.build_events(build_id, after), timeout=httpx.Timeout(75.0, connect=10.0))
            evs = d.get("events") or []
            for e in evs:
                ev = BuildEvent.from_json(e)
                after = max(after, ev.seq)
                yield ev
            if not evs and d.get("state") in ("ready", "failed"):
                return

    def wait(self, build_id: str, on_event: Optional[Callable[[BuildEvent], Any]] = None) -> Build:
        """Follow a build to its end; raises :class:`AirlockError` if it failed."""
        for ev in self.events(build_id):
            if on_event is not None:
                on_event(ev)
        b = self.get(build_id)
        if b.state != "ready":
            raise AirlockError(f"build {build_id} {b.state}: {b.error}", code="build_failed")
        return b


class Templates:
    """``client.templates``: list, get, delete, import and build templates."""

    def __init__(self, client: "Airlock") -> None:
        self._client = client
        self.builds = Builds(client)

    def list(self) -> List[Template]:
        """Every template of the installation."""
        d = self._client._t.json(Request("GET", "/v1/templates"))
        return [Template.from_json(t) for t in d.get("templates") or []]

    def get(self, ref: str) -> Template:
        """A template by ``name``, ``name:tag`` or ``sha256:…``."""
        return Template.from_json(self._client._t.json(Request("GET", f"/v1/templates/{_api.esc(ref)}")))

    def delete(self, ref: str) -> Template:
        """Delete a template (operators only; 409 while anything uses it)."""
        return Template.from_json(self._client._t.json(Request("DELETE", f"/v1/templates/{_api.esc(ref)}")))

    def import_archive(self, name: str, archive: Data, *, ref: Optional[str] = None) -> Template:
        """Import an OCI (or ``docker save``) tar archive as ``name[:tag]``, streamed."""
        content, hdr = _body(archive)
        req = _api.template_import(name, ref)
        req.headers.update(hdr)
        d = self._client._t.send(req, content=content, timeout=httpx.Timeout(None, connect=10.0)).json()
        return Template.from_json(d)

    def build(self, spec: Mapping[str, Any], on_event: Optional[Callable[[BuildEvent], Any]] = None) -> Build:
        """Start a build and follow it to the end (``on_event`` sees each progress event)."""
        return self.builds.wait(self.builds.start(spec).id, on_event)


class Orgs:
    """``client.orgs``: read and change orgs (admin keys)."""

    def __init__(self, client: "Airlock") -> None:
        self._client = client

    def get(self, org_id: str) -> Dict[str, Any]:
        """An org with its features, quotas and usage."""
        return cast(Dict[str, Any], self._client._t.json(Request("GET", f"/v1/orgs/{_api.esc(org_id)}")))

    def update(self, org_id: str, *, features: Optional[Sequence[str]] = None,
               idle_suspend_after_s: Optional[int] = None, quotas: Optional[Mapping[str, int]] = None,
               network: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """Change an org's settings; ``features`` replaces its feature gates."""
        req = _api.update_org(org_id, features=features, idle_suspend_after_s=idle_suspend_after_s,
                              quotas=quotas, network=network)
        return cast(Dict[str, Any], self._client._t.json(req))


class Airlock:
    """The synchronous Airlock client.

    ``url`` and ``api_key`` default to the environment's ``AIRLOCK_URL`` and
    ``AIRLOCK_API_KEY``. Close it (or use ``with``) to release connections."""

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, *, timeout: float = 60.0,
                 http_client: Optional[httpx.Client] = None) -> None:
        url, api_key = _api.resolve_config(url, api_key)
        self._t = _Transport(url, api_key, timeout, http_client)
        self.url = url
        self.sandboxes = Sandboxes(self)
        self.templates = Templates(self)
        self.orgs = Orgs(self)

    def __enter__(self) -> "Airlock":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Release the HTTP connections (unless an http_client was passed in)."""
        if self._t.owns_http:
            self._t.http.close()

    def health(self) -> Dict[str, Any]:
        """``GET /healthz``."""
        return cast(Dict[str, Any], self._t.json(Request("GET", "/healthz")))

    def operation(self, op_id: str) -> Operation:
        """An operation by id."""
        return Operation(self, self._t.json(_api.get_operation(op_id)))

    def events(self, sandbox_id: Optional[str] = None, after: Optional[int] = None) -> Generator[Event, None, None]:
        """The org's (or one sandbox's) events, as they happen, from ``after``
        (default: the oldest kept). A dropped stream is re-opened with
        ``Last-Event-ID``, so no event is skipped or repeated. Break out of
        the loop (or close the iterator) to stop."""
        last = after or 0
        backoff = 0.1
        path = _api.events_path(sandbox_id)
        while True:
            got = False
            hdr = {"Accept": "text/event-stream"}
            if last:
                hdr["Last-Event-ID"] = str(last)
            try:
                resp = self._t.send(Request("GET", path, headers=hdr), stream=True,
                                    timeout=httpx.Timeout(60.0, connect=10.0))
            except Unavailable as e:
                if e.status:  # an answer (503): an API error ends the stream, as in the Go client
                    raise
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            try:
                parser = _api.SSEParser()
                for line in resp.iter_lines():
                    data = parser.line(line)
                    if data is None:
                        continue
                    ev = Event.from_json(json.loads(data))
                    last, got = ev.seq, True
                    yield ev
            except httpx.HTTPError:
                pass
            finally:
                resp.close()
            if got:
                backoff = 0.1
            time.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
