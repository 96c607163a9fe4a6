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
