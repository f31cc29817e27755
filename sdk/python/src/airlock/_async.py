"""The asynchronous client: :class:`AsyncAirlock`, mirroring :class:`~airlock.Airlock`.

Request building and decoding are shared with the sync client (``_api``,
``_models``); only the I/O differs."""

from __future__ import annotations

import asyncio
import codecs
import hashlib
import json
import os
import time
from typing import (IO, Any, AsyncGenerator, cast, AsyncIterator, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union)

import httpx
from websockets.asyncio.client import ClientConnection, connect as ws_connect
from websockets.exceptions import ConnectionClosed

from . import _api
from ._api import AttachState, Request
from ._errors import AirlockError, NotFound, OperationFailed, Unauthorized, Unavailable, error_from_response
from ._models import (Build, BuildEvent, Checkpoint, CommandResult, Event, FileInfo, NetworkLog,
                      OperationInfo, OutputEvent, SandboxBase, Template)
from ._sync import _CHUNK, _SESSION_TTL, Data, OutputCallback, _body, _ws_error

__all__ = ["AsyncAirlock", "AsyncSandbox", "AsyncOperation", "AsyncCommandHandle", "AsyncSandboxPage"]


async def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code // 100 != 2:
        body = await resp.aread()
        raise error_from_response(resp.status_code, body, resp.headers)


def _aiter(content: Any) -> Any:
    """httpx's AsyncClient wants async iterables for streamed bodies."""
    if content is None or isinstance(content, bytes):
        return content

    async def gen() -> AsyncIterator[bytes]:
        for chunk in content:
            yield chunk
    return gen()


