"""Length-framed messages over a byte stream (a libp2p stream, usually).

This module owns the wire framing of every request/response protocol of the
node (``/pnode/<name>/1.0.0``; ARCHITECTURE.md, the network): one frame is a
4-byte big-endian unsigned length followed by that many payload bytes.
Tensors and other large payloads travel this way, never over gossipsub.

Reading is defensive, since the other end is untrusted:

- the length prefix is checked against the caller's ``max_size`` before a
  single body byte is read, and the body buffer grows only with bytes that
  actually arrived (a peer that announces 16 MiB and sends 1 byte costs 1 byte);
- a stream that ends before the first byte of a frame is a clean end
  (`FrameEOF`); one that ends anywhere inside a frame is `FrameTruncated`;
- an optional ``timeout`` bounds the whole frame, so a peer that drips one
  byte at a time cannot hold a reader forever. The bound scales with the
  frame: ``timeout`` seconds for the length prefix, and the whole frame
  ``timeout + size / MIN_TRANSFER_RATE`` from the start (`frame_deadline`), so
  a large frame over a slow or loaded link is not cut at a flat limit. A
  timeout says the peer is slow, never that it misbehaved: `node.net.host`
  does not score `FrameTimeout` (specs/network.md section 2).

The stream only needs ``await read(n) -> bytes`` (at most ``n`` bytes; an
empty result or ``EOFError``/libp2p ``StreamEOF`` at end of stream) and
``await write(data)``.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager
from typing import Protocol

import trio

from node.errors import NodeError

HEADER_SIZE = 4
MAX_LENGTH = 2**32 - 1  # what the 4-byte prefix can express
DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024  # 16 MiB: a large hidden-state batch
READ_CHUNK = 256 * 1024  # the most one read() asks for (bounds each allocation)
# The slowest link a frame's deadline allows for, in bytes per second: a frame of
# ``size`` bytes gets ``size / MIN_TRANSFER_RATE`` seconds on top of its base timeout
# (SmolLM2's 113 MB of averaged tensors: 108 s more). Attack note: a peer can hold a
# reader this long per frame, but only up to the reader's ``max_size``, and the buffer
# grows only with bytes that arrived.
MIN_TRANSFER_RATE = 1024 * 1024

_HEADER = struct.Struct(">I")


def frame_deadline(timeout: float, size: int) -> float:
    """Seconds a frame of ``size`` payload bytes may take, given a base ``timeout``.

    Args:
        timeout: the base seconds (what a tiny frame gets).
        size: the frame's payload length.

    Returns:
        ``timeout + size / MIN_TRANSFER_RATE``.
    """
    return timeout + size / MIN_TRANSFER_RATE


class ByteStream(Protocol):
    """What framing needs from a stream (libp2p's INetStream fits)."""

    async def read(self, n: int | None = None) -> bytes: ...

    async def write(self, data: bytes) -> None: ...


class FramingError(NodeError):
    """Root of the framing errors: the stream must not be read further."""


class FrameTooLarge(FramingError):
    """A frame longer than the reader (or writer) allows.

    Attributes:
        size: the announced (or attempted) payload length.
        max_size: the limit it broke.
    """

    def __init__(self, size: int, max_size: int):
        super().__init__(f"frame of {size} bytes exceeds the limit of {max_size} bytes")
        self.size = size
        self.max_size = max_size


class FrameTruncated(FramingError):
    """The stream ended inside a frame (in its length prefix or its body).

    Attributes:
        expected: bytes the frame part needed.
        received: bytes that arrived before the end.
    """

    def __init__(self, part: str, expected: int, received: int):
        super().__init__(f"stream ended inside a frame {part}: {received} of {expected} bytes")
        self.expected = expected
        self.received = received


class FrameEOF(FramingError):
    """The stream ended cleanly between frames (no byte of a next frame)."""


class FrameTimeout(FramingError):
    """A frame did not arrive (or could not be sent) within the timeout."""


class FrameStreamError(FramingError):
    """The stream broke (reset, closed for writing, connection lost)."""


async def write_frame(
    stream: ByteStream,
    payload: bytes,
    *,
    max_size: int = MAX_LENGTH,
    timeout: float | None = None,
) -> None:
    """Write one frame: 4-byte big-endian length, then ``payload``.

    Args:
        stream: where to write.
        payload: the frame body.
        max_size: refuse payloads longer than this (the peer's known limit).
        timeout: base seconds the write may take; the limit is
            `frame_deadline` (``timeout`` plus the payload at
            `MIN_TRANSFER_RATE`). None waits forever.

    Raises:
        FrameTooLarge: ``payload`` is longer than ``max_size`` (or 2**32-1).
        FrameTimeout: the write did not finish within that limit.
        FrameStreamError: the stream broke.
    """
    size = len(payload)
    if size > min(max_size, MAX_LENGTH):
        raise FrameTooLarge(size, min(max_size, MAX_LENGTH))
    data = _HEADER.pack(size) + bytes(payload)
    limit = None if timeout is None else frame_deadline(timeout, size)
    try:
        with _deadline(limit):
            await stream.write(data)
    except trio.TooSlowError:
        raise FrameTimeout(f"writing a {size}-byte frame took over {limit:.1f} s") from None
    except _broken_stream_errors() as exc:
        raise FrameStreamError(f"stream broke while writing a frame: {exc!r}") from exc


async def read_frame(
    stream: ByteStream,
    max_size: int = DEFAULT_MAX_FRAME_SIZE,
    *,
    timeout: float | None = None,
) -> bytes:
    """Read exactly one frame and return its payload.

    Args:
        stream: where to read.
        max_size: the longest payload accepted; a longer length prefix is
            refused before any body byte is read.
        timeout: seconds for the length prefix to arrive; once it has, the
            whole frame may take `frame_deadline` (``timeout`` plus its
            announced size at `MIN_TRANSFER_RATE`), counted from the call.
            None waits forever.

    Returns:
        The payload (possibly empty).

    Raises:
        FrameEOF: the stream ended cleanly before the frame began.
        FrameTruncated: the stream ended inside the frame.
        FrameTooLarge: the length prefix exceeds ``max_size``.
        FrameTimeout: the frame did not arrive within that limit.
        FrameStreamError: the stream broke (reset, connection lost).
    """
    size = None
    try:
        with _deadline(timeout) as scope:
            header = await _read_exactly(stream, HEADER_SIZE, "length prefix", clean_eof=True)
            (size,) = _HEADER.unpack(header)
            if size > max_size:
                raise FrameTooLarge(size, max_size)
            _extend(scope, timeout, size)
            return await _read_exactly(stream, size, "body", clean_eof=False)
    except trio.TooSlowError:
        raise FrameTimeout(_late(timeout, size)) from None


async def iter_frames(
    stream: ByteStream,
    max_size: int = DEFAULT_MAX_FRAME_SIZE,
    *,
    timeout: float | None = None,
) -> AsyncIterator[bytes]:
    """Yield frames until the stream ends cleanly between two frames.

    Args and Raises: as `read_frame`, except that a clean end stops the
    iteration instead of raising `FrameEOF`.
    """
    while True:
        try:
            payload = await read_frame(stream, max_size, timeout=timeout)
        except FrameEOF:
            return
        yield payload


class FrameReader:
    """Reads consecutive frames from one stream with as few reads as possible.

    `read_frame` reads a frame's prefix and its body separately; over a
    py-libp2p yamux stream every read costs a window-update round and several
    event-loop turns. A long-lived stream that carries many frames (an
    inference session) reads whatever has arrived, up to `READ_CHUNK` bytes,
    and keeps what belongs to the next frame. Same checks and errors as
    `read_frame`.
    """

    def __init__(self, stream: ByteStream):
        self.stream = stream
        self._buffer = bytearray()

    async def read_frame(self, max_size: int = DEFAULT_MAX_FRAME_SIZE, *,
                         timeout: float | None = None) -> bytes:
        """Read exactly one frame and return its payload (see `read_frame`)."""
        size = None
        try:
            with _deadline(timeout) as scope:
                await self._fill(HEADER_SIZE, "length prefix", clean_eof=True)
                (size,) = _HEADER.unpack_from(self._buffer)
                if size > max_size:
                    raise FrameTooLarge(size, max_size)
                _extend(scope, timeout, size)
                await self._fill(HEADER_SIZE + size, "body", clean_eof=False)
        except trio.TooSlowError:
            raise FrameTimeout(_late(timeout, size)) from None
        payload = bytes(self._buffer[HEADER_SIZE:HEADER_SIZE + size])
        del self._buffer[:HEADER_SIZE + size]
        return payload

    async def _fill(self, n: int, part: str, *, clean_eof: bool) -> None:
        """Read until the buffer holds ``n`` bytes (each read bounded by READ_CHUNK)."""
        while len(self._buffer) < n:
            try:  # whatever has arrived: usually the whole frame in one read
                chunk = await self.stream.read(READ_CHUNK)
            except EOFError:
                chunk = b""
            except _broken_stream_errors() as exc:
                raise FrameStreamError(f"stream broke while reading a frame {part}: "
                                       f"{exc!r}") from exc
            if not chunk:
                if not self._buffer and clean_eof:
                    raise FrameEOF("stream ended between frames")
                got = len(self._buffer) - (HEADER_SIZE if part == "body" else 0)
                raise FrameTruncated(part, n - (HEADER_SIZE if part == "body" else 0), got)
            if len(chunk) > READ_CHUNK:
                raise FrameStreamError(f"stream returned {len(chunk)} bytes for a read of "
                                       f"{READ_CHUNK}")
            self._buffer += chunk


async def _read_exactly(stream: ByteStream, n: int, part: str, *, clean_eof: bool) -> bytes:
    """Read exactly ``n`` bytes, in as many reads as the stream needs."""
    chunks: list[bytes] = []
    got = 0
    while got < n:
        want = min(n - got, READ_CHUNK)
        try:
            chunk = await stream.read(want)
        except EOFError:  # libp2p's StreamEOF is an EOFError
            chunk = b""
        except _broken_stream_errors() as exc:
            raise FrameStreamError(f"stream broke while reading a frame {part}: {exc!r}") from exc
        if not chunk:
            if got == 0 and clean_eof:
                raise FrameEOF("stream ended between frames")
            raise FrameTruncated(part, n, got)
        if len(chunk) > want:
            raise FrameStreamError(f"stream returned {len(chunk)} bytes for a read of {want}")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _broken_stream_errors() -> tuple[type[BaseException], ...]:
    """What a broken stream raises: trio's and the OS's errors, and libp2p's.

    libp2p's ``IOException`` is looked up only if libp2p is loaded (a libp2p
    stream cannot exist otherwise), so that framing over a local socket
    (`node.control`, used by the CLIs) does not pay for importing libp2p.
    """
    errors: tuple[type[BaseException], ...] = (
        OSError, trio.BrokenResourceError, trio.ClosedResourceError)
    libp2p_io = sys.modules.get("libp2p.io.exceptions")
    return errors if libp2p_io is None else (*errors, libp2p_io.IOException)


def _deadline(timeout: float | None) -> AbstractContextManager[trio.CancelScope]:
    """A ``fail_after`` scope, or a scope that never fires for ``None``."""
    if timeout is None:
        return trio.CancelScope()
    return trio.fail_after(timeout)


def _extend(scope: trio.CancelScope, timeout: float | None, size: int) -> None:
    """Give a frame whose length prefix came the time its size needs (`frame_deadline`)."""
    if timeout is not None:
        scope.deadline += size / MIN_TRANSFER_RATE


def _late(timeout: float | None, size: int | None) -> str:
    """The text of a read's `FrameTimeout`."""
    if size is None:
        return f"no frame began within {timeout} s"
    return (f"no complete frame of {size} bytes within {frame_deadline(timeout or 0.0, size):.1f} s"
            f" (at least {MIN_TRANSFER_RATE} bytes/s)")
