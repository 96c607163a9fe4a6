"""Keeping in touch with peers: joining the configured ones, syncing again now and then.

Owns `PeerKeeper`. It dials each of a node's ``network.peers`` with
exponential backoff (an unreachable peer is logged and retried, never
fatal) and syncs from it once connected; then, every ``resync_s``, it syncs
again from every connected trusted peer, which repairs missed gossip. What
a sync is belongs to the chain (`node.chain.ChainService.sync_from`), so
it comes in as a function and this module knows no chain.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import trio
from libp2p.peer.id import ID

from node.net.host import DialError, Host

log = logging.getLogger(__name__)

__all__ = ["PeerKeeper"]

#: ``sync(peer)``: sync the chain from a connected peer; it handles its own failures.
Sync = Callable[[ID], Awaitable[object]]


class PeerKeeper:
    """Joins a node's peers and keeps its chain in step with theirs.

    Args:
        host: the node's host.
        sync: syncs the chain from one connected peer (never raises for a bad peer).
        peers: full multiaddrs (``.../p2p/<id>``) to join.
        dial_attempts, first_backoff_s: retries of each dial, the first wait
            (doubled after each failure).
        resync_s: seconds between syncs from every connected trusted peer.
        report: gets the lines `pnode start` prints.
    """

    def __init__(self, host: Host, sync: Sync, *, peers: Sequence[str], dial_attempts: int,
                 first_backoff_s: float, resync_s: float,
                 report: Callable[[str], None] = lambda line: None) -> None:
        self.host, self.sync, self.peers = host, sync, tuple(peers)
        self.dial_attempts, self.first_backoff_s = dial_attempts, first_backoff_s
        self.resync_s, self.report = resync_s, report

    async def join_all(self, done: trio.Event) -> None:
        """Join every peer (dial and first sync), concurrently; then set ``done``."""
        try:
            async with trio.open_nursery() as joins:
                for peer in self.peers:
                    joins.start_soon(self.join, peer)
        finally:
            done.set()

    async def join(self, addr: str) -> None:
        """Dial ``addr`` (with backoff) and sync from it once; give up after the last try."""
        delay = self.first_backoff_s
        for attempt in range(1, self.dial_attempts + 1):
            try:
                peer = await self.host.connect(addr)
                break
            except DialError as exc:
                log.warning("peer %s unreachable (try %d of %d): %s",
                            addr, attempt, self.dial_attempts, exc)
                if attempt == self.dial_attempts:
                    self.report(f"giving up on peer {addr}")
                    return
                await trio.sleep(delay)
                delay *= 2
        await self.sync(peer)

    async def follow(self) -> None:
        """Sync again from every connected trusted peer every ``resync_s`` (missed gossip)."""
        while True:
            await trio.sleep(self.resync_s)
            for peer in self.host.connected_peers():
                if self.host.is_trusted(peer):
                    await self.sync(peer)
