"""Helpers for tests that run real libp2p hosts on 127.0.0.1."""

from __future__ import annotations

from contextlib import asynccontextmanager
from types import SimpleNamespace

import trio

from node.net.host import PeerIdentity, open_host


def run(main, deadline: float = 20.0) -> None:
    """Run an async test body under a hard deadline, so nothing can hang CI."""
    async def bounded():
        with trio.fail_after(deadline):
            await main()
    trio.run(bounded)


def ident(n: int) -> PeerIdentity:
    """A deterministic peer identity."""
    return PeerIdentity.from_seed(bytes([n]) * 32)


async def eventually(predicate, what: str, limit: float = 10.0) -> None:
    """Poll ``predicate`` every 20 ms until true; fail after ``limit`` seconds."""
    with trio.move_on_after(limit):
        while not predicate():
            await trio.sleep(0.02)
        return
    raise AssertionError(f"timed out waiting for {what}")


@asynccontextmanager
async def chain_node(n: int, chain, clock, *, txs: bool = True, producer_key=None,
                     interval_ms: int | None = None, report=lambda line: None):
    """A host on loopback running a ChainService over ``chain``, with TxGossip
    and a Producer for ``producer_key`` if asked. Yields a namespace:
    ``host``, ``service``, ``txs``, ``producer``."""
    from node.chain.producer import Producer
    from node.chain.sync import ChainService
    from node.chain.txgossip import TxGossip
    from node.wire.sync import BLOCKS_TOPIC, TXS_TOPIC

    async with open_host(ident(n), gossip_topics=[BLOCKS_TOPIC, TXS_TOPIC]) as host:
        async with trio.open_nursery() as nursery:
            parts = SimpleNamespace(host=host, txs=None, producer=None)
            parts.service = await nursery.start(ChainService(chain, host, clock).run)
            if txs:
                parts.txs = await nursery.start(TxGossip(parts.service).run)
            if producer_key is not None:
                parts.producer = await nursery.start(Producer(
                    parts.service, producer_key, clock, interval_ms=interval_ms,
                    report=report).run)
            yield parts
            nursery.cancel_scope.cancel()


async def meshed(topic: str, *pairs) -> None:
    """Wait until, for each (a, b) of hosts, a has b in its mesh of ``topic``."""
    await eventually(lambda: all(b.peer_id in a.mesh_peers(topic) for a, b in pairs),
                     f"the {topic} mesh")
