"""Who serves what: announcements gossiped, verified, aged, and served on request.

Owns `SwarmView` (the fresh, verified `Announce` of every known server) and
`Announcer`, the node component that keeps it (specs/network.md section 9.2):

- it gossips this node's own announcement on ``pnode/announce/3`` (when the
  node serves layers) as soon as what it says changes, and otherwise every
  ``refresh`` seconds;
- it adds every announcement it hears that verifies, is newer than the one
  held for that peer and is not from too far in the past, and asks each new
  neighbour on the topic for its view;
- an entry expires ``ttl`` seconds after it was last refreshed, and at once
  when a peer that was connected to this node disconnects (a killed server
  drops out of the view within a second, not after its TTL) or stops
  answering pings (a stalled one, within ``interval + ping_timeout``);
- it answers ``/pnode/swarm/3.0.0`` with the view (clients route from it).

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
from ledger.crypto import libp2p_peer_id
from ledger.errors import DecodeError
from node.clock import Clock
from node.net import GossipError, Host, HostError, RequestError
from node.wire import (
    ANNOUNCE_TOPIC, MAX_ANNOUNCES, MAX_SWARM_FRAME, SWARM_PROTOCOL, Announce, SwarmRequest,
    SwarmResponse,
)

log = logging.getLogger(__name__)


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

    def __init__(self, *, ttl: float = 25.0, max_age_ms: int = 30_000,
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

    Gossip carries state, pings carry liveness (specs/network.md section
    9.2): this node's announcement is gossiped when what it says changes
    (span, addresses, price, throughput, or whether it is full) and
    otherwise every ``refresh`` seconds, so an idle swarm is quiet; a
    neighbour's entry is dropped when it disconnects, or stops answering
    pings for ``ping_timeout`` seconds (a stalled process keeps its
    connections open). A neighbour newly on the announce topic is asked for
    its view at once, so a node that joins, or is joined, knows the swarm
    without waiting for a refresh.

    Args:
        host: the running host.
        clock: wall-clock milliseconds (announcement times).
        make_announce: this node's signed announcement now, or None when it
            serves nothing (called every ``interval``).
        view: the view to keep (a new one, with a TTL of 2.5 refreshes, by default).
        interval: seconds between checks (own changes, neighbours joined, gone, pinged).
        refresh: seconds between gossips of an unchanged announcement.
        ping_timeout: seconds a neighbour has to answer a ping.
        allowed: when given, only announcements of these peers are held.
    """

    def __init__(self, host: Host, clock: Clock,
                 make_announce: Callable[[], Announce | None] = lambda: None, *,
                 view: SwarmView | None = None, interval: float = 1.0, refresh: float = 10.0,
                 ping_timeout: float = 3.0, allowed: Collection[ID] | None = None):
        self.host, self.clock, self.make_announce = host, clock, make_announce
        self.view = view or SwarmView(ttl=2.5 * refresh)
        self.interval, self.refresh, self.ping_timeout = interval, refresh, ping_timeout
        self.allowed = None if allowed is None else set(allowed)
        self._said: tuple | None = None  # the gist of the last announcement gossiped
        self._said_at = float("-inf")
        self._connected: set[ID] = set()
        self._pulled: set[ID] = set()  # connected peers on the topic whose views were asked
        self._pinging: set[ID] = set()

    async def run(self, *, task_status: trio.TaskStatus[Announcer] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Serve the view and follow announcements until cancelled."""
        self.host.set_request_handler(SWARM_PROTOCOL, self._serve, max_request_size=64,
                                      public=True)  # clients route from it
        self.host.set_validator(ANNOUNCE_TOPIC, self._validate)  # relay only verified ones
        gossip = self.host.subscribe(ANNOUNCE_TOPIC)
        await self.host.join(ANNOUNCE_TOPIC)
        async with gossip, trio.open_nursery() as nursery:
            nursery.start_soon(self._tick_loop, nursery)
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
        own = None if self.host.stopping else self.make_announce()
        if own is not None:  # a stopped host has no addresses to announce
            await self._gossip(own)

    async def pull(self, peer: ID, timeout: float = 5.0) -> int:
        """Ask ``peer`` for its view and take what verifies; how many were taken.

        Raises:
            RequestError: no answer (a peer without the protocol, or gone).
            DecodeError: the answer is not a `SwarmResponse` (the peer scores a point).
        """
        try:
            announces = await fetch_view(self.host, peer, timeout)
        except DecodeError as exc:
            self.host.penalize(peer, 1, f"undecodable swarm view: {exc}")
            raise
        return sum(self.take(a) for a in announces)

    async def _gossip(self, own: Announce) -> None:
        self.take(own)
        self._said, self._said_at = _gist(own), trio.current_time()
        try:
            await self.host.publish(ANNOUNCE_TOPIC, encode(own))
        except GossipError as exc:
            log.info("announcement not gossiped: %s", exc)

    async def _tick_loop(self, nursery: trio.Nursery) -> None:
        while True:
            own = None if self.host.stopping else self.make_announce()
            if own is not None and (_gist(own) != self._said
                                    or trio.current_time() - self._said_at >= self.refresh):
                await self._gossip(own)
            connected = set(self.host.connected_peers())
            for gone in self._connected - connected:
                self.view.drop(gone)  # disconnected: do not wait for the TTL
            self._connected, self._pulled = connected, self._pulled & connected
            for peer in (self.host.topic_peers(ANNOUNCE_TOPIC) & connected) - self._pulled:
                self._pulled.add(peer)
                nursery.start_soon(self._pull_quietly, peer)
            held = {announce_peer(a) for a in self.fresh()}
            for peer in (connected & held) - self._pinging:
                self._pinging.add(peer)
                nursery.start_soon(self._check_alive, peer)
            await trio.sleep(self.interval)

    async def _pull_quietly(self, peer: ID) -> None:
        try:
            await self.pull(peer)
        except (RequestError, DecodeError) as exc:
            log.debug("no swarm view from %s: %s", peer, exc)

    async def _check_alive(self, peer: ID) -> None:
        """Ping a neighbour held in the view; drop it when no pong comes in time."""
        try:
            if await self.host.ping(peer, self.ping_timeout) is None:
                log.info("peer %s did not answer a ping in %s s: dropped from the view",
                         peer, self.ping_timeout)
                self.view.drop(peer)
        except HostError:
            pass  # the connection went: the tick drops it
        finally:
            self._pinging.discard(peer)

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


def _gist(announce: Announce) -> tuple:
    """What an announcement says that is worth gossiping at once when it changes.

    Not its time, nor its exact load: sessions opening and closing would
    otherwise put a gossip round (a few ms of every node's CPU) into the
    first second of each generation. Whether the server is full is kept.
    """
    return (announce.addrs, announce.model_id, announce.layer_start, announce.layer_end,
            announce.throughput_milli, announce.load >= announce.max_sessions,
            announce.max_sessions, announce.max_chunk_positions, announce.max_session_positions,
            announce.price)


async def fetch_view(host: Host, peer: ID, timeout: float) -> tuple[Announce, ...]:
    """``peer``'s view of the swarm (`SwarmRequest`), unverified.

    Raises:
        RequestError: no answer within ``timeout`` (a peer without the protocol, or gone).
        DecodeError: the answer is not a `SwarmResponse`.
    """
    data = await host.request(peer, SWARM_PROTOCOL, encode(SwarmRequest()), timeout=timeout,
                              max_response_size=MAX_SWARM_FRAME)
    return decode(data, SwarmResponse).announces


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
