"""The link shaper's own properties, on 127.0.0.1: RTT >= 2 x delay, throughput <= cap.

Bounds only (a slow machine can only add time), never exact times.
"""

from __future__ import annotations

import trio

from tests.node.netns.shaper import Shape, serve_relay


async def _echo(stream: trio.SocketStream) -> None:
    async with stream:
        while data := await stream.receive_some(65536):
            await stream.send_all(data)


async def _sink(stream: trio.SocketStream, got: list[int]) -> None:
    async with stream:
        while data := await stream.receive_some(65536):
            got[0] += len(data)


async def _start(nursery, handler, shape: Shape) -> int:
    """An upstream server with ``handler`` and a relay before it; the relay's port."""
    upstream = await nursery.start(trio.serve_tcp, handler, 0)
    port = upstream[0].socket.getsockname()[1]
    return await nursery.start(serve_relay, ("127.0.0.1", 0), ("127.0.0.1", port), shape)


def test_round_trip_through_the_relay_takes_at_least_twice_the_delay():
    delay = 0.05

    async def main() -> list[float]:
        async with trio.open_nursery() as nursery:
            relay = await _start(nursery, _echo, Shape(delay=delay))
            rtts = []
            async with await trio.open_tcp_stream("127.0.0.1", relay) as s:
                for i in range(5):
                    t0 = trio.current_time()
                    await s.send_all(b"ping %d" % i)
                    assert await s.receive_some(100) == b"ping %d" % i  # echoed intact
                    rtts.append(trio.current_time() - t0)
            nursery.cancel_scope.cancel()
        return rtts

    rtts = trio.run(main)
    assert min(rtts) >= 2 * delay, rtts
    assert max(rtts) < 2 * delay + 2.0, rtts  # delayed, not stuck


def test_throughput_through_the_relay_is_capped_and_nothing_is_lost():
    rate, burst, total = 400_000, 16 * 1024, 12 * 65536  # ~2 s at the cap
    got = [0]

    async def main() -> float:
        async with trio.open_nursery() as nursery:
            relay = await _start(nursery, lambda s: _sink(s, got), Shape(rate=rate, burst=burst))
            t0 = trio.current_time()
            async with await trio.open_tcp_stream("127.0.0.1", relay) as s:
                block = bytes(range(256)) * 256
                for _ in range(total // len(block)):
                    await s.send_all(block)
                await s.send_eof()
                while got[0] < total:
                    await trio.sleep(0.01)
            elapsed = trio.current_time() - t0
            nursery.cancel_scope.cancel()
        return elapsed

    elapsed = trio.run(main)
    assert got[0] == total
    # The bucket lets at most burst + rate * T through in T seconds.
    assert total <= burst + rate * elapsed, (total, elapsed)
    assert elapsed >= (total - burst) / rate * 0.99
    assert elapsed < 30  # and it does flow


def test_an_unreachable_target_closes_the_client_not_the_relay():
    async def main() -> bytes:
        async with trio.open_nursery() as nursery:
            # Port 1 on loopback: nothing listens there, the dial is refused.
            relay = await nursery.start(serve_relay, ("127.0.0.1", 0), ("127.0.0.1", 1), Shape())
            async with await trio.open_tcp_stream("127.0.0.1", relay) as s:
                first = await s.receive_some(10)
            async with await trio.open_tcp_stream("127.0.0.1", relay) as s:  # still serving
                assert await s.receive_some(10) == b""
            nursery.cancel_scope.cancel()
        return first

    assert trio.run(main) == b""
