"""The client's view of the swarm: who serves what, where, and who to avoid.

Owns `SwarmDirectory`, what a client knows of the servers of one model
(after Petals' sequence manager): the signed announcements it gathered from
its peers (`SwarmResponse`, specs/network.md section 9.4), the round trip it
measured to each, the peers it excluded for the generation under way, the
trusted peers (an allow-list) and the announced addresses of each server.
From these it plans routes (`wallet.route.plan_route`). It opens no
inference session: `wallet.session` does, asking the directory whom to use.
"""

from __future__ import annotations

import time
from collections.abc import Collection

import trio

from ledger.errors import DecodeError
from node.clock import now_ms
from node.net import DialError, Host, RequestError
from node.serve import SwarmView, announce_peer, fetch_view
from node.wire import Announce, ServerInfo, SpanError
from wallet.errors import RemoteError
from wallet.route import Hop, plan_route


class SwarmDirectory:
    """The servers of one model as this client sees them, and the routes over them.

    Args:
        host: the client's running libp2p host (asks its peers for their views).
        model_id: the id servers must serve (`compute.gguf.model_id`).
        trusted: when given, the only peer ids (base58) routed through.
    """

    def __init__(self, host: Host, model_id: str, *, trusted: Collection[str] | None = None):
        self.host, self.model_id = host, model_id
        self.trusted = None if trusted is None else set(trusted)
        self.view = SwarmView(ttl=3600.0)  # refreshed on demand, not by gossip
        self.rtt: dict[str, float] = {}
        self.dead: set[str] = set()

    # -- discovery --------------------------------------------------------------------

    async def discover(self, peers: Collection[str]) -> list[Announce]:
        """Dial ``peers`` and gather their views of the swarm.

        Args:
            peers: multiaddrs of peers to ask (not necessarily servers).

        Returns:
            The fresh announcements now known, of every model.

        Raises:
            RemoteError: none of the peers could be reached.
        """
        errors = []
        for addr in peers:
            try:
                await self.host.connect(addr)
            except DialError as exc:
                errors.append(str(exc))
        if len(errors) == len(peers):
            raise RemoteError("no peer reachable: " + "; ".join(errors))
        await self.refresh()
        return self.view.fresh(trio.current_time())

    async def refresh(self) -> None:
        """Ask every connected peer for its view; time each ask as that peer's RTT."""
        for peer in self.host.connected_peers():
            if str(peer) in self.dead:
                continue  # a stalled server would cost a timeout per failover
            began = time.perf_counter()
            try:
                announces = await fetch_view(self.host, peer, timeout=5.0)
            except (RequestError, DecodeError):
                continue  # not a serving node, or gone: other peers may know
            self.rtt[str(peer)] = time.perf_counter() - began
            now, wall_ms = trio.current_time(), now_ms()
            for announce in announces:
                self.view.add(announce, now, wall_ms)

    # -- what is known ----------------------------------------------------------------

    def servers(self) -> list[ServerInfo]:
        """The known servers of this model, as the route planner sees them."""
        out = []
        for a in self.view.fresh(trio.current_time()):
            if a.model_id != self.model_id:
                continue
            try:  # one odd announcement must not take every route down with it
                out.append(ServerInfo.from_announce(a, str(announce_peer(a))))
            except SpanError:
                continue
        return out

    def throughput(self, peer_id: str) -> float:
        """The announced tokens/s of a server (a slow default when unknown)."""
        return next((s.throughput for s in self.servers() if s.peer_id == peer_id), 1.0)

    def announced_full(self, start: int, end: int) -> bool:
        """Whether some usable server covering part of [start, end) announced itself full."""
        return any(s.load >= s.max_sessions and s.start < end and start < s.end
                   and s.peer_id not in self.dead for s in self.servers())

    def addrs(self, peer_id: str) -> tuple[str, ...]:
        """The announced addresses of ``peer_id`` that name that same peer.

        An address ending in another peer's ``/p2p/`` id is dropped: a server
        cannot send the client (or the next hop) to someone else.

        Returns:
            The addresses, in announced order; () when ``peer_id`` is unknown.
        """
        for a in self.view.fresh(trio.current_time()):
            if str(announce_peer(a)) == peer_id:
                return tuple(addr for addr in a.addrs if addr.endswith(f"/p2p/{peer_id}"))
        return ()

    # -- exclusion --------------------------------------------------------------------

    def exclude(self, peer_id: str) -> None:
        """Route no more through ``peer_id`` (it failed) until `clear_exclusions`."""
        self.dead.add(peer_id)

    def clear_exclusions(self) -> None:
        """Forget the excluded peers: a new generation tries every server again."""
        self.dead = set()

    # -- routes -----------------------------------------------------------------------

    def plan(self, start: int, end: int, also_exclude: Collection[str] = ()) -> list[Hop]:
        """The cheapest route over [start, end) avoiding excluded (and ``also_exclude``) servers.

        Args:
            start, end: the layers to cover.
            also_exclude: peers to avoid for this plan only (e.g. busy ones).

        Returns:
            The hops, as `wallet.route.plan_route` chooses them.

        Raises:
            NoRoute: the usable servers do not cover the span.
        """
        return plan_route(self.servers(), start, end, rtt=self.rtt,
                          exclude=self.dead | set(also_exclude), allowed=self.trusted)
