"""The local control channel of a running node: a Unix socket, ``D/node.sock``.

While `pnode start` runs it holds the chain store's lock, so the CLIs
(`pnode status`, `pwallet balance`, `pwallet send`) ask the node instead of
opening the store (specs/network.md, "Control socket"). This module owns the
channel, not the operations: `ControlServer` serves a mapping of op names to
handlers (`node.node.Node.control_ops`), `control_request` / `control_call`
are the client.

- The socket is created mode 0600 (only the node's user may talk to it),
  replaces a stale socket file left by a killed node, and is removed when
  the server stops.
- Framing is `node.net.framing`'s (4-byte big-endian length, then the payload);
  each payload is one UTF-8 JSON object. A request is ``{"op": NAME,
  ...args}``; the answer ``{"ok": true, ...}`` or ``{"ok": false, "error":
  TEXT}``. A connection may carry several requests, one at a time.
- A malformed request (not JSON, JSON nested too deeply, not an object, no
  string ``op``, an unknown op, bad arguments, a frame over `MAX_REQUEST`)
  gets an error answer; no request, however bad, stops the node. The client
  refuses to send a request over `MAX_REQUEST` itself ("request too large"),
  and the socket queues up to `LISTEN_BACKLOG` connections not yet accepted.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import stat
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio

from ledger.errors import LedgerError
from node.errors import BadRequest, DataDirError, NodeError
from node.net import FrameEOF, FrameTooLarge, FramingError, read_frame, write_frame

log = logging.getLogger(__name__)

SOCK_FILE = "node.sock"
MAX_REQUEST = 4 * 1024 * 1024  # a request frame (a transaction in hex fits)
MAX_RESPONSE = 16 * 1024 * 1024
IDLE_TIMEOUT_S = 300.0  # a connection with no request for this long is closed
_SUN_PATH_MAX = 100  # sockaddr_un holds 108 bytes on Linux (104 elsewhere)
# Connections waiting to be accepted: a burst of CLI calls (a script polling
# `pnode status` from many shells) must queue, not fail with EAGAIN.
LISTEN_BACKLOG = socket.SOMAXCONN

#: An op: ``await handler(args) -> reply fields`` (``args``: the request less ``op``).
ControlOp = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class ControlError(NodeError):
    """A control request that failed: refused by the node, or no valid answer."""


class NodeNotRunning(ControlError):
    """No node answers on the data dir's control socket (none is running)."""


def socket_path(data_dir: str | os.PathLike[str]) -> Path:
    """The control socket of a data dir."""
    return Path(data_dir).expanduser() / SOCK_FILE


