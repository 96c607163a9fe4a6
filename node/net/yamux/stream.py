"""One yamux stream (specs/network.md section 1a).

Owns `YamuxStream` (a byte stream each way, half-closable, resettable, with
yamux's flow control); `node.net.yamux.frames` owns the wire format, and
`node.net.yamux.conn` the connection that reads frames and hands them to its
streams (`on_data`, `on_window`, `on_fin`, `on_reset`).

Cancellation: every call either does all it says or, cancelled, nothing.
`read` never awaits once it has taken data (its window update is queued);
`write` counts a chunk against the window only once the chunk is sent;
`close` marks the stream closed only once its FIN is sent; `reset` does not
wait at all (its RST is queued).
"""

from __future__ import annotations

import trio
from libp2p.abc import IMuxedStream
from libp2p.stream_muxer.exceptions import (
    MuxedStreamClosed, MuxedStreamEOF, MuxedStreamError, MuxedStreamReset,
)

from node.net.yamux.frames import (
    DATA, FIN, INITIAL_WINDOW, MAX_CHUNK, RST, WINDOW_UPDATE, StreamOwner, YamuxProtocolError,
    take,
)


class YamuxStream(IMuxedStream):
    """One yamux stream: a byte stream each way, half-closable, resettable."""

    def __init__(self, stream_id: int, conn: StreamOwner):
        self.stream_id, self.muxed_conn = stream_id, conn
        self._buffer = bytearray()
        self._recv_credit = INITIAL_WINDOW  # bytes the peer may still send us
        self._consumed = 0  # bytes read and not yet granted back to the peer
        self._send_window = INITIAL_WINDOW  # bytes we may still send
        self.local_closed = self.remote_closed = self.was_reset = False
        self.closed_at = 0.0  # trio time of our FIN (see CLOSE_TIMEOUT)
        self._readable = trio.lowlevel.ParkingLot()
        self._writable = trio.lowlevel.ParkingLot()
        self._writing = trio.Lock()  # one write() at a time: its chunks stay in order

    @property
    def is_closed(self) -> bool:
        """True once the stream is done both ways (closed both ways, or reset)."""
        return self.was_reset or (self.local_closed and self.remote_closed)

    async def read(self, n: int | None = None) -> bytes:
        """Up to ``n`` bytes of what has arrived (all of it for None or -1).

        Raises:
            MuxedStreamReset: the stream or its connection was reset.
            MuxedStreamEOF: the peer closed its side and everything was read.
        """
        if n == 0:
            return b""
        while not self._buffer or self.was_reset:
            if self.was_reset:
                raise MuxedStreamReset(f"stream {self.stream_id} was reset")
            if self.remote_closed:
                raise MuxedStreamEOF(f"stream {self.stream_id} ended")
            await self._readable.park()
        if n is None or n < 0 or n >= len(self._buffer):
            data = bytes(self._buffer)
            self._buffer.clear()
        else:
            data = bytes(self._buffer[:n])
            del self._buffer[:n]
        self.muxed_conn.buffered -= len(data)
        self._grant(len(data))
        return data  # no await once the data is taken: a cancelled read loses nothing

    def _grant(self, read: int) -> None:
        """Give the peer back the window of bytes read, once half a window is due."""
        self._consumed += read
        if self._consumed < INITIAL_WINDOW // 2 or self.remote_closed or self.was_reset:
            return
        delta, self._consumed = self._consumed, 0
        self._recv_credit += delta
        self.muxed_conn.queue(WINDOW_UPDATE, 0, self.stream_id, delta)

    async def write(self, data: bytes) -> None:
        """Send ``data``, waiting for window as the peer grants it.

        Raises:
            MuxedStreamClosed: this side was closed.
            MuxedStreamReset: the stream or its connection was reset.
        """
        view = memoryview(bytes(data))
        await take(self._writing)
        try:
            while view:
                self._check_writable()
                while self._send_window == 0:
                    await self._writable.park()
                    self._check_writable()
                size = min(len(view), self._send_window, MAX_CHUNK)
                # Sent whole or not at all (`_send`): a cancelled write keeps its window.
                await self.muxed_conn.send_frame(DATA, 0, self.stream_id, size, view[:size])
                self._send_window -= size
                view = view[size:]
        finally:
            self._writing.release()

    def _check_writable(self) -> None:
        if self.was_reset:
            raise MuxedStreamReset(f"stream {self.stream_id} was reset")
        if self.local_closed:
            raise MuxedStreamClosed(f"stream {self.stream_id} is closed for writing")

    async def close(self) -> None:
        """Close this side (FIN) after any write in flight; reading goes on.

        Cancelled, it has sent nothing and changed nothing (call it again).
        """
        if self.local_closed or self.was_reset:
            return
        await take(self._writing)
        try:
            if not (self.local_closed or self.was_reset):
                try:
                    await self.muxed_conn.send_frame(WINDOW_UPDATE, FIN, self.stream_id, 0)
                except MuxedStreamError:
                    pass  # the connection is gone, and the stream with it
                self.local_closed, self.closed_at = True, trio.current_time()
        finally:
            self._writing.release()
        self._writable.unpark_all()
        self.muxed_conn.forget_if_done(self)

    async def reset(self) -> None:
        """Abort both ways (RST, sent without waiting); buffered data is dropped."""
        if self.is_closed:
            return
        self.on_reset()
        self.muxed_conn.queue(WINDOW_UPDATE, RST, self.stream_id, 0)
        await trio.lowlevel.cancel_shielded_checkpoint()

    def on_reset(self) -> None:
        """Mark the stream reset (by either side, or by the connection's end)."""
        self.was_reset = True
        self.muxed_conn.buffered -= len(self._buffer)
        self._buffer.clear()
        self._wake_and_forget()

    def on_connection_end(self) -> None:
        """The connection ended: a stream the peer had finished keeps its data, to EOF."""
        if not self.remote_closed:
            return self.on_reset()
        self.local_closed = True
        self._wake_and_forget()

    def _wake_and_forget(self) -> None:
        self._readable.unpark_all()
        self._writable.unpark_all()
        self.muxed_conn.forget_if_done(self)

    def on_data(self, body: bytes) -> None:
        if len(body) > self._recv_credit:
            raise YamuxProtocolError(f"stream {self.stream_id}: {len(body)} bytes of data "
                                     f"with {self._recv_credit} bytes of window left")
        self._recv_credit -= len(body)
        if not self.was_reset and not self.remote_closed:
            self._buffer += body
            self.muxed_conn.buffered += len(body)
            self._readable.unpark_all()

    def on_window(self, delta: int) -> None:
        self._send_window += delta
        if delta:
            self._writable.unpark_all()

    def on_fin(self) -> None:
        self.remote_closed = True
        self._readable.unpark_all()
        self.muxed_conn.forget_if_done(self)

    def set_deadline(self, ttl: int) -> None:
        """Yamux has no deadlines (as py-libp2p's); use trio's cancel scopes."""
        raise NotImplementedError("yamux streams have no deadlines; use a trio cancel scope")

    def get_remote_address(self) -> tuple[str, int] | None:
        return self.muxed_conn.get_remote_address()

    async def __aenter__(self) -> YamuxStream:
        return self
