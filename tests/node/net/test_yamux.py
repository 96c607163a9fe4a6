"""node.net.yamux.conn against py-libp2p's yamux, against itself, and against a hostile peer.

Every connection here is real: TCP on 127.0.0.1 and a Noise handshake
(py-libp2p's). The hostile peer writes yamux frames by hand onto its side
of the Noise session.
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager

import pytest
import trio
from hypothesis import HealthCheck, given, settings, strategies as st
from libp2p.crypto.x25519 import create_new_key_pair as noise_key_pair
from libp2p.io.trio import TrioTCPStream
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.exceptions import (
    MuxedConnUnavailable, MuxedStreamClosed, MuxedStreamEOF, MuxedStreamError, MuxedStreamReset,
)
from libp2p.stream_muxer.muxer_multistream import MuxerMultistream
from libp2p.stream_muxer.yamux.yamux import Yamux

from node.net.framing import read_frame, write_frame
from node.net.host import Host, HostError, open_host
from node.net.yamux import conn as yamux
from node.net.yamux.conn import ACCEPT_BACKLOG, YamuxConnection
from node.net.yamux.frames import (
    ACK, DATA, FIN, GO_AWAY, GO_AWAY_PROTOCOL_ERROR, HEADER, INITIAL_WINDOW, PING, PROTOCOL_ID,
    RST, SYN, WINDOW_UPDATE,
)
from tests.node.netkit import ident, run

ECHO = "/pnode/test-yamux-echo/1.0.0"


def frame(kind: int, flags: int, stream_id: int, length: int, body: bytes = b"") -> bytes:
    return HEADER.pack(0, kind, flags, stream_id, length) + body


async def read_all(stream) -> bytes:
    """Everything until the peer's FIN."""
    data = bytearray()
    while True:
        try:
            data += await stream.read()
        except (MuxedStreamEOF, EOFError):
            return bytes(data)


