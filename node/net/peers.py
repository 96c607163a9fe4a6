"""Keeping in touch with peers: joining them, redialling the lost, syncing now and then.

Owns `PeerKeeper` and `AloneWatch`. The keeper dials each address it is
given (a node's ``network.peers`` and the peers of its peer book) with
exponential backoff (an unreachable peer is logged and retried, never
fatal), syncs from it once connected and tells ``seen`` so the address is
kept for the next start; then it watches the peer for as long as the node
runs and redials it whenever it is lost, the wait doubling up to
``REDIAL_CAP_S`` and starting over after each success. Every ``resync_s``
it syncs again from every connected trusted peer, which repairs missed
gossip. What a sync is belongs to the chain (`node.chain.ChainService.sync_from`),
so it comes in as a function and this module knows no chain; nor does it
know where addresses are kept (``seen`` is a function too).

`AloneWatch` says once, loudly, when a node that had peers produces blocks
with none connected (its chain may split from theirs), and once more when
a peer is back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence

import trio
from libp2p.peer.id import ID

from node.net.host import DialError, Host

log = logging.getLogger(__name__)

__all__ = ["REDIAL_CAP_S", "AloneWatch", "PeerKeeper"]

#: ``sync(peer)``: sync the chain from a connected peer; it handles its own failures.
Sync = Callable[[ID], Awaitable[object]]
#: Longest wait between two dials of a lost (or never reached) peer.
REDIAL_CAP_S = 60.0
#: How often a kept peer's connection is looked at.
WATCH_S = 0.5


def _peer_of(addr: str) -> ID | None:
    try:
        return ID.from_base58(addr.rsplit("/p2p/", 1)[1])
    except Exception:
        return None  # `Host.connect` says why, with the address


class PeerKeeper:
    """Joins a node's peers, redials the lost ones and keeps the chain in step.

    Args:
        host: the node's host.
        sync: syncs the chain from one connected peer (never raises for a bad peer).
        peers: full multiaddrs (``.../p2p/<id>``) to join and keep.
        dial_attempts, first_backoff_s: tries of each first dial, the first
            wait (doubled after each failure, up to ``REDIAL_CAP_S``).
        resync_s: seconds between syncs from every connected trusted peer.
        report: gets the lines `pnode start` prints.
        seen: told each address a dial reached (the peer book keeps it).
    """

    def __init__(self, host: Host, sync: Sync, *, peers: Sequence[str], dial_attempts: int,
                 first_backoff_s: float, resync_s: float,
                 report: Callable[[str], None] = lambda line: None,
                 seen: Callable[[str], None] = lambda addr: None) -> None:
        own = str(host.peer_id)
        # One's own address (a peer book shared by a copied data dir) is never dialled.
        self.peers = tuple(dict.fromkeys(p for p in peers if not p.endswith("/p2p/" + own)))
        self.host, self.sync, self.seen = host, sync, seen
        self.dial_attempts, self.first_backoff_s = dial_attempts, first_backoff_s
        self.resync_s, self.report = resync_s, report

    async def join_all(self, done: trio.Event) -> None:
        """Join and keep every peer, concurrently; set ``done`` once each first join ended.

        Runs for as long as the node does (the peers are redialled when lost).
        """
        pending = [len(self.peers)]

        def joined() -> None:
            pending[0] -= 1
            if pending[0] == 0:
                done.set()
        if not self.peers:
            done.set()
        async with trio.open_nursery() as keeps:
            for peer in self.peers:
                keeps.start_soon(self.keep, peer, joined)

    async def join(self, addr: str) -> None:
        """Dial ``addr`` (with backoff) and sync from it once; give up after the last try."""
        peer = await self._dial(addr, self.dial_attempts)
        if peer is not None:
            await self.sync(peer)

    async def keep(self, addr: str, joined: Callable[[], None] = lambda: None) -> None:
        """Join ``addr``, then redial it whenever it is lost, forever; ``joined`` after the first."""
        first, lost_line = True, False
        peer_id = _peer_of(addr)
        # A malformed address or a peer outside the allow-list never becomes dialable:
        # one try (its error logged and reported), then nothing to keep.
        hopeless = peer_id is None or not self.host.is_trusted(peer_id)
        while True:
            peer = await self._dial(addr, 1 if hopeless else self.dial_attempts if first else None)
            if peer is not None:
                if lost_line:
                    self.report(f"reconnected to peer {addr}")
                await self.sync(peer)
            if first:
                first = False
                joined()
            if hopeless:
                return
            while peer_id in self.host.connected_peers():
                await trio.sleep(WATCH_S)
            lost_line = True
            log.info("peer %s not connected; redialling", addr)

    async def _dial(self, addr: str, attempts: int | None) -> ID | None:
        """Connect to ``addr``, retrying with capped doubling waits; ``attempts`` None: forever.

        Returns:
            The peer's id; None after ``attempts`` failed tries (said once in a report line).
        """
        delay, attempt = self.first_backoff_s, 0
        while True:
            attempt += 1
            try:
                peer = await self.host.connect(addr)
            except DialError as exc:
                log.warning("peer %s unreachable (try %d): %s", addr, attempt, exc)
                if attempts == 1:
                    self.report(f"giving up on peer {addr}: {exc}")
                    return None
                if attempts is not None and attempt >= attempts:
                    self.report(f"giving up on peer {addr} for now (redialled every "
                                f"{REDIAL_CAP_S:g} s at most while the node runs)")
                    return None
                await trio.sleep(delay)
                delay = min(delay * 2, REDIAL_CAP_S)
                continue
            self.seen(addr)
            return peer

    async def follow(self) -> None:
        """Sync again from every connected trusted peer every ``resync_s`` (missed gossip)."""
        while True:
            await trio.sleep(self.resync_s)
            for peer in self.host.connected_peers():
                if self.host.is_trusted(peer):
                    await self.sync(peer)


class AloneWatch:
    """Says when a node that had peers produces blocks with none connected.

    Args:
        host: the node's host.
        produced: how many blocks this node has sealed so far.
        report: gets the lines `pnode start` prints.
        now_ms: wall-clock time in ms (for the line's "since").
        every_s: how often to look.
    """

    def __init__(self, host: Host, produced: Callable[[], int], *,
                 report: Callable[[str], None], now_ms: Callable[[], int],
                 every_s: float = 0.5) -> None:
        self.host, self.produced, self.report = host, produced, report
        self.now_ms, self.every_s = now_ms, every_s
        self.had_peers = False  # a node that never had one is a lone devnet, not a split
        self.alone_since: int | None = None  # ms: when the last peer went
        self.mark = 0  # blocks produced by then
        self.warned = False

    def look(self) -> None:
        """One look: note a lost last peer, warn once on a block produced alone."""
        connected = bool(self.host.connected_peers())
        if connected:
            if self.warned:
                self.report(f"peers are back ({len(self.host.connected_peers())} connected) "
                            f"after producing alone since {_utc(self.alone_since)}")
            self.alone_since, self.warned, self.had_peers = None, False, True
            return
        if not self.had_peers and not self.host.connections_made:
            return
        self.had_peers = True
        if self.alone_since is None:
            self.alone_since, self.mark = self.now_ms(), self.produced()
        elif not self.warned and self.produced() > self.mark:
            self.warned = True
            self.report(f"WARNING: producing alone: no peer connected since "
                        f"{_utc(self.alone_since)} (the chain may split)")

    async def run(self) -> None:
        while True:
            self.look()
            await trio.sleep(self.every_s)


def _utc(ms: int | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime((ms or 0) / 1000))
