"""node.net.framing over an in-memory stream that hands bytes out in small pieces.

The fake stream stands in for the transport only to force partial reads and
exact EOF positions; framing over a real libp2p stream is in test_host.py.
"""

from __future__ import annotations

import struct

import pytest
import trio
import trio.testing
from hypothesis import given, settings, strategies as st
from libp2p.network.stream.exceptions import StreamEOF, StreamReset

from node.errors import NodeError
from node.net.framing import (
    MIN_TRANSFER_RATE, FrameEOF, FrameReader, FrameStreamError, FrameTimeout, FrameTooLarge,
    FrameTruncated, FramingError, frame_deadline, iter_frames, read_frame, write_frame,
)

DEADLINE = 5.0


class FakeStream:
    """read(n) returns at most ``piece`` bytes; at the end raises StreamEOF (as libp2p).

    ``stall``: once the data is used up, block forever instead of ending.
    ``eof_empty``: signal the end with b"" instead of raising.
    """

    def __init__(self, data: bytes = b"", *, piece: int = 3, stall: bool = False,
                 eof_empty: bool = False, fail: Exception | None = None):
        self.data = bytearray(data)
        self.piece = piece
        self.stall = stall
        self.eof_empty = eof_empty
        self.fail = fail
        self.written = bytearray()
        self.reads: list[int] = []
        self.closed = False

    async def read(self, n: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        self.reads.append(n or -1)
        if self.fail is not None:
            raise self.fail
        if not self.data:
            if self.stall:
                await trio.sleep_forever()
            if self.eof_empty:
                return b""
            raise StreamEOF()
        take = min(self.piece, n if n is not None and n >= 0 else len(self.data))
        out = bytes(self.data[:take])
        del self.data[:take]
        return out

    async def write(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        if self.fail is not None:
            raise self.fail
        self.written += data

    async def close(self) -> None:
        self.closed = True


def run(fn, *args):
    async def main():
        with trio.fail_after(DEADLINE):
            return await fn(*args)
    return trio.run(main)


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def test_errors_sit_under_node_error():
    for cls in (FrameEOF, FrameTruncated, FrameTooLarge, FrameTimeout, FrameStreamError):
        assert issubclass(cls, FramingError) and issubclass(cls, NodeError)


@pytest.mark.parametrize("payload", [b"", b"x", b"hello world", bytes(range(256)) * 40])
@pytest.mark.parametrize("piece", [1, 3, 4096])
def test_round_trip_through_partial_reads(payload, piece):
    async def go():
        out = FakeStream()
        await write_frame(out, payload)
        assert bytes(out.written) == frame(payload)
        return await read_frame(FakeStream(bytes(out.written), piece=piece), 1 << 20)
    assert run(go) == payload


def test_two_frames_back_to_back_then_clean_eof():
    async def go():
        s = FakeStream(frame(b"one") + frame(b"") + frame(b"three"), piece=2)
        got = [await read_frame(s, 100), await read_frame(s, 100), await read_frame(s, 100)]
        with pytest.raises(FrameEOF):
            await read_frame(s, 100)
        return got
    assert run(go) == [b"one", b"", b"three"]


def test_iter_frames_stops_at_clean_eof():
    async def go():
        s = FakeStream(b"".join(frame(bytes([i]) * i) for i in range(5)), piece=1)
        return [p async for p in iter_frames(s, 100)]
    assert run(go) == [bytes([i]) * i for i in range(5)]


def test_empty_read_counts_as_eof_too():
    async def go():
        with pytest.raises(FrameEOF):
            await read_frame(FakeStream(b"", eof_empty=True), 10)
        with pytest.raises(FrameTruncated):
            await read_frame(FakeStream(frame(b"abcdef")[:7], eof_empty=True), 10)
    run(go)


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_eof_inside_the_length_prefix_is_truncation(cut):
    async def go():
        with pytest.raises(FrameTruncated) as err:
            await read_frame(FakeStream(frame(b"abc")[:cut], piece=1), 10)
        assert (err.value.expected, err.value.received) == (4, cut)
    run(go)


def test_eof_inside_the_body_is_truncation():
    async def go():
        with pytest.raises(FrameTruncated) as err:
            await read_frame(FakeStream(frame(b"0123456789")[:9], piece=2), 100)
        assert (err.value.expected, err.value.received) == (10, 5)
    run(go)


def test_oversize_prefix_is_refused_before_reading_the_body():
    async def go():
        s = FakeStream(struct.pack(">I", 2**32 - 1) + b"junk" * 10, piece=4)
        with pytest.raises(FrameTooLarge) as err:
            await read_frame(s, 1024)
        assert (err.value.size, err.value.max_size) == (2**32 - 1, 1024)
        assert s.reads == [4]  # only the prefix was read
        assert len(s.data) == 40  # not one body byte consumed
    run(go)


def test_limit_is_inclusive():
    async def go():
        assert await read_frame(FakeStream(frame(b"x" * 16), piece=5), 16) == b"x" * 16
        with pytest.raises(FrameTooLarge):
            await read_frame(FakeStream(frame(b"x" * 17)), 16)
    run(go)


def test_reads_are_bounded_by_what_is_still_needed():
    async def go():
        s = FakeStream(frame(b"a" * 10) + frame(b"b"), piece=1000)
        assert await read_frame(s, 100) == b"a" * 10
        assert s.reads == [4, 10]  # never asks past the frame
        assert await read_frame(s, 100) == b"b"
    run(go)


def test_write_refuses_oversize_payload():
    async def go():
        s = FakeStream()
        with pytest.raises(FrameTooLarge):
            await write_frame(s, b"x" * 11, max_size=10)
        assert s.written == b""
    run(go)


def test_timeout_on_a_stalled_body():
    async def go():
        s = FakeStream(frame(b"abcdef")[:6], stall=True)
        t0 = trio.current_time()
        with pytest.raises(FrameTimeout):
            await read_frame(s, 100, timeout=0.2)
        assert trio.current_time() - t0 < 2
    run(go)


def test_timeout_on_no_frame_at_all():
    async def go():
        with pytest.raises(FrameTimeout):
            await read_frame(FakeStream(b"", stall=True), 100, timeout=0.1)
    run(go)


def test_timeout_does_not_fire_on_a_prompt_frame():
    async def go():
        return await read_frame(FakeStream(frame(b"ok"), piece=1), 100, timeout=1.0)
    assert run(go) == b"ok"


class SlowStream(FakeStream):
    """A FakeStream whose every read and write takes ``delay`` s (of a mock clock)."""

    def __init__(self, data: bytes = b"", *, piece: int, delay: float, **kw):
        super().__init__(data, piece=piece, **kw)
        self.delay = delay

    async def read(self, n: int | None = None) -> bytes:
        await trio.sleep(self.delay)
        return await super().read(n)

    async def write(self, data: bytes) -> None:
        for i in range(0, len(data), self.piece):
            await trio.sleep(self.delay)
            await super().write(data[i:i + self.piece])


def on_mock_clock(fn):
    """Run ``fn`` where sleeps take no wall time (timing without wall-clock waits)."""
    return trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


MIB = 1 << 20


@pytest.mark.parametrize("reader", ["read_frame", "FrameReader"])
def test_the_time_limit_scales_with_the_announced_size(reader):
    assert MIN_TRANSFER_RATE == MIB and frame_deadline(2.0, 3 * MIB) == 5.0
    payload = bytes(range(256)) * (8 * MIB // 256)  # 8 MiB: 1 s + 8 s at the least rate

    async def read(stream):
        if reader == "FrameReader":
            return await FrameReader(stream).read_frame(16 * MIB, timeout=1.0)
        return await read_frame(stream, 16 * MIB, timeout=1.0)

    async def go():
        # 1.6 MiB/s: 5 s, five times the base, but within 1 + 8 s: it arrives.
        t0 = trio.current_time()
        assert await read(SlowStream(frame(payload), piece=64 * 1024, delay=1 / 25.6)) == payload
        assert 4.9 < trio.current_time() - t0 < 9.0
        # 0.8 MiB/s, under the least rate: cut at 1 + 8 s.
        with pytest.raises(FrameTimeout, match="8388608 bytes within 9.0 s"):
            await read(SlowStream(frame(payload), piece=64 * 1024, delay=1 / 12.8))
        assert trio.current_time() - t0 == pytest.approx(5.0 + 9.0, abs=0.1)
        # The prefix itself gets the base only (what arrives says nothing of its size).
        with pytest.raises(FrameTimeout, match="no frame began within 1.0 s"):
            await read(FakeStream(b"", stall=True))
    on_mock_clock(go)


def test_the_write_limit_scales_with_the_size():
    payload = b"x" * (4 * MIB)

    async def go():
        s = SlowStream(piece=64 * 1024, delay=1 / 32)  # 2 MiB/s: 2 s, in 1 + 4 s
        await write_frame(s, payload, timeout=1.0)
        assert bytes(s.written) == frame(payload)
        with pytest.raises(FrameTimeout, match="over 5.0 s"):  # 0.5 MiB/s: 8 s
            await write_frame(SlowStream(piece=64 * 1024, delay=1 / 8), payload, timeout=1.0)
    on_mock_clock(go)


def test_reset_stream_is_a_stream_error():
    async def go():
        with pytest.raises(FrameStreamError):
            await read_frame(FakeStream(fail=StreamReset()), 100)
        with pytest.raises(FrameStreamError):
            await write_frame(FakeStream(fail=StreamReset()), b"x")
    run(go)


def test_a_stream_returning_more_than_asked_is_refused():
    class Greedy(FakeStream):
        async def read(self, n=None):
            await trio.lowlevel.checkpoint()
            return b"\x00\x00\x00\x01" + b"extra"

    async def go():
        with pytest.raises(FrameStreamError):
            await read_frame(Greedy(), 100)
    run(go)


# -- FrameReader: many frames, few reads -------------------------------------------


def framed(*payloads: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(p)) + p for p in payloads)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=8), st.integers(1, 64))
def test_frame_reader_returns_what_read_frame_returns(payloads, piece):
    from node.net.framing import FrameReader

    async def both():
        reader = FrameReader(FakeStream(framed(*payloads), piece=piece))
        got = [await reader.read_frame() for _ in payloads]
        with pytest.raises(FrameEOF):
            await reader.read_frame()
        return got
    assert run(both) == payloads


def test_frame_reader_reads_a_whole_frame_in_one_read_when_it_has_arrived():
    from node.net.framing import FrameReader

    stream = FakeStream(framed(b"a" * 100, b"b" * 50), piece=10_000)

    async def go():
        reader = FrameReader(stream)
        return [await reader.read_frame(), await reader.read_frame()]
    assert run(go) == [b"a" * 100, b"b" * 50]
    assert len(stream.reads) == 1  # both frames came with the first read


@pytest.mark.parametrize("data, error", [
    (struct.pack(">I", 10) + b"abc", FrameTruncated),
    (b"\x00\x00", FrameTruncated),
    (struct.pack(">I", 2**31), FrameTooLarge),
])
def test_frame_reader_refuses_what_read_frame_refuses(data, error):
    from node.net.framing import FrameReader

    async def go():
        return await FrameReader(FakeStream(data)).read_frame(1024)
    with pytest.raises(error):
        run(go)