@asynccontextmanager
async def noise_pair():
    """Two Noise sessions over one real TCP connection: (dialer's, listener's)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    dialer, listener = ident(1), ident(2)
    sessions = {}
    async with trio.open_nursery() as nursery:
        async def accept():
            tcp = await listeners[0].accept()
            noise = NoiseTransport(listener.key_pair, noise_privkey=noise_key_pair().private_key)
            sessions["in"] = await noise.secure_inbound(RawConnection(TrioTCPStream(tcp), False))
        nursery.start_soon(accept)
        tcp = await trio.open_tcp_stream("127.0.0.1", port)
        noise = NoiseTransport(dialer.key_pair, noise_privkey=noise_key_pair().private_key)
        sessions["out"] = await noise.secure_outbound(RawConnection(TrioTCPStream(tcp), True),
                                                      listener.peer_id)
    try:
        yield sessions["out"], sessions["in"]
    finally:
        for session in sessions.values():
            await session.close()
        await listeners[0].aclose()


@asynccontextmanager
async def yamux_pair():
    """Two started `YamuxConnection`s, dialer's and listener's, over `noise_pair`."""
    async with noise_pair() as (out, inbound), trio.open_nursery() as nursery:
        a, b = YamuxConnection(out, ident(2).peer_id), YamuxConnection(inbound, ident(1).peer_id)
        nursery.start_soon(a.start)
        nursery.start_soon(b.start)
        yield a, b
        await a.close()
        await b.close()


class Tap:
    """The hostile side: reads the frames the muxer sends from its Noise session."""

    def __init__(self, session):
        self.session, self.buffer = session, bytearray()

    async def next_frame(self) -> tuple[int, int, int, int, bytes]:
        while True:
            if len(self.buffer) >= HEADER.size:
                _, kind, flags, sid, length = HEADER.unpack_from(self.buffer)
                end = HEADER.size + (length if kind == DATA else 0)
                if len(self.buffer) >= end:
                    body = bytes(self.buffer[HEADER.size:end])
                    del self.buffer[:end]
                    return kind, flags, sid, length, body
            self.buffer += await self.session.read()


@asynccontextmanager
async def hostile_pair():
    """(the hostile dialer's Tap, the listening `YamuxConnection` it talks to)."""
    async with noise_pair() as (out, inbound), trio.open_nursery() as nursery:
        conn = YamuxConnection(inbound, ident(1).peer_id)
        nursery.start_soon(conn.start)
        yield Tap(out), conn
        await conn.close()


# -- interop with py-libp2p's yamux ------------------------------------------------------


def py_libp2p_yamux(host):
    """``host`` made to negotiate py-libp2p 0.8.1's own yamux instead of node.net.yamux.conn."""
    host._host.get_network().upgrader.muxer_multistream = MuxerMultistream({PROTOCOL_ID: Yamux})
    return host


async def echo_all(stream) -> None:
    """Echo one frame back (both ends: node.net.framing over whichever muxer)."""
    await write_frame(stream, await read_frame(stream, 4 << 20))
    await stream.close()


@pytest.mark.parametrize("pnode_dials", [True, False])
def test_interop_with_py_libp2p_yamux(pnode_dials):
    """Frames of 1 MiB (four windows) and 20 concurrent streams, each way across."""
    async def main():
        async with open_host(ident(1)) as ours, trio.open_nursery() as nursery:
            theirs = await nursery.start(py_libp2p_yamux(Host(ident(2))).run)
            for host in (ours, theirs):
                host._host.set_stream_handler(ECHO, echo_all)
            dialer, listener = (ours, theirs) if pnode_dials else (theirs, ours)
            await dialer.connect(listener.addrs[0])
            kinds = {type(c.muxed_conn) for c in ours._host.get_network().get_connections()}
            assert kinds == {YamuxConnection}
            kinds = {type(c.muxed_conn) for c in theirs._host.get_network().get_connections()}
            assert kinds == {Yamux}
            for a, b in ((ours, theirs), (theirs, ours)):
                big = os.urandom(1 << 20)
                stream = await a.open_stream(b.peer_id, ECHO)
                await write_frame(stream, big, max_size=4 << 20)
                assert await read_frame(stream, 4 << 20) == big

                async def one(i, a=a, b=b):
                    s = await a.open_stream(b.peer_id, ECHO)
                    await write_frame(s, bytes([i]) * 5000)
                    assert await read_frame(s) == bytes([i]) * 5000
                async with trio.open_nursery() as streams:
                    for i in range(20):
                        streams.start_soon(one, i)
            theirs.stop()
    run(main, 60)


# -- node.net.yamux.conn with itself ------------------------------------------------------------------


def test_bulk_both_ways_on_many_streams_at_once():
    """8 streams each send 600 KB while the peer echoes: window updates flow both ways."""
    async def main():
        async with yamux_pair() as (a, b):
            payloads = [os.urandom(600_000) for _ in range(8)]

            async def echo_server():
                async with trio.open_nursery() as nursery:
                    for _ in payloads:
                        stream = await b.accept_stream()

                        async def echo(stream=stream):
                            while True:
                                try:
                                    data = await stream.read(70_000)
                                except MuxedStreamEOF:
                                    await stream.close()
                                    return
                                assert len(stream._buffer) <= INITIAL_WINDOW
                                await stream.write(data)
                        nursery.start_soon(echo)

            async def client(payload):
                stream = await a.open_stream()
                async with trio.open_nursery() as nursery:
                    async def send():
                        await stream.write(payload)
                        await stream.close()
                    nursery.start_soon(send)
                    assert await read_all(stream) == payload
                assert stream.stream_id not in a.streams  # closed both ways: forgotten

            async with trio.open_nursery() as nursery:
                nursery.start_soon(echo_server)
                for payload in payloads:
                    nursery.start_soon(client, payload)
            assert a.streams == {} and b.streams == {}
    run(main, 60)


def test_two_writers_on_one_stream_never_interleave_their_writes():
    """Writes larger than the window go out whole, one after the other."""
    async def main():
        async with yamux_pair() as (a, b):
            s = await a.open_stream()
            one, two = b"1" * (2 * INITIAL_WINDOW), b"2" * (2 * INITIAL_WINDOW)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(s.write, one)
                nursery.start_soon(s.write, two)
                t = await b.accept_stream()
                got = bytearray()
                while len(got) < len(one) + len(two):
                    got += await t.read()
            assert bytes(got) in (one + two, two + one)
    run(main)


def test_half_close_then_eof_and_reset_both_ways():
    async def main():
        async with yamux_pair() as (a, b):
            s = await a.open_stream()
            await s.write(b"question")
            await s.close()
            with pytest.raises(MuxedStreamClosed):
                await s.write(b"more")
            t = await b.accept_stream()
            assert await read_all(t) == b"question"  # then EOF: a closed its side
            await t.write(b"answer")  # b's side is still open
            assert await s.read() == b"answer"
            await t.close()
            with pytest.raises(MuxedStreamEOF):
                await s.read()

            s = await a.open_stream()
            await s.write(b"x")
            t = await b.accept_stream()
            assert await t.read(1) == b"x"
            await s.reset()
            with pytest.raises(MuxedStreamReset):
                await t.read()
            with pytest.raises(MuxedStreamReset):
                await t.write(b"y")
            with pytest.raises(MuxedStreamReset):
                await s.read()
    run(main)


def test_a_cancelled_write_leaves_the_connection_whole():
    """A write blocked on a full window, cancelled, sends no partial frame."""
    async def main():
        async with yamux_pair() as (a, b):
            stuck = await a.open_stream()
            with trio.move_on_after(0.3) as scope:
                await stuck.write(os.urandom(3 * INITIAL_WINDOW))  # b never reads it
            assert scope.cancelled_caught and stuck._send_window == 0
            s = await a.open_stream()
            await s.write(b"still fine")
            await s.close()
            t1, t2 = await b.accept_stream(), await b.accept_stream()
            assert await read_all(t2) == b"still fine"
            assert len(await t1.read()) == INITIAL_WINDOW
    run(main)


async def hold(lock: trio.Lock, release: trio.Event, task_status=trio.TASK_STATUS_IGNORED):
    """Hold the connection's send lock, as another stream's slow write does."""
    async with lock:
        task_status.started()
        await release.wait()


def test_calls_cancelled_while_another_write_holds_the_connection_change_nothing():
    async def main():
        async with yamux_pair() as (a, b):
            s = await a.open_stream()
            t = await b.accept_stream()
            released = trio.Event()
            async with trio.open_nursery() as nursery:
                await nursery.start(hold, a._send_lock, released)
                with trio.move_on_after(0.2) as write:
                    await s.write(b"z" * 100_000)
                with trio.move_on_after(0.2) as close:
                    await s.close()
                assert write.cancelled_caught and close.cancelled_caught
                assert s._send_window == INITIAL_WINDOW and not s.local_closed
                released.set()
            await s.write(b"after")
            await s.close()  # this time the FIN goes out
            assert await read_all(t) == b"after"

            s2 = await a.open_stream()
            t2 = await b.accept_stream()
            released = trio.Event()
            async with trio.open_nursery() as nursery:
                await nursery.start(hold, a._send_lock, released)
                with trio.fail_after(1):
                    await s2.reset()  # queued: does not wait for the lock
                released.set()
            with pytest.raises(MuxedStreamReset):
                await t2.read()
    run(main)


def test_a_stream_the_peer_finished_keeps_its_data_past_the_connection_end():
    async def main():
        async with yamux_pair() as (a, b):
            s = await a.open_stream()
            await s.write(b"the whole answer")
            await s.close()
            t = await b.accept_stream()
            await a.close()
            with trio.fail_after(5):
                await b.event_closed.wait()
            assert await read_all(t) == b"the whole answer"
    run(main)


def test_the_connection_ending_resets_streams_and_ends_accept():
    async def main():
        async with yamux_pair() as (a, b):
            s = await a.open_stream()
            await s.write(b"hi")
            t = await b.accept_stream()
            async with trio.open_nursery() as nursery:
                async def accept_after_end():
                    with pytest.raises(MuxedConnUnavailable):
                        await b.accept_stream()
                nursery.start_soon(accept_after_end)
                assert await t.read() == b"hi"
                await a.close()
                with pytest.raises(MuxedStreamReset):
                    await t.read()  # the peer's end reached b's stream
            assert a.is_closed
            with trio.fail_after(5):
                await b.event_closed.wait()
            with pytest.raises(MuxedStreamError):
                await a.open_stream()
            with pytest.raises(MuxedStreamReset):
                await s.write(b"after the end")
    run(main)


# -- a hostile peer ------------------------------------------------------------------------


def test_ping_is_answered_with_its_opaque_value():
    async def main():
        async with hostile_pair() as (tap, conn):
            await tap.session.write(frame(PING, SYN, 0, 0xC0FFEE))
            assert await tap.next_frame() == (PING, ACK, 0, 0xC0FFEE, b"")
            assert not conn.is_closed
    run(main)


def test_our_ping_comes_back_from_a_live_peer_and_times_out_on_a_silent_one():
    async def main():
        async with yamux_pair() as (a, b):
            rtts = [await a.ping(5.0), await b.ping(5.0)]
            assert all(r is not None and 0 <= r < 5.0 for r in rtts)
        async with hostile_pair() as (tap, conn):  # a peer that reads and never answers
            async with trio.open_nursery() as nursery:
                nursery.start_soon(tap.next_frame)
                assert await conn.ping(0.3) is None
            # a pong nobody asked for, and the late one, are ignored
            await tap.session.write(frame(PING, ACK, 0, 12345) + frame(PING, ACK, 0, 1))
            await tap.session.write(frame(PING, SYN, 0, 7))
            assert await tap.next_frame() == (PING, ACK, 0, 7, b"")
            assert not conn.is_closed and conn._pings == {}
    run(main)


def test_ping_over_py_libp2p_yamux_comes_back():
    async def main():
        async with open_host(ident(1)) as ours, open_host(ident(2)) as theirs:
            py_libp2p_yamux(theirs)
            await ours.connect(theirs.addrs[0])
            assert (await ours.ping(theirs.peer_id, 5.0)) is not None
            with pytest.raises(HostError, match="no open connection"):
                await theirs.ping(ident(3).peer_id, 1.0)
    run(main)


@pytest.mark.parametrize("frames", [
    pytest.param([frame(WINDOW_UPDATE, SYN, 1, 0),
                  frame(DATA, 0, 1, 200_000, bytes(200_000)),
                  frame(DATA, 0, 1, 100_000, bytes(100_000))], id="data-beyond-the-window"),
    pytest.param([frame(DATA, SYN, 1, INITIAL_WINDOW + 1)], id="oversized-data-frame"),
    pytest.param([HEADER.pack(1, DATA, SYN, 1, 0)], id="unknown-version"),
    pytest.param([frame(7, 0, 1, 0)], id="unknown-type"),
    pytest.param([frame(WINDOW_UPDATE, SYN, 2, 0)], id="syn-with-the-listeners-parity"),
    pytest.param([frame(WINDOW_UPDATE, SYN, 1, 0), frame(WINDOW_UPDATE, SYN, 1, 0)],
                 id="syn-for-an-open-stream"),
    pytest.param([frame(DATA, 0, 0, 3, b"abc")], id="data-on-stream-0"),
])
def test_a_protocol_breach_ends_the_connection_with_go_away(frames):
    async def main():
        async with hostile_pair() as (tap, conn):
            for f in frames:
                await tap.session.write(f)
            while (got := await tap.next_frame())[0] != GO_AWAY:
                assert got[0] == WINDOW_UPDATE and got[1] == ACK  # the SYN's acceptance
            assert got[3] == GO_AWAY_PROTOCOL_ERROR
            with trio.fail_after(5):
                await conn.event_closed.wait()
    run(main)


def test_unread_data_beyond_the_connection_budget_ends_it(monkeypatch):
    monkeypatch.setattr(yamux, "MAX_BUFFERED", 600_000)

    async def main():
        async with hostile_pair() as (tap, conn):
            for sid in (1, 3, 5):  # each within its own window: 600,000 bytes in all
                await tap.session.write(frame(DATA, SYN, sid, 50_000, bytes(50_000)))
                for _ in range(3):
                    await tap.session.write(frame(DATA, 0, sid, 50_000, bytes(50_000)))
            await tap.session.write(frame(DATA, SYN, 7, 1, b"!"))  # one byte over
            while (got := await tap.next_frame())[0] != GO_AWAY:
                assert got[:2] == (WINDOW_UPDATE, ACK)
            assert got[3] == GO_AWAY_PROTOCOL_ERROR
    run(main)


def test_a_stream_the_peer_never_closes_is_reset_after_the_close_timeout(monkeypatch):
    monkeypatch.setattr(yamux, "CLOSE_TIMEOUT", 0.4)

    async def main():
        async with hostile_pair() as (tap, conn):
            await tap.session.write(frame(WINDOW_UPDATE, SYN, 1, 0))
            stream = await conn.accept_stream()
            await stream.close()
            assert await tap.next_frame() == (WINDOW_UPDATE, ACK, 1, 0, b"")
            assert await tap.next_frame() == (WINDOW_UPDATE, FIN, 1, 0, b"")
            with trio.fail_after(3):
                assert await tap.next_frame() == (WINDOW_UPDATE, RST, 1, 0, b"")
            assert conn.streams == {}
    run(main)


def test_syns_beyond_the_accept_backlog_are_refused_with_rst():
    async def main():
        async with hostile_pair() as (tap, conn):
            extra = 5
            ids = [2 * i + 1 for i in range(ACCEPT_BACKLOG + extra)]
            await tap.session.write(b"".join(frame(WINDOW_UPDATE, SYN, i, 0) for i in ids))
            replies = [await tap.next_frame() for _ in ids]
            assert [(k, f, s) for k, f, s, _, _ in replies] == (
                [(WINDOW_UPDATE, ACK, i) for i in ids[:ACCEPT_BACKLOG]]
                + [(WINDOW_UPDATE, RST, i) for i in ids[ACCEPT_BACKLOG:]])
            assert not conn.is_closed
            assert (await conn.accept_stream()).stream_id == 1
    run(main)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunks=st.lists(st.binary(min_size=0, max_size=3000), min_size=1, max_size=6),
       cuts=st.lists(st.integers(min_value=1, max_value=4000), max_size=8))
def test_frames_split_anywhere_across_noise_messages_arrive_whole(chunks, cuts):
    """The reader reassembles frames however the peer's messages cut them."""
    wire = frame(WINDOW_UPDATE, SYN, 1, 0) + b"".join(
        frame(DATA, 0, 1, len(c), c) for c in chunks) + frame(WINDOW_UPDATE, FIN, 1, 0)

    async def main():
        async with hostile_pair() as (tap, conn):
            pieces, at = [], 0
            for cut in cuts:
                if at < len(wire):
                    pieces.append(wire[at:at + cut])
                    at += cut
            pieces.append(wire[at:])
            for piece in pieces:
                if piece:
                    await tap.session.write(piece)
            stream = await conn.accept_stream()
            assert await read_all(stream) == b"".join(chunks)
    run(main)
