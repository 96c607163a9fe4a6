"""pnode's yamux: the stream muxer under every libp2p connection of a node.

Owns `YamuxConnection`, a `/yamux/1.0.0` muxer with the wire format of
hashicorp's yamux spec (so it talks to any yamux peer, py-libp2p's own
included: tests/node/net/test_yamux.py runs both against each other), and
`install`, which makes a py-libp2p host negotiate it (specs/network.md
section 1a). Its streams are `node.net.yamux.stream`'s, the frame format
`node.net.yamux.frames`'s.

Why not py-libp2p's `Yamux`: it sends a window update on every read before
the read returns, takes several locks and formats debug strings per frame,
and reads each frame's header and body separately: 0.85 ms per round trip
above the Noise session on loopback, against 0.31 ms here
(bench/transport_bench.py). Here one reader task per connection takes every
frame out of each Noise message and dispatches them without awaiting;
readers and writers wait on parking lots; a window update goes out once
half the window has been read (as go-yamux).

Limits a hostile peer meets (any breach ends the connection with a GoAway
"protocol error"): a data frame larger than its stream's remaining receive
window, more than `MAX_BUFFERED` bytes received and unread on all streams,
an unknown version or frame type, a SYN for a stream id that is in use or
of the wrong parity, a stream frame with id 0, more than `MAX_REPLIES`
frames owed and unsent (a peer that does not read). A SYN beyond
`MAX_STREAMS` open streams, or while `ACCEPT_BACKLOG` streams wait to be
accepted, is answered with RST; a stream closed here that the peer has not
closed within `CLOSE_TIMEOUT` is reset (as go-yamux).

Frames that must not wait (ACKs, pongs, RSTs, window updates) are queued
and go out before the next frame written, from a task of their own if none
is: the reader never waits on a write. Writes are shielded from
cancellation (for at most `SEND_TIMEOUT` s): a frame cut in half, or a
Noise message encrypted and not sent, would corrupt every stream of the
connection. When the connection ends, a stream the peer had finished (FIN)
keeps its data until read; the others are reset.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from libp2p.abc import IMuxedConn, ISecureConn
from libp2p.peer.id import ID
from libp2p.stream_muxer.exceptions import MuxedConnUnavailable, MuxedStreamError, MuxedStreamReset
from libp2p.stream_muxer.muxer_multistream import MuxerMultistream

from node.net.yamux.frames import (
    ACK, DATA, FIN, GO_AWAY, GO_AWAY_NORMAL, GO_AWAY_PROTOCOL_ERROR, HEADER, INITIAL_WINDOW, PING,
    PROTOCOL_ID, RST, SYN, VERSION, WINDOW_UPDATE, YamuxProtocolError, take,
)
from node.net.yamux.stream import YamuxStream

__all__ = ["INITIAL_WINDOW", "PROTOCOL_ID", "YamuxConnection", "YamuxStream", "install"]

log = logging.getLogger(__name__)

MAX_STREAMS = 1024  # open streams per connection, both directions
ACCEPT_BACKLOG = 256  # inbound streams not yet taken by accept_stream
MAX_REPLIES = 4096  # queued frames (`queue`) owed to a peer that does not read them
MAX_BUFFERED = 64 << 20  # bytes received and not yet read, all streams of a connection
CLOSE_TIMEOUT = 300.0  # s a stream closed here waits for the peer's FIN before a reset
SEND_TIMEOUT = 10.0  # seconds a shielded write may take before the connection is dropped


class YamuxConnection(IMuxedConn):
    """A yamux session over one secured connection (see the module docstring).

    Made by py-libp2p's upgrader once `/yamux/1.0.0` is negotiated; the swarm
    runs `start` as a task, which reads until the connection ends.
    """

    def __init__(self, secured_conn: ISecureConn, peer_id: ID,
                 is_initiator: bool | None = None,
                 on_close: Callable[[], Awaitable[Any]] | None = None):
        self.secured_conn, self.peer_id, self.on_close = secured_conn, peer_id, on_close
        self._initiator = bool(secured_conn.is_initiator if is_initiator is None else is_initiator)
        self._next_id = 1 if self._initiator else 2  # initiators odd, responders even
        self.streams: dict[int, YamuxStream] = {}
        self._to_accept, self._accepted = trio.open_memory_channel[YamuxStream](ACCEPT_BACKLOG)
        self._send_lock = trio.Lock()
        self._replies: list[bytes] = []  # queued: ACKs, pongs, RSTs, window updates
        self._reply_due = trio.lowlevel.ParkingLot()
        self.remote_gone_away = self._closing = False
        self.buffered = 0  # bytes received on all streams and not yet read
        self._pings: dict[int, trio.Event] = {}  # opaque value -> set when its pong comes
        self._ping_count = 0
        self.event_started, self.event_closed = trio.Event(), trio.Event()

    # -- IMuxedConn --------------------------------------------------------

    @property
    def is_initiator(self) -> bool:
        return self._initiator

    @property
    def is_established(self) -> bool:
        return self.event_started.is_set() and not (self._closing or self.remote_gone_away)

    @property
    def is_closed(self) -> bool:
        return self.event_closed.is_set()

    def get_transport_addresses(self) -> list[Any]:
        return self.secured_conn.get_transport_addresses()

    def get_connection_type(self) -> Any:
        return self.secured_conn.get_connection_type()

    def get_remote_address(self) -> tuple[str, int] | None:
        return self.secured_conn.get_remote_address()

    async def start(self) -> None:
        """Read and dispatch frames until the connection ends; then close it."""
        if self.event_started.is_set():
            return
        code = GO_AWAY_NORMAL
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._send_replies)
                nursery.start_soon(self._reset_abandoned)
                self.event_started.set()
                code = await self._read_frames()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self.close(code)

    async def close(self, error_code: int = GO_AWAY_NORMAL) -> None:
        """Say GoAway (best effort), close the secured connection, reset all streams."""
        if self._closing:
            return
        self._closing = True
        with trio.move_on_after(1.0, shield=True):  # bounds the wait for the send lock
            try:
                await self._send(HEADER.pack(VERSION, GO_AWAY, 0, 0, error_code))
            except MuxedStreamError:
                pass
        await self._abort()
        for stream in list(self.streams.values()):
            stream.on_connection_end()
        self._to_accept.close()
        self._reply_due.unpark_all()
        self.event_closed.set()
        if self.on_close is not None:
            with trio.move_on_after(5.0):  # the swarm's cleanup, which must not hang us
                try:
                    await self.on_close()
                except Exception:  # the swarm's own cleanup: log it, the muxer is closed
                    log.exception("yamux: on_close for %s failed", self.peer_id)

    async def _abort(self) -> None:
        """Close the secured connection under us; the reader then sees its end."""
        with trio.CancelScope(shield=True):
            try:
                await self.secured_conn.close()
            except Exception:  # already broken: nothing left to close
                pass

    async def open_stream(self) -> YamuxStream:
        """Open a stream (SYN sent before this returns).

        Raises:
            MuxedStreamError: the connection is closing, went away, or is full.
        """
        if self._closing or self.remote_gone_away:
            raise MuxedStreamError(f"connection to {self.peer_id} is closing")
        if len(self.streams) >= MAX_STREAMS:
            raise MuxedStreamError(f"{MAX_STREAMS} streams are open to {self.peer_id}")
        stream = YamuxStream(self._next_id, self)
        self._next_id += 2
        self.streams[stream.stream_id] = stream
        try:
            await self.send_frame(WINDOW_UPDATE, SYN, stream.stream_id, 0)
        except BaseException:
            self.streams.pop(stream.stream_id, None)
            raise
        return stream

    async def accept_stream(self) -> YamuxStream:
        """The next stream the peer opened.

        Raises:
            MuxedConnUnavailable: the connection ended.
        """
        try:
            return await self._accepted.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise MuxedConnUnavailable(f"connection to {self.peer_id} ended") from None

    async def ping(self, timeout: float) -> float | None:
        """Seconds until the peer answered a ping, or None if it did not within ``timeout``.

        Raises:
            MuxedStreamReset: the connection is closed or broke.
        """
        self._ping_count += 1
        opaque = self._ping_count & 0xFFFFFFFF
        pong = self._pings[opaque] = trio.Event()
        began = trio.current_time()
        try:
            await self.send_frame(PING, SYN, 0, opaque)
            with trio.move_on_after(timeout):
                await pong.wait()
                return trio.current_time() - began
            return None
        finally:
            self._pings.pop(opaque, None)

    # -- sending -----------------------------------------------------------

    async def send_frame(self, kind: int, flags: int, stream_id: int, length: int,
                         body: bytes | memoryview = b"") -> None:
        """Send one frame (header, then ``body`` for data frames).

        Raises:
            MuxedStreamReset: the connection is closed or broke.
        """
        if self._closing:
            raise MuxedStreamReset(f"connection to {self.peer_id} is closed")
        await self._send(HEADER.pack(VERSION, kind, flags, stream_id, length) + body)

    async def _send(self, frame: bytes = b"") -> None:
        """Write the queued frames, then ``frame``: whole, one writer at a time, shielded.

        Queued frames (`queue`) go first, so that a stream's ACK or RST is
        never overtaken by a frame sent directly after it. A write that fails
        or times out leaves the connection unusable: it is aborted, and the
        reader's end closes it.
        """
        failure = None
        await take(self._send_lock)
        try:
            if self._replies:
                frame, self._replies = b"".join(self._replies) + frame, []
            if not frame:
                return
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + SEND_TIMEOUT
                try:
                    await self.secured_conn.write(frame)
                except Exception as exc:  # every transport error means the same here
                    failure = repr(exc)
            if scope.cancelled_caught:
                failure = f"a write took over {SEND_TIMEOUT} s"
        finally:
            self._send_lock.release()
        if failure is not None:
            await self._abort()
            raise MuxedStreamReset(f"connection to {self.peer_id} broke: {failure}")

    def queue(self, kind: int, flags: int, stream_id: int, length: int) -> None:
        """Have a body-less frame sent soon, without waiting (nothing once closing)."""
        if not self._closing:
            self._replies.append(HEADER.pack(VERSION, kind, flags, stream_id, length))
            self._reply_due.unpark_all()

    async def _reset_abandoned(self) -> None:
        """Reset streams closed here whose peer never closed its side (as go-yamux)."""
        while True:
            await trio.sleep(CLOSE_TIMEOUT / 4)
            expired = trio.current_time() - CLOSE_TIMEOUT
            for stream in list(self.streams.values()):
                if stream.local_closed and not stream.remote_closed \
                        and stream.closed_at < expired:
                    await stream.reset()

    async def _send_replies(self) -> None:
        """Send what the reader owes the peer, so that the reader never waits on a write."""
        while not self._closing:
            if not self._replies:
                await self._reply_due.park()
                continue
            try:
                await self._send()
            except MuxedStreamError:
                return

    # -- receiving ---------------------------------------------------------

    async def _read_frames(self) -> int:
        """Take every complete frame out of each message read, until the end.

        Returns:
            The GoAway code to close with: normal at EOF, protocol error
            after a frame that breaks the protocol.
        """
        try:
            await self._read_until_eof()
        except YamuxProtocolError as exc:
            log.info("yamux: closing the connection to %s: %s", self.peer_id, exc)
            return GO_AWAY_PROTOCOL_ERROR
        return GO_AWAY_NORMAL

    async def _read_until_eof(self) -> None:
        buffer, start = bytearray(), 0
        while True:
            try:
                chunk = await self.secured_conn.read()  # one Noise message
            except Exception:  # EOF, reset or a broken session: the connection ended
                return
            if not chunk:
                return
            buffer += chunk
            while len(buffer) - start >= HEADER.size:
                version, kind, flags, stream_id, length = HEADER.unpack_from(buffer, start)
                if version != VERSION or kind > GO_AWAY:
                    raise YamuxProtocolError(f"frame of version {version}, type {kind}")
                body_end = start + HEADER.size + (length if kind == DATA else 0)
                if kind == DATA and length > INITIAL_WINDOW:
                    raise YamuxProtocolError(f"data frame of {length} bytes")
                if len(buffer) < body_end:
                    break
                self._dispatch(kind, flags, stream_id, length,
                               bytes(buffer[start + HEADER.size:body_end]))
                start = body_end
            del buffer[:start]
            start = 0
            if self.buffered > MAX_BUFFERED:
                raise YamuxProtocolError(f"{self.buffered} bytes received and unread")
            if len(self._replies) > MAX_REPLIES:
                raise YamuxProtocolError(f"{len(self._replies)} frames unsent: "
                                         f"the peer does not read")

    def _dispatch(self, kind: int, flags: int, stream_id: int, length: int,
                  body: bytes) -> None:
        """Apply one frame; never awaits (replies are queued)."""
        if kind == PING:
            if flags & SYN:
                self.queue(PING, ACK, 0, length)
            elif flags & ACK and length in self._pings:
                self._pings[length].set()  # an unasked pong is ignored
            return
        if kind == GO_AWAY:
            self.remote_gone_away = True
            return
        if stream_id == 0:
            raise YamuxProtocolError(f"stream frame (type {kind}) for stream 0")
        stream = self._accept_syn(stream_id) if flags & SYN else self.streams.get(stream_id)
        if stream is None:
            return  # a stream we reset or forgot; its late frames are dropped
        if kind == DATA:
            stream.on_data(body)
        else:
            stream.on_window(length)
        if flags & RST:
            stream.on_reset()
        elif flags & FIN:
            stream.on_fin()

    def _accept_syn(self, stream_id: int) -> YamuxStream | None:
        """The stream a SYN opens, queued for `accept_stream`; None if refused (RST)."""
        if stream_id % 2 == self._next_id % 2 or stream_id in self.streams:
            raise YamuxProtocolError(f"SYN for stream {stream_id}, which is ours or open")
        stream = YamuxStream(stream_id, self)
        try:
            if len(self.streams) >= MAX_STREAMS:
                raise trio.WouldBlock
            self._to_accept.send_nowait(stream)
        except (trio.WouldBlock, trio.ClosedResourceError):
            self.queue(WINDOW_UPDATE, RST, stream_id, 0)
            return None
        self.streams[stream_id] = stream
        # ACK now, as py-libp2p and go-yamux do, not with the first frame
        # back: a stream that only reads would leave its opener counting it
        # as never accepted.
        self.queue(WINDOW_UPDATE, ACK, stream_id, 0)
        return stream

    def forget_if_done(self, stream: YamuxStream) -> None:
        """Drop a stream that is closed both ways or reset from the table."""
        if stream.is_closed and self.streams.get(stream.stream_id) is stream:
            del self.streams[stream.stream_id]


class _Negotiator(MuxerMultistream):
    """py-libp2p's muxer negotiation, building the class registered for the protocol.

    py-libp2p 0.8.1's own `new_conn` builds its `Yamux` for `/yamux/1.0.0`
    whatever class was registered; this one honours the registration.
    """

    async def new_conn(self, conn: ISecureConn, peer_id: ID) -> IMuxedConn:
        protocol, muxer_class = await self._selector.select(
            conn, conn.is_initiator, self.negotiate_timeout)
        return self._annotate_connection(muxer_class(conn, peer_id), conn, protocol)


def install(host: Any) -> None:
    """Make ``host`` (a py-libp2p host) negotiate pnode's yamux and nothing else."""
    upgrader = host.get_network().upgrader
    upgrader.muxer_multistream = _Negotiator({PROTOCOL_ID: YamuxConnection},
                                             upgrader.muxer_multistream.negotiate_timeout)