class _AsyncTransport:
    def __init__(self, url: str, api_key: str, timeout: float, http: Optional[httpx.AsyncClient]) -> None:
        self.url = url
        self.api_key = api_key
        self.http = http or httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0))
        self.owns_http = http is None

    def headers(self, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        h = {"Accept": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        h.update(extra or {})
        return h

    async def send(self, req: Request, *, content: Any = None, files: Any = None, stream: bool = False,
                   timeout: Any = httpx.USE_CLIENT_DEFAULT) -> httpx.Response:
        try:
            r = self.http.build_request(req.method, self.url + req.path, params=req.params or None,
                                        json=req.json if content is None and files is None else None,
                                        content=_aiter(content), files=files, headers=self.headers(req.headers),
                                        timeout=timeout)
            resp = await self.http.send(r, stream=stream)
        except httpx.TransportError as e:
            raise Unavailable(f"{req.method} {req.path}: {e}") from e
        if resp.status_code // 100 != 2:
            try:
                await _raise_for(resp)
            finally:
                await resp.aclose()
        return resp

    async def json(self, req: Request, **kw: Any) -> Any:
        resp = await self.send(req, **kw)
        if not resp.content:
            return None
        return resp.json()


class AsyncOperation:
    """An asynchronous operation; ``await op.wait()`` follows it to its end."""

    def __init__(self, client: "AsyncAirlock", info: Dict[str, Any]) -> None:
        self._client = client
        self.info = OperationInfo.from_json(info)

    id = property(lambda self: self.info.id)
    kind = property(lambda self: self.info.kind)
    state = property(lambda self: self.info.state)
    target = property(lambda self: self.info.target)
    reason = property(lambda self: self.info.reason)
    sandbox_id = property(lambda self: self.info.sandbox_id)
    done = property(lambda self: self.info.done)

    async def refresh(self) -> "AsyncOperation":
        """Read the operation again."""
        self.info = OperationInfo.from_json(await self._client._t.json(_api.get_operation(self.id)))
        return self

    async def wait(self, timeout: Optional[float] = None) -> "AsyncOperation":
        """Long-poll until done; raises :class:`OperationFailed` if it failed or was cancelled."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.info.done:
            try:
                d = await self._client._t.json(_api.get_operation(self.id, "30s"),
                                               timeout=httpx.Timeout(75.0, connect=10.0))
                self.info = OperationInfo.from_json(d)
            except AirlockError as e:
                if e.status in (429, 503):
                    await asyncio.sleep(max(getattr(e, "retry_after", None) or 1.0, 1.0))
                else:
                    raise
            if deadline is not None and not self.info.done and time.monotonic() > deadline:
                raise TimeoutError(f"operation {self.id} still {self.state} after {timeout} s")
        if self.info.state != "succeeded":
            raise OperationFailed(self.info)
        return self

    def __repr__(self) -> str:
        return f"AsyncOperation(id={self.id!r}, kind={self.kind!r}, state={self.state!r})"


class AsyncSandboxPage:
    def __init__(self, sandboxes: List["AsyncSandbox"], next_cursor: Optional[str]) -> None:
        self.sandboxes = sandboxes
        self.next_cursor = next_cursor

    def __len__(self) -> int:
        return len(self.sandboxes)


class AsyncSandbox(SandboxBase):
    """A sandbox (async). ``async with`` deletes it on exit."""

    #: The operation that made the sandbox (create, fork, import), when known.
    operation: Optional["AsyncOperation"] = None

    def __init__(self, client: "AsyncAirlock", data: Dict[str, Any]) -> None:
        self._client = client
        self._update(data)
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)
        self.network = AsyncNetwork(self)

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.delete()
        except NotFound:
            pass

    async def refresh(self) -> "AsyncSandbox":
        """Read the sandbox's record again (``state`` etc. are updated)."""
        self._update(await self._client._t.json(_api.get_sandbox(self.id)))
        return self

    async def _lifecycle(self, verb: str, wait: bool) -> AsyncOperation:
        op = AsyncOperation(self._client, (await self._client._t.json(_api.lifecycle(self.id, verb)))["operation"])
        if wait:
            await op.wait()
            try:
                await self.refresh()
            except NotFound:
                self.state = "deleted"
        return op

    async def pause(self, wait: bool = True) -> AsyncOperation:
        """Stop every process, keeping memory resident (``running`` → ``paused``)."""
        return await self._lifecycle("pause", wait)

    async def resume(self, wait: bool = True) -> AsyncOperation:
        """Continue a paused sandbox."""
        return await self._lifecycle("resume", wait)

    async def suspend(self, wait: bool = True) -> AsyncOperation:
        """Write memory and files to the snapshot store and release the runtime."""
        return await self._lifecycle("suspend", wait)

    async def wake(self, wait: bool = True) -> AsyncOperation:
        """Restore a suspended (or resume a paused) sandbox."""
        return await self._lifecycle("wake", wait)

    async def delete(self, wait: bool = True) -> AsyncOperation:
        """Delete the sandbox (and its checkpoints)."""
        return await self._lifecycle("delete", wait)

    async def checkpoint(self, name: str, wait: bool = True) -> AsyncOperation:
        """Take a named checkpoint (feature gate ``snapshots``)."""
        op = AsyncOperation(self._client, (await self._client._t.json(_api.create_checkpoint(self.id, name)))["operation"])
        return await op.wait() if wait else op

    async def checkpoints(self) -> List[Checkpoint]:
        """The completed checkpoints, oldest first."""
        d = await self._client._t.json(_api.list_checkpoints(self.id))
        return [Checkpoint.from_json(c) for c in d.get("checkpoints") or []]

    async def rollback(self, checkpoint: str, wait: bool = True) -> AsyncOperation:
        """Return memory, processes and files to a checkpoint."""
        op = AsyncOperation(self._client, (await self._client._t.json(_api.rollback(self.id, checkpoint)))["operation"])
        if wait:
            await op.wait()
            await self.refresh()
        return op

    async def export_checkpoint(self, name: str, dest: IO[bytes]) -> int:
        """Stream a checkpoint's portable archive into ``dest``; returns the bytes written.

        A failure in the middle raises; keep the archive only if this returns."""
        resp = await self._client._t.send(_api.export_checkpoint(self.id, name), stream=True,
                                          timeout=httpx.Timeout(None, connect=10.0))
        n = 0
        try:
            async for chunk in resp.aiter_bytes(_CHUNK):
                dest.write(chunk)
                n += len(chunk)
        except httpx.HTTPError as e:
            raise Unavailable(f"export {self.id}/{name} cut short after {n} bytes: {e}") from e
        finally:
            await resp.aclose()
        return n


class AsyncSandboxes:
    """``client.sandboxes`` of :class:`AsyncAirlock`."""

    def __init__(self, client: "AsyncAirlock") -> None:
        self._client = client

    async def _finish(self, d: Dict[str, Any], wait: bool) -> AsyncSandbox:
        sb = AsyncSandbox(self._client, d["sandbox"])
        op = sb.operation = AsyncOperation(self._client, d["operation"])
        if wait:
            await op.wait()
            await sb.refresh()
        return sb

    async def create(self, template: Optional[str] = None, *, metadata: Optional[Mapping[str, str]] = None,
                     env: Optional[Mapping[str, str]] = None, resources: Optional[Mapping[str, int]] = None,
                     timeout_s: Optional[int] = None, idle_suspend_after_s: Optional[int] = None,
                     auto_wake: Optional[bool] = None, public_traffic: Optional[bool] = None,
                     runtime: Optional[str] = None, network: Optional[Mapping[str, Any]] = None,
                     idempotency_key: Optional[str] = None, wait: bool = True) -> AsyncSandbox:
        """Create a sandbox; with ``wait`` (the default) return once it runs.

        ``resources`` takes ``vcpus``, ``memory_mib``, ``disk_mib``."""
        req = _api.create_sandbox(template=template, metadata=metadata, env=env, resources=resources,
                                  timeout_s=timeout_s, idle_suspend_after_s=idle_suspend_after_s,
                                  auto_wake=auto_wake, public_traffic=public_traffic, runtime=runtime,
                                  network=network, idempotency_key=idempotency_key)
        return await self._finish(await self._client._t.json(req), wait)

    async def get(self, sandbox_id: str) -> AsyncSandbox:
        """The sandbox with this id (a deleted one is returned with state ``deleted``)."""
        return AsyncSandbox(self._client, await self._client._t.json(_api.get_sandbox(sandbox_id)))

    async def list_page(self, *, state: Union[str, Sequence[str], None] = None,
                        metadata: Optional[Mapping[str, str]] = None, limit: Optional[int] = None,
                        cursor: Optional[str] = None) -> AsyncSandboxPage:
        """One page of sandboxes; pass its ``next_cursor`` as ``cursor`` for the next."""
        d = await self._client._t.json(_api.list_sandboxes(state=state, metadata=metadata, limit=limit, cursor=cursor))
        return AsyncSandboxPage([AsyncSandbox(self._client, s) for s in d.get("sandboxes") or []],
                                d.get("next_cursor") or None)

    async def list(self, *, state: Union[str, Sequence[str], None] = None,
                   metadata: Optional[Mapping[str, str]] = None,
                   limit: Optional[int] = None) -> AsyncGenerator[AsyncSandbox, None]:
        """Every matching sandbox (``async for``), page after page."""
        cursor: Optional[str] = None
        while True:
            page = await self.list_page(state=state, metadata=metadata, limit=limit, cursor=cursor)
            for sb in page.sandboxes:
                yield sb
            if not page.next_cursor or page.next_cursor == cursor:
                return
            cursor = page.next_cursor

    async def fork(self, sandbox_id: str, checkpoint: str, count: int = 1, *,
                   metadata: Optional[Mapping[str, str]] = None, env: Optional[Mapping[str, str]] = None,
                   timeout_s: Optional[int] = None, idle_suspend_after_s: Optional[int] = None,
                   auto_wake: Optional[bool] = None, idempotency_key: Optional[str] = None,
                   wait: bool = True) -> List[AsyncSandbox]:
        """Start ``count`` sandboxes from a checkpoint of ``sandbox_id``."""
        d = await self._client._t.json(_api.fork_sandbox(sandbox_id, checkpoint, count, metadata=metadata, env=env,
                                                         timeout_s=timeout_s, idle_suspend_after_s=idle_suspend_after_s,
                                                         auto_wake=auto_wake, idempotency_key=idempotency_key))
        forks = d.get("forks") or [{"sandbox": d["sandbox"], "operation": d["operation"]}]
        return [await self._finish(f, wait) for f in forks]

    async def import_checkpoint(self, archive: IO[bytes], *, metadata: Optional[Mapping[str, str]] = None,
                                env: Optional[Mapping[str, str]] = None, timeout_s: Optional[int] = None,
                                idle_suspend_after_s: Optional[int] = None, auto_wake: Optional[bool] = None,
                                idempotency_key: Optional[str] = None, wait: bool = True) -> AsyncSandbox:
        """Create a sandbox from an exported archive (streamed as multipart)."""
        meta = _api.import_request_part(metadata=metadata, env=env, timeout_s=timeout_s,
                                        idle_suspend_after_s=idle_suspend_after_s, auto_wake=auto_wake)
        req = Request("POST", "/v1/sandboxes", headers={"Idempotency-Key": idempotency_key} if idempotency_key else {})
        files = [("request", (None, meta, "application/json")),
                 ("archive", ("archive.tar", archive, "application/x-tar"))]
        resp = await self._client._t.send(req, files=files, timeout=httpx.Timeout(None, connect=10.0))
        return await self._finish(resp.json(), wait)


class AsyncCommandHandle:
    """A command started with :meth:`AsyncCommands.start`; ``async for ev in h``
    yields output, ``await h.wait()`` the result. Re-attaches like
    :class:`~airlock.CommandHandle`."""

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

    async def _attach(self) -> ClientConnection:
        while True:
            try:
                ws = await ws_connect(_api.with_offset(self.attach_url, self._state.offset),
                                      additional_headers={"Authorization": f"Bearer {self.token}"},
                                      max_size=_api.MAX_FRAME_PAYLOAD + 1024, open_timeout=30,
                                      ping_interval=20, ping_timeout=60)
            except Exception as e:  # noqa: BLE001
                err = _ws_error(e)
                if (self._try_again_until and time.monotonic() < self._try_again_until
                        and _api.transient_while_suspending(err)):
                    await asyncio.sleep(0.5)
                    continue
                if not _api.retryable(err) or self._failures >= _api.ATTACH_RETRIES:
                    raise err from e
                self._failures += 1
                await asyncio.sleep(0.2 * self._failures)
                continue
            self._ws = ws
            if self._pending_stdin is not None:
                for f in _api.stdin_frames(self._pending_stdin):
                    await ws.send(f)
                self._pending_stdin = None
            if self._close_stdin:
                await ws.send(_api.frame(_api.FRAME_STDIN_CLOSE))
                self._close_stdin = False
            return ws

    async def _conn(self) -> ClientConnection:
        return self._ws if self._ws is not None else await self._attach()

    def __aiter__(self) -> AsyncIterator[OutputEvent]:
        return self.events()

    async def events(self) -> AsyncGenerator[OutputEvent, None]:
        """Output chunks until the command exits (callbacks are called too)."""
        while self._state.result is None:
            ws = await self._conn()
            progressed = False
            try:
                while self._state.result is None:
                    ev = self._state.feed(await ws.recv())
                    if ev is not None:
                        progressed = True
                        cb = self._on[ev.stream]
                        if cb is not None:
                            text = self._dec[ev.stream].decode(ev.data)
                            if text:
                                cb(text)
                        yield ev
            except (ConnectionClosed, OSError, asyncio.TimeoutError) as e:
                await self._drop()
                if _api.close_code(e) == _api.CLOSE_TRY_AGAIN:  # the sandbox is being suspended
                    self._try_again_until = time.monotonic() + _api.SUSPEND_REATTACH_S
                if progressed:
                    self._failures = 0
                if self._failures >= _api.ATTACH_RETRIES:
                    raise Unavailable(f"command {self.id}: stream lost after {self._failures} re-attaches: {e}") from e
                self._failures += 1
                await asyncio.sleep(0.1 * self._failures)
                continue
            except BaseException:
                await self._drop()
                raise
        await self.detach()

    async def wait(self) -> CommandResult:
        """Follow the output to the end and return the result."""
        async for _ in self.events():
            pass
        assert self._state.result is not None
        return self._state.result

    async def send_stdin(self, data: Union[bytes, str]) -> None:
        """Send bytes (or text, as UTF-8) to the command's stdin (needs ``stdin=True`` or ``pty``)."""
        ws = await self._conn()
        for f in _api.stdin_frames(data):
            await ws.send(f)

    async def close_stdin(self) -> None:
        """End the command's stdin after what was sent."""
        await (await self._conn()).send(_api.frame(_api.FRAME_STDIN_CLOSE))

    async def signal(self, sig: Union[str, int] = "TERM") -> None:
        """Send a signal (``"TERM"``, ``"KILL"``, ``"INT"``, … or a number) to the command."""
        await (await self._conn()).send(_api.signal_frame(sig))

    async def kill(self) -> None:
        """Send ``KILL``."""
        await self.signal("KILL")

    async def resize(self, cols: int, rows: int) -> None:
        """Change the size of a ``pty`` command's terminal."""
        await (await self._conn()).send(_api.resize_frame(cols, rows))

    async def _drop(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                await ws.close()
            except Exception:  # noqa: BLE001
                pass

    async def detach(self) -> None:
        """Close the attachment; the command keeps running."""
        await self._drop()

    async def __aenter__(self) -> "AsyncCommandHandle":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.detach()


class AsyncCommands:
    """``sandbox.commands`` (async)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def start(self, cmd: Optional[str] = None, *, argv: Optional[Sequence[str]] = None,
                    env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None, user: Optional[str] = None,
                    stdin: Union[bytes, str, bool, None] = None, timeout_s: Optional[float] = None,
                    pty: Optional[Tuple[int, int]] = None, on_stdout: Optional[OutputCallback] = None,
                    on_stderr: Optional[OutputCallback] = None) -> AsyncCommandHandle:
        """Start a command (``cmd`` runs as ``bash -lc``; or ``argv``) and attach to it.

        ``stdin``: bytes/text to send (then stdin is closed), or ``True`` to
        send it yourself with :meth:`CommandHandle.send_stdin`. ``pty``:
        ``(cols, rows)`` to run on a pseudo-terminal."""
        data = stdin if isinstance(stdin, (bytes, str)) else None
        req = _api.create_command(self._sb.id, cmd, argv=argv, env=env, cwd=cwd, user=user,
                                  stdin=bool(stdin) or data is not None, timeout_s=timeout_s, pty=pty)
        d = await self._sb._client._t.json(req)
        h = AsyncCommandHandle(id=d["id"], attach_url=d["attach_url"], token=d["token"], on_stdout=on_stdout,
                               on_stderr=on_stderr, pending_stdin=data.encode() if isinstance(data, str) else data,
                               close_stdin=data is not None)
        await h._attach()
        return h

    async def run(self, cmd: Optional[str] = None, *, argv: Optional[Sequence[str]] = None,
                  env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None, user: Optional[str] = None,
                  stdin: Union[bytes, str, None] = None, timeout_s: Optional[float] = None,
                  on_stdout: Optional[OutputCallback] = None,
                  on_stderr: Optional[OutputCallback] = None) -> CommandResult:
        """Run a command to completion and return its exit and output.

        A non-zero exit is not an error: check ``result.exit_code``."""
        h = await self.start(cmd, argv=argv, env=env, cwd=cwd, user=user, stdin=stdin, timeout_s=timeout_s,
                             on_stdout=on_stdout, on_stderr=on_stderr)
        return await h.wait()

    async def connect(self, command_id: str, token: str, *, offset: int = 0, attach_url: Optional[str] = None,
                      on_stdout: Optional[OutputCallback] = None,
                      on_stderr: Optional[OutputCallback] = None) -> AsyncCommandHandle:
        """Re-attach to a running (or finished) command from ``offset``.

        ``token`` is the command's token (``handle.token``); without
        ``attach_url`` it is derived from the sandbox's data-plane URL."""
        if attach_url is None:
            attach_url = _api.attach_url_for((await self._sb.files._session())[0], command_id)
        h = AsyncCommandHandle(id=command_id, attach_url=attach_url, token=token, offset=offset,
                               on_stdout=on_stdout, on_stderr=on_stderr)
        await h._attach()
        return h

    async def list(self) -> List[Dict[str, Any]]:
        """The sandbox's processes, running and finished (every page)."""
        out: List[Dict[str, Any]] = []
        cursor: Optional[str] = None
        while True:
            d = await self._sb._client._t.json(_api.list_commands(self._sb.id, cursor=cursor))
            out.extend(d.get("commands") or [])
            cursor = d.get("next_cursor") or None
            if not cursor:
                return out


class AsyncFiles:
    """``sandbox.files`` (async)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox
        self._url: Optional[str] = None
        self._token = ""
        self._at = 0.0

    async def _session(self, renew: bool = False) -> Tuple[str, str]:
        if renew or self._url is None or time.monotonic() - self._at > _SESSION_TTL:
            d = await self._sb._client._t.json(_api.files_session(self._sb.id))
            self._url, self._token, self._at = _api.files_base(d["url"], self._sb.id), d["token"], time.monotonic()
        return self._url, self._token

    async def _send(self, method: str, op: str, params: Optional[_api.Params] = None, *, json_body: Any = None,
                    content: Any = None, headers: Optional[Dict[str, str]] = None, stream: bool = False,
                    retry: bool = True) -> httpx.Response:
        url, token = await self._session()
        http = self._sb._client._t.http
        hdr = {"Authorization": f"Bearer {token}", **(headers or {})}
        try:
            r = http.build_request(method, url + op, params=params or None, json=json_body, content=_aiter(content),
                                   headers=hdr,
                                   timeout=httpx.Timeout(None, connect=10.0) if stream or content is not None else httpx.USE_CLIENT_DEFAULT)
            resp = await http.send(r, stream=stream)
        except httpx.TransportError as e:
            raise Unavailable(f"data plane {method} {op}: {e}") from e
        if resp.status_code // 100 != 2:
            try:
                await _raise_for(resp)
            except Unauthorized:
                if retry and (content is None or isinstance(content, bytes)):
                    await self._session(renew=True)
                    return await self._send(method, op, params, json_body=json_body, content=content,
                                            headers=headers, stream=stream, retry=False)
                raise
            finally:
                await resp.aclose()
        return resp

    async def write(self, path: str, data: Data, *, mode: Optional[str] = None, owner: Optional[str] = None) -> FileInfo:
        """Write (replace) the file at ``path`` with bytes, text or a file object
        (streamed); parents are created. Returns the written file's info."""
        params = _api.file_params(path, mode=mode, owner=owner)
        content, hdr = _body(data)
        hdr["Content-Type"] = "application/octet-stream"
        return FileInfo.from_json((await self._send("PUT", "/content", params, content=content, headers=hdr)).json())

    async def read(self, path: str) -> bytes:
        """The whole content of the file at ``path``."""
        return (await self._send("GET", "/content", [("path", path)])).content

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The file's content decoded as text."""
        return (await self.read(path)).decode(encoding)

    async def read_stream(self, path: str, chunk_size: int = _CHUNK) -> AsyncGenerator[bytes, None]:
        """The file's content in chunks, streamed (close the iterator to stop early)."""
        resp = await self._send("GET", "/content", [("path", path)], stream=True)
        try:
            async for chunk in resp.aiter_bytes(chunk_size):
                yield chunk
        finally:
            await resp.aclose()

    async def read_to(self, path: str, dest: IO[bytes]) -> int:
        """Stream the file into ``dest``; returns the bytes copied."""
        n = 0
        async for chunk in self.read_stream(path):
            dest.write(chunk)
            n += len(chunk)
        return n

    async def stat(self, path: str) -> FileInfo:
        """Describe ``path`` (a final symlink is not followed)."""
        return FileInfo.from_json((await self._send("GET", "/stat", [("path", path)])).json())

    async def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        try:
            await self.stat(path)
            return True
        except NotFound:
            return False

    async def list_page(self, path: str, *, limit: Optional[int] = None,
                        cursor: Optional[str] = None) -> Tuple[List[FileInfo], Optional[str]]:
        """One page of a directory's entries (sorted by name) and the next cursor."""
        params = _api.file_params(path, limit=limit, cursor=cursor)
        d = (await self._send("GET", "/list", params)).json()
        return [FileInfo.from_json(e) for e in d.get("entries") or []], d.get("next_cursor") or None

    async def list(self, path: str) -> List[FileInfo]:
        """Every entry of the directory at ``path``, sorted by name."""
        out: List[FileInfo] = []
        cursor: Optional[str] = None
        while True:
            entries, nxt = await self.list_page(path, cursor=cursor)
            out.extend(entries)
            if not nxt or nxt == cursor:
                return out
            cursor = nxt

    async def mkdir(self, path: str, *, mode: Optional[str] = None, owner: Optional[str] = None) -> FileInfo:
        """Make a directory and its parents."""
        body = _api.drop_none({"path": path, "mode": mode, "owner": owner})
        return FileInfo.from_json((await self._send("POST", "/mkdir", json_body=body)).json())

    async def move(self, src: str, dst: str) -> FileInfo:
        """Move (rename) ``src`` to ``dst``; returns the entry at ``dst``."""
        return FileInfo.from_json((await self._send("POST", "/move", json_body={"from": src, "to": dst})).json())

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove ``path``; a non-empty directory needs ``recursive=True``."""
        params = _api.file_params(path, recursive=recursive)
        await (await self._send("DELETE", "", params)).aclose()

    async def upload_dir(self, local: Union[str, "os.PathLike[str]"], remote: str) -> int:
        """Copy a local directory tree to ``remote``; returns the number of files."""
        n = 0
        for _kind, dst, src in _api.upload_plan(os.fspath(local), remote):
            if src is None:
                await self.mkdir(dst)
                continue
            with open(src, "rb") as fh:
                await self.write(dst, fh)
            n += 1
        return n

    async def download_dir(self, remote: str, local: Union[str, "os.PathLike[str]"]) -> int:
        """Copy the directory tree at ``remote`` into ``local``; returns the number of files."""
        n = 0
        local = os.fspath(local)
        os.makedirs(local, exist_ok=True)
        for e in await self.list(remote):
            dst = os.path.join(local, e.name)
            src = e.path or f"{remote.rstrip('/')}/{e.name}"
            if e.type == "dir":
                n += await self.download_dir(src, dst)
            elif e.type == "file":
                with open(dst, "wb") as fh:
                    await self.read_to(src, fh)
                n += 1
        return n


class AsyncNetwork:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def get(self) -> Optional[Dict[str, Any]]:
        """``{"profile": …, "policy": {…}}`` (None for sandboxes from before policies)."""
        return cast(Optional[Dict[str, Any]], await self._sb._client._t.json(Request("GET", f"/v1/sandboxes/{_api.esc(self._sb.id)}/network")))

    async def set(self, *, profile: Optional[str] = None, policy: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """Replace the policy with a named profile or an inline policy (docs/network.md)."""
        return cast(Dict[str, Any], await self._sb._client._t.json(_api.network_set(self._sb.id, profile, policy)))

    async def log(self, after: int = 0, limit: Optional[int] = None) -> NetworkLog:
        """Entries of the network log after ``after`` (pass ``log.next`` to read on)."""
        return NetworkLog.from_json(await self._sb._client._t.json(_api.network_log(self._sb.id, after, limit)))


class AsyncBuilds:
    def __init__(self, client: "AsyncAirlock") -> None:
        self._client = client

    async def has_file(self, hash: str) -> bool:
        """Whether the org has uploaded the COPY input with this sha256."""
        try:
            await (await self._client._t.send(Request("HEAD", f"/v1/templates/files/{_api.esc(hash)}"))).aclose()
            return True
        except NotFound:
            return False

    async def upload_file(self, data: bytes) -> str:
        """Upload a COPY input (a tar, optionally gzip'ed); returns its sha256 hash."""
        h = hashlib.sha256(data).hexdigest()
        if not await self.has_file(h):
            await (await self._client._t.send(Request("PUT", f"/v1/templates/files/{h}"), content=data)).aclose()
        return h

    async def start(self, spec: Mapping[str, Any]) -> Build:
        """Start a build of a ``BuildSpec`` (``name``, ``tag``, ``from``, ``steps``, …)."""
        return Build.from_json(await self._client._t.json(Request("POST", "/v1/templates/builds", json=dict(spec))))

    async def get(self, build_id: str) -> Build:
        """A build by id, with its state and step reports."""
        return Build.from_json(await self._client._t.json(Request("GET", f"/v1/templates/builds/{_api.esc(build_id)}")))

    async def list(self, limit: Optional[int] = None) -> List[Build]:
        """The org's builds, newest first."""
        params: _api.Params = [("limit", str(limit))] if limit else []
        d = await self._client._t.json(Request("GET", "/v1/templates/builds", params=params))
        return [Build.from_json(b) for b in d.get("builds") or []]

    async def events(self, build_id: str, after: int = 0) -> AsyncGenerator[BuildEvent, None]:
        """Progress events until the build is ``ready`` or ``failed`` (long polls)."""
        while True:
            d = await self._client._t.json(_api.build_events(build_id, after), timeout=httpx.Timeout(75.0, connect=10.0))
            evs = d.get("events") or []
            for e in evs:
                ev = BuildEvent.from_json(e)
                after = max(after, ev.seq)
                yield ev
            if not evs and d.get("state") in ("ready", "failed"):
                return

    async def wait(self, build_id: str, on_event: Optional[Callable[[BuildEvent], Any]] = None) -> Build:
        """Follow a build to its end; raises :class:`AirlockError` if it failed."""
        async for ev in self.events(build_id):
            if on_event is not None:
                on_event(ev)
        b = await self.get(build_id)
        if b.state != "ready":
            raise AirlockError(f"build {build_id} {b.state}: {b.error}", code="build_failed")
        return b


class AsyncTemplates:
    def __init__(self, client: "AsyncAirlock") -> None:
        self._client = client
        self.builds = AsyncBuilds(client)

    async def list(self) -> List[Template]:
        """Every template of the installation."""
        d = await self._client._t.json(Request("GET", "/v1/templates"))
        return [Template.from_json(t) for t in d.get("templates") or []]

    async def get(self, ref: str) -> Template:
        """A template by ``name``, ``name:tag`` or ``sha256:…``."""
        return Template.from_json(await self._client._t.json(Request("GET", f"/v1/templates/{_api.esc(ref)}")))

    async def delete(self, ref: str) -> Template:
        """Delete a template (operators only; 409 while anything uses it)."""
        return Template.from_json(await self._client._t.json(Request("DELETE", f"/v1/templates/{_api.esc(ref)}")))

    async def import_archive(self, name: str, archive: Data, *, ref: Optional[str] = None) -> Template:
        """Import an OCI (or ``docker save``) tar archive as ``name[:tag]``, streamed."""
        content, hdr = _body(archive)
        req = _api.template_import(name, ref)
        req.headers.update(hdr)
        resp = await self._client._t.send(req, content=content, timeout=httpx.Timeout(None, connect=10.0))
        return Template.from_json(resp.json())

    async def build(self, spec: Mapping[str, Any], on_event: Optional[Callable[[BuildEvent], Any]] = None) -> Build:
        """Start a build and follow it to the end (``on_event`` sees each progress event)."""
        return await self.builds.wait((await self.builds.start(spec)).id, on_event)


class AsyncOrgs:
    def __init__(self, client: "AsyncAirlock") -> None:
        self._client = client

    async def get(self, org_id: str) -> Dict[str, Any]:
        """An org with its features, quotas and usage."""
        return cast(Dict[str, Any], await self._client._t.json(Request("GET", f"/v1/orgs/{_api.esc(org_id)}")))

    async def update(self, org_id: str, *, features: Optional[Sequence[str]] = None,
                     idle_suspend_after_s: Optional[int] = None, quotas: Optional[Mapping[str, int]] = None,
                     network: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """Change an org's settings; ``features`` replaces its feature gates."""
        req = _api.update_org(org_id, features=features, idle_suspend_after_s=idle_suspend_after_s,
                              quotas=quotas, network=network)
        return cast(Dict[str, Any], await self._client._t.json(req))


class AsyncAirlock:
    """The asynchronous Airlock client (``async with AsyncAirlock() as c``)."""

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, *, timeout: float = 60.0,
                 http_client: Optional[httpx.AsyncClient] = None) -> None:
        url, api_key = _api.resolve_config(url, api_key)
        self._t = _AsyncTransport(url, api_key, timeout, http_client)
        self.url = url
        self.sandboxes = AsyncSandboxes(self)
        self.templates = AsyncTemplates(self)
        self.orgs = AsyncOrgs(self)

    async def __aenter__(self) -> "AsyncAirlock":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Release the HTTP connections (unless an http_client was passed in)."""
        if self._t.owns_http:
            await self._t.http.aclose()

    async def health(self) -> Dict[str, Any]:
        """``GET /healthz``."""
        return cast(Dict[str, Any], await self._t.json(Request("GET", "/healthz")))

    async def operation(self, op_id: str) -> AsyncOperation:
        """An operation by id."""
        return AsyncOperation(self, await self._t.json(_api.get_operation(op_id)))

    async def events(self, sandbox_id: Optional[str] = None, after: Optional[int] = None) -> AsyncGenerator[Event, None]:
        """The org's (or one sandbox's) events (``async for``), resuming with Last-Event-ID."""
        last = after or 0
        backoff = 0.1
        path = _api.events_path(sandbox_id)
        while True:
            got = False
            hdr = {"Accept": "text/event-stream"}
            if last:
                hdr["Last-Event-ID"] = str(last)
            try:
                resp = await self._t.send(Request("GET", path, headers=hdr), stream=True,
                                          timeout=httpx.Timeout(60.0, connect=10.0))
            except Unavailable as e:
                if e.status:
                    raise
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            try:
                parser = _api.SSEParser()
                async for line in resp.aiter_lines():
                    data = parser.line(line)
                    if data is None:
                        continue
                    ev = Event.from_json(json.loads(data))
                    last, got = ev.seq, True
                    yield ev
            except httpx.HTTPError:
                pass
            finally:
                await resp.aclose()
            if got:
                backoff = 0.1
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
