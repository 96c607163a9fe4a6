"""Who serves what: announcements gossiped, verified, aged, and served on request.

Owns `SwarmView` (the fresh, verified `Announce` of every known server) and
`Announcer`, the node component that keeps it (specs/network.md section 9.2):

- it gossips this node's own announcement every ``interval`` seconds on
  ``pnode/announce/1`` (when the node serves layers);
- it adds every announcement it hears that verifies, is newer than the one
  held for that peer and is not from too far in the past;
- an entry expires ``ttl`` seconds after it was last refreshed, and at once
  when a peer that was connected to this node disconnects (a killed server
  drops out of the view within a second, not after its TTL);
- it answers ``/pnode/swarm/1.0.0`` with the view (clients route from it).

Attack notes: announcements are signed by the announcing peer's key, so a
relay can neither forge nor alter one; a relay can replay an old one, which is
refused when a newer one is held and otherwise lives only ``ttl`` seconds and
only if signed less than ``max_age_ms`` ago by the server's clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass

import trio
from libp2p.peer.id import ID

from ledger.codec import decode, encode
from ledger.errors import DecodeError
from node.datadir import libp2p_peer_id
from node.host import GossipError, Host
from node.serve_protocol import (
    ANNOUNCE_TOPIC, MAX_ANNOUNCES, MAX_SWARM_FRAME, SWARM_PROTOCOL, Announce, SwarmRequest,
    SwarmResponse,
)

log = logging.getLogger(__name__)
Clock = Callable[[], int]  # wall-clock milliseconds


def announce_peer(announce: Announce) -> ID:
    """The peer id an announcement speaks for (derived from its key)."""
    return ID(libp2p_peer_id(announce.public_key))


@dataclass(slots=True)
class _Entry:
    announce: Announce
    refreshed: float  # trio.current_time() when last refreshed


class SwarmView:
    """The servers this node knows, each by its latest verified announcement.

    Args:
        ttl: seconds an announcement stays fresh without a newer one.
        max_age_ms: refuse announcements signed longer ago than this.
    """

    def __init__(self, *, ttl: float = 4.0, max_age_ms: int = 30_000,
                 max_skew_ms: int = 30_000, max_entries: int = 4096):
        self.ttl, self.max_age_ms, self.max_skew_ms = ttl, max_age_ms, max_skew_ms
        self.max_entries = max_entries
        self._entries: dict[ID, _Entry] = {}

    def acceptable(self, announce: Announce, now_ms: int) -> bool:
        """Signed, well formed, and signed within ``max_age_ms`` (or ``max_skew_ms`` ahead).

        A future time is refused as well as an old one: held, it would
        block the server's own correct announcements until the clock caught up.
        """
        return (now_ms - self.max_age_ms <= announce.time_ms <= now_ms + self.max_skew_ms
                and announce.max_sessions >= 1 and announce.verified())

    def add(self, announce: Announce, now: float, now_ms: int) -> bool:
        """Hold ``announce`` if it is acceptable and newer; True when it was taken."""
        if not self.acceptable(announce, now_ms):
            return False
        peer = announce_peer(announce)
        held = self._entries.get(peer)
        if held is not None and held.announce.time_ms >= announce.time_ms:
            return False
        if held is None and len(self._entries) >= self.max_entries:
            self.fresh(now)  # expire first; then make room by the stalest entry
            if len(self._entries) >= self.max_entries:
                stalest = min(self._entries, key=lambda p: self._entries[p].refreshed)
                del self._entries[stalest]
        self._entries[peer] = _Entry(announce, now)
        return True

    def drop(self, peer: ID) -> None:
        self._entries.pop(peer, None)

    def fresh(self, now: float) -> list[Announce]:
        """The announcements refreshed within ``ttl``, by peer id (expired ones are dropped)."""
        for peer in [p for p, e in self._entries.items() if now - e.refreshed > self.ttl]:
            del self._entries[peer]
        return [self._entries[p].announce for p in sorted(self._entries, key=str)]


class Announcer:
    """Keeps a `SwarmView` from gossip and serves it; announces this node.

    Args:
        host: the running host.
        clock: wall-clock milliseconds (announcement times).
        make_announce: this node's signed announcement now, or None when it
            serves nothing (called every ``interval``).
        view: the view to keep (a new one by default).
        interval: seconds between own announcements.
        allowed: when given, only announcements of these peers are held.
    """

    def __init__(self, host: Host, clock: Clock,
                 make_announce: Callable[[], Announce | None] = lambda: None, *,
                 view: SwarmView | None = None, interval: float = 1.0,
                 allowed: Collection[ID] | None = None):
        self.host, self.clock, self.make_announce = host, clock, make_announce
        self.view = view or SwarmView()
        self.interval = interval
        self.allowed = None if allowed is None else set(allowed)

    async def run(self, *, task_status: trio.TaskStatus[Announcer] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Serve the view and follow announcements until cancelled."""
        self.host.set_request_handler(SWARM_PROTOCOL, self._serve, max_request_size=64,
                                      public=True)  # clients route from it
        self.host.set_validator(ANNOUNCE_TOPIC, self._validate)  # relay only verified ones
        gossip = self.host.subscribe(ANNOUNCE_TOPIC)
        await self.host.join(ANNOUNCE_TOPIC)
        async with gossip, trio.open_nursery() as nursery:
            nursery.start_soon(self._announce_loop)
            task_status.started(self)
            async for origin, data in gossip:
                self._on_gossip(origin, data)
            nursery.cancel_scope.cancel()

    def take(self, announce: Announce) -> bool:
        """Add an announcement heard from anywhere (gossip, a swarm response)."""
        peer = announce_peer(announce)
        if self.allowed is not None and peer not in self.allowed and peer != self.host.peer_id:
            return False
        return self.view.add(announce, trio.current_time(), self.clock())

    def fresh(self) -> list[Announce]:
        return self.view.fresh(trio.current_time())

    async def announce_now(self) -> None:
        """Gossip (and hold) this node's announcement now, if it serves anything."""
        if self.host.stopping:  # a stopped host has no addresses to announce
            return
        own = self.make_announce()
        if own is None:
            return
        self.take(own)
        try:
            await self.host.publish(ANNOUNCE_TOPIC, encode(own))
        except GossipError as exc:
            log.info("announcement not gossiped: %s", exc)

    async def _announce_loop(self) -> None:
        connected: set[ID] = set()
        while True:
            await self.announce_now()
            now_connected = set(self.host.connected_peers())
            for gone in connected - now_connected:
                self.view.drop(gone)  # disconnected: do not wait for the TTL
            connected = now_connected
            await trio.sleep(self.interval)

    async def _validate(self, origin: ID, data: bytes, forwarder: ID) -> bool:
        """Gossip validator: relay and deliver only acceptable announcements.

        A bad one scores the forwarder: gossipsub validates before relaying,
        so an honest neighbour never forwards one.
        """
        try:
            announce = decode(data, Announce)
        except DecodeError as exc:
            self.host.penalize(forwarder, 1, f"undecodable announcement: {exc}")
            return False
        if not announce.verified():
            self.host.penalize(forwarder, 1, "announcement with a bad signature")
            return False
        return self.view.acceptable(announce, self.clock())  # too old or ahead: drop, unscored

    def _on_gossip(self, origin: ID, data: bytes) -> None:
        # Decoded again, never trusted: py-libp2p remembers validation verdicts
        # longer than the messages it has seen, so a repeated (from_id, seqno)
        # may skip the validator with other bytes.
        try:
            self.take(decode(data, Announce))
        except DecodeError as exc:
            self.host.penalize(origin, 1, f"undecodable announcement: {exc}")

    async def _serve(self, peer: ID, request: bytes) -> bytes:
        decode(request, SwarmRequest)  # anything else: reset and scored by the host
        return encode_swarm_response(self.fresh(), set(self.host.connected_peers())
                                     | {self.host.peer_id})


def encode_swarm_response(announces: list[Announce], preferred: set[ID]) -> bytes:
    """A `SwarmResponse` within its limits (512 entries, `MAX_SWARM_FRAME` bytes).

    When the view holds more, announcements of ``preferred`` peers (this node
    and its connections: proven alive) go first, then the most recent: a flood
    of throwaway announcements cannot push live servers out of the answer.
    """
    ranked = sorted(announces, key=lambda a: (announce_peer(a) not in preferred, -a.time_ms))
    chosen, size = [], 16
    for a in ranked[:MAX_ANNOUNCES]:
        n = len(encode(a))
        if size + n > MAX_SWARM_FRAME:
            break
        chosen.append(a)
        size += n
    return encode(SwarmResponse(tuple(chosen)))