class ControlServer:
    """Serves ``ops`` on a Unix socket until cancelled."""

    def __init__(self, path: str | os.PathLike[str], ops: Mapping[str, ControlOp]):
        self.path = Path(path)
        self.ops = dict(ops)

    async def run(self, *, task_status: trio.TaskStatus[ControlServer] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Listen (replacing a stale socket file), serve, and remove the socket when done.

        Raises:
            DataDirError: the path is taken by something other than a stale
                socket (a file, or a socket another process serves).
            OSError: the socket cannot be created.
        """
        sock = await _listen(self.path)
        ino = self.path.stat().st_ino
        try:
            async with trio.open_nursery() as nursery:
                listener = trio.SocketListener(sock)
                await nursery.start(functools.partial(
                    trio.serve_listeners, self._serve, [listener], handler_nursery=nursery))
                task_status.started(self)
        finally:
            sock.close()
            try:
                if self.path.stat().st_ino == ino:  # ours still, not a successor's
                    self.path.unlink()
            except FileNotFoundError:
                pass

    async def handle(self, request: bytes) -> dict[str, Any]:
        """The answer to one request frame (never raises but for cancellation)."""
        try:
            msg = json.loads(request)
        except ValueError as exc:  # also bad UTF-8
            return _error(f"request is not JSON: {exc}")
        except RecursionError:  # [[[[...]]]] a hundred thousand deep: an answer, not a hang-up
            return _error("request is not JSON this node reads: nested too deeply")
        if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
            return _error('a request is a JSON object with a string "op"')
        name = msg.pop("op")
        op = self.ops.get(name)
        if op is None:
            return _error(f"unknown op {name!r} (known: {', '.join(sorted(self.ops))})")
        try:
            return {"ok": True, **await op(msg)}
        except BadRequest as exc:
            return _error(str(exc))
        except (NodeError, LedgerError) as exc:  # refused: a bad transaction, say
            return _error(f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a bug; still, a request must never take the node down
            log.exception("control op %s failed", name)
            return _error(f"internal error: {type(exc).__name__}: {exc}")

    async def _serve(self, stream: trio.SocketStream) -> None:
        try:
            async with stream:
                await self._converse(_Conn(stream))
        except Exception as exc:  # a broken client must not take the node down either
            log.warning("control connection failed: %s: %s", type(exc).__name__, exc)

    async def _converse(self, conn: _Conn) -> None:
        """Answer requests one by one until the client hangs up."""
        while True:
            try:
                request = await read_frame(conn, MAX_REQUEST, timeout=IDLE_TIMEOUT_S)
            except FrameEOF:
                return
            except FrameTooLarge as exc:
                await _reply(conn, _error(f"request too large: {exc}"))
                return  # the rest of the frame is still in the stream
            except FramingError as exc:
                log.debug("control connection dropped: %s", exc)
                return
            if not await _reply(conn, await self.handle(request)):
                return


async def control_request(data_dir: str | os.PathLike[str], op: str, /, *,
                          timeout_s: float = 30.0, **args: Any) -> dict[str, Any]:
    """Ask the node running on ``data_dir`` to do ``op`` with ``args``.

    Args:
        data_dir: the node's data dir (its socket is ``data_dir/node.sock``).
        op: the op's name (``status``, ``account``, ``submit_tx``, ...).
        timeout_s: most seconds to wait for the answer.
        args: the op's arguments (JSON-encodable).

    Returns:
        The answer, ``{"ok": True, ...}``.

    Raises:
        NodeNotRunning: no socket, or nobody listening on it.
        ControlError: the node refused the request (its error text), or the
            answer did not come or was not valid.
    """
    path = socket_path(data_dir)
    request = json.dumps({**args, "op": op}).encode()
    if len(request) > MAX_REQUEST:  # the node would hang up mid-frame: say why, here
        raise ControlError(f"request too large: {len(request)} bytes, at most {MAX_REQUEST}")
    try:
        with _sockaddr(path) as addr:
            stream = await trio.open_unix_socket(addr)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise NodeNotRunning(f"no node is running on {path.parent} ({exc.strerror})") from None
    except OSError as exc:
        raise ControlError(f"cannot reach the node on {path}: {exc}") from None
    conn = _Conn(stream)
    async with stream:
        try:
            await write_frame(conn, request, timeout=timeout_s)
            raw = await read_frame(conn, MAX_RESPONSE, timeout=timeout_s)
        except FramingError as exc:
            raise ControlError(f"no answer from the node on {path}: {exc}") from None
    try:
        reply = json.loads(raw)
    except ValueError:
        reply = None
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        raise ControlError(f"the node on {path} answered something that is not a reply")
    if not reply["ok"]:
        raise ControlError(str(reply.get("error", "refused, no reason given")))
    return reply


def control_call(data_dir: str | os.PathLike[str], op: str, /, **args: Any) -> dict[str, Any]:
    """`control_request` for synchronous callers (the CLIs): runs its own trio loop.

    Raises:
        NodeNotRunning, ControlError: as `control_request`.
    """
    if not socket_path(data_dir).exists():  # the common case, without a trio loop
        raise NodeNotRunning(f"no node is running on {Path(data_dir).expanduser()}")
    return trio.run(functools.partial(control_request, data_dir, op, **args))


# -- plumbing --------------------------------------------------------------------------


class _Conn:
    """A trio stream as the ``read``/``write`` byte stream `node.net.framing` wants."""

    def __init__(self, stream: trio.abc.Stream):
        self._stream = stream

    async def read(self, n: int | None = None) -> bytes:
        return await self._stream.receive_some(n)

    async def write(self, data: bytes) -> None:
        await self._stream.send_all(data)


def _error(text: str) -> dict[str, Any]:
    return {"ok": False, "error": text}


async def _reply(conn: _Conn, reply: dict[str, Any]) -> bool:
    """Send an answer; False if the client is gone."""
    try:
        await write_frame(conn, json.dumps(reply).encode(), timeout=IDLE_TIMEOUT_S)
        return True
    except FramingError as exc:
        log.debug("control client gone before its answer: %s", exc)
        return False


@contextmanager
def _sockaddr(path: Path) -> Iterator[str]:
    """An address for ``path`` that fits a ``sockaddr_un``.

    A long path is reached through ``/proc/self/fd/<fd of its directory>``
    (Linux), valid while the context is open.
    """
    if len(os.fsencode(str(path))) < _SUN_PATH_MAX:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


async def _listen(path: Path) -> trio.socket.SocketType:
    """A listening Unix socket at ``path``, mode 0600, replacing a stale one."""
    if os.path.lexists(path):
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise DataDirError(f"{path} exists and is not a socket; remove it")
        if _answers(path):
            raise DataDirError(f"another process serves {path}")
        path.unlink()  # left by a node that was killed
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with _sockaddr(path) as addr:
            await sock.bind(addr)
        os.chmod(path, 0o600)  # before listen(): nobody can connect yet
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def _answers(path: Path) -> bool:
    """Whether a process accepts connections on the socket ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with _sockaddr(path) as addr:
            probe.connect(addr)
        return True
    except OSError:
        return False
    finally:
        probe.close()
