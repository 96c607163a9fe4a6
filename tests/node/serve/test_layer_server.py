"""node.serve.layer_server: automatic placement and rebalancing of served layers (real hosts, SmolLM2)."""

from __future__ import annotations

from contextlib import AsyncExitStack

import trio

from node.clock import now_ms
from node.net.host import open_host
from node.serve.layer_server import LayerServer, ServeConfig
from node.serve.swarm import Announcer
from tests.node.netkit import eventually, ident, run


async def server(stack: AsyncExitStack, n: int, reader, config: ServeConfig, peer=None):
    host = await stack.enter_async_context(open_host(ident(n)))
    nursery = await stack.enter_async_context(trio.open_nursery())
    stack.callback(nursery.cancel_scope.cancel)
    announcer = Announcer(host, now_ms, interval=0.2)
    layer_server = LayerServer(host, ident(n), announcer, now_ms, config, reader=reader)
    announcer.make_announce = layer_server.announce
    await nursery.start(announcer.run)
    if peer is not None:
        await host.connect(peer.addrs[0])
    await nursery.start(layer_server.run)
    return host, layer_server


def span(s: LayerServer) -> tuple[int, int]:
    return s.inference.layers.start, s.inference.layers.stop


def test_auto_placement_takes_the_layers_the_swarm_serves_least(gguf_reader):
    async def main():
        async with AsyncExitStack() as stack:
            h1, first = await server(stack, 1, gguf_reader, ServeConfig(layers=(0, 10)))
            auto = ServeConfig(span_len=10, discover_s=0.5)
            _, second = await server(stack, 2, gguf_reader, auto, h1)
            assert span(second) == (10, 20)  # 10..29 uncovered: the first such window
            _, third = await server(stack, 3, gguf_reader, auto, h1)
            assert span(third) == (20, 30)
            status = third.status()
            assert status["serving"] == [20, 30] and status["throughput"] > 0
    run(main, deadline=90)


def test_an_auto_placed_server_moves_when_the_swarm_is_unbalanced(gguf_reader):
    async def main():
        async with AsyncExitStack() as stack:
            mover_config = ServeConfig(span_len=10, discover_s=0.3, rebalance_s=0.5)
            h1, mover = await server(stack, 1, gguf_reader, mover_config)
            assert span(mover) == (0, 10)  # alone: the first window
            # A second server takes 0..9 too: the mover's layers are now doubly
            # served while 10..29 have nobody, so it moves on.
            await server(stack, 2, gguf_reader, ServeConfig(layers=(0, 10)), h1)
            await eventually(lambda: span(mover) == (10, 20), "the mover to move", limit=30)
    run(main, deadline=90)
