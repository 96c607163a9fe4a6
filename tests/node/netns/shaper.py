"""A user-space link shaper: a trio TCP relay that delays and rate-limits (test code).

`tc netem` is missing from this kernel, so a link between two network namespaces is
given its round-trip time and bandwidth by a relay instead. It is wired like this:

    node A  --dials-->  relay (LISTEN: an address in some namespace)  --dials-->  node B

Node A is told the relay's address in place of B's (``--peers /ip4/RELAY/tcp/PORT/p2p/B``:
the peer id is B's, so libp2p's handshake still authenticates B end to end). Every
connection accepted on LISTEN opens one to TARGET; each direction then runs its own
pipe: a reader stamps each chunk with its arrival time, a writer holds it until
``arrival + delay`` and then spends tokens for it from a bucket refilled at ``rate``
bytes/s (capacity ``burst``). So one way costs at least ``delay``, a round trip at
least ``2 * delay``, and over any interval T a direction carries at most
``burst + rate * T`` bytes. A bounded channel between reader and writer gives
back-pressure, as a real link's queue would.

Run it in-process (`serve_relay` under a trio nursery) or as a process inside a
namespace: ``ip netns exec NS python -m tests.node.netns.shaper --listen IP:PORT
--target IP:PORT --delay-ms 50 --rate 12500000``.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import trio

CHUNK = 16 * 1024
QUEUE = 64  # chunks in flight per direction (a link's buffer)


@dataclass(frozen=True, slots=True)
class Shape:
    """One link's shape, the same both ways.

    Args:
        delay: one-way latency in seconds (RTT is twice this, plus the real link's).
        rate: bytes per second each way; ``math.inf`` for no cap.
        burst: the token bucket's capacity in bytes (what may go at once after a pause).
    """

    delay: float = 0.0
    rate: float = math.inf
    burst: int = 64 * 1024


class TokenBucket:
    """Tokens refilled at ``rate`` per second up to ``burst``; `take` waits for enough."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.tokens, self.stamp = float(burst), trio.current_time()

    async def take(self, n: int) -> None:
        """Wait until ``n`` (at most ``burst``) tokens are there, then spend them."""
        if math.isinf(self.rate):
            return
        while True:
            now = trio.current_time()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if self.tokens >= n:
                self.tokens -= n
                return
            await trio.sleep((n - self.tokens) / self.rate)


async def _pipe(src: trio.SocketStream, dst: trio.SocketStream, shape: Shape) -> None:
    """Carry src to dst, each chunk held ``delay`` and paced by the bucket; EOF is passed on."""
    send, recv = trio.open_memory_channel(QUEUE)
    # Chunks no bigger than the bucket, or `take` could never be satisfied.
    size = max(1, min(CHUNK, shape.burst))

    async def reader() -> None:
        async with send:
            while data := await src.receive_some(size):
                await send.send((trio.current_time() + shape.delay, data))

    async def writer() -> None:
        bucket = TokenBucket(shape.rate, shape.burst)
        async with recv:
            async for due, data in recv:
                await trio.sleep_until(due)
                await bucket.take(len(data))
                await dst.send_all(data)
        try:
            await dst.send_eof()
        except trio.ClosedResourceError:
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        nursery.start_soon(writer)


async def _relay_one(client: trio.SocketStream, target: tuple[str, int], shape: Shape) -> None:
    """One accepted connection: dial the target and pipe both ways until both are done."""
    try:
        upstream = await trio.open_tcp_stream(*target)
    except OSError:
        await client.aclose()  # the far end is down: so is this connection
        return
    try:
        async with client, upstream, trio.open_nursery() as nursery:
            nursery.start_soon(_pipe, client, upstream, shape)
            nursery.start_soon(_pipe, upstream, client, shape)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass  # a reset on either side ends this connection only


async def serve_relay(listen: tuple[str, int], target: tuple[str, int], shape: Shape,
                      *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Accept on ``listen`` forever, relaying each connection to ``target`` shaped.

    Args:
        listen: (host, port) to listen on; port 0 takes any free one.
        target: (host, port) each accepted connection is forwarded to.
        shape: the delay and rate applied to each direction.

    Returns:
        Never; reports the bound port through ``task_status.started(port)``.
    """
    listeners = await trio.open_tcp_listeners(listen[1], host=listen[0])
    task_status.started(listeners[0].socket.getsockname()[1])

    async def handler(stream: trio.SocketStream) -> None:
        await _relay_one(stream, target, shape)

    await trio.serve_listeners(handler, listeners)


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> None:
    """``python -m tests.node.netns.shaper --listen H:P --target H:P [--delay-ms] [--rate]``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", type=_hostport, required=True)
    ap.add_argument("--target", type=_hostport, required=True)
    ap.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay")
    ap.add_argument("--rate", type=float, default=math.inf, help="bytes/s each way")
    ap.add_argument("--burst", type=int, default=64 * 1024)
    a = ap.parse_args(argv)
    trio.run(serve_relay, a.listen, a.target, Shape(a.delay_ms / 1000, a.rate, a.burst))


if __name__ == "__main__":
    main()
