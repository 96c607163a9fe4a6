"""Helpers for tests that run real libp2p hosts on 127.0.0.1."""

from __future__ import annotations

import trio

from node.host import PeerIdentity


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
