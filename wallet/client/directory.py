"""The client's view of the swarm: who serves what, where, and who to avoid.

Owns `SwarmDirectory`, what a client knows of the servers of one model
(after Petals' sequence manager): the signed announcements it gathered from
its peers (`SwarmResponse`, specs/network.md section 9.4), the round trip it
measured to each, the peers it excluded for the generation under way, the
trusted peers (an allow-list), the registered peers (the chain's bonded
nodes) and the announced addresses of each server. From these it plans
routes (`wallet.client.route.plan_route`). It opens no inference session:
`wallet.client.session` does, asking the directory whom to use.

Attack note: anyone can run a libp2p host, announce every layer with a huge
throughput and answer garbage; the cheapest route would run through it. So
by default (`pwallet infer`) a client routes only through servers whose peer
id a registered, bonded node bound on the chain the client follows (the peer
key signed that binding, specs/ledger.md section 4.1): a server it routes
through has a bond at stake and a known account. The peer id of an
announcement is that of the key that signed it (`announce_peer`), so a
server cannot pass for a registered peer.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from collections import deque
from collections.abc import Collection, Mapping

import trio

from ledger.errors import DecodeError
from node.clock import now_ms
from node.net import DialError, Host, RequestError
from node.serve import SwarmView, announce_peer, fetch_view
from node.wire import Announce, ServerInfo, SpanError
from wallet.errors import NoRoute, RemoteError, TooExpensive
from wallet.client.route import Hop, cap_throughput, plan_route

#: Recent decode steps per server whose median is its measured speed.
MEASURED_STEPS = 8


class SwarmDirectory:
    """The servers of one model as this client sees them, and the routes over them.

    Args:
        host: the client's running libp2p host (asks its peers for their views).
        model_id: the id servers must serve (`compute.gguf.model_id`).
        trusted: when given, the only peer ids (base58) routed through.
        registered: when given, the peer ids (base58) of the nodes registered
            and bonded on the client's chain (the values, e.g.
            `wallet.registry.RegisteredNode`, are not read here): the
            directory keeps no other server. None: every server (a private
            swarm). Both filters apply when both are given.
        max_price: route only through servers asking at most this, in base
            units per position per layer (0: free servers only).
    """

    def __init__(self, host: Host, model_id: str, *, trusted: Collection[str] | None = None,
                 registered: Mapping[str, object] | None = None, max_price: int = 0):
        self.host, self.model_id, self.max_price = host, model_id, max_price
        self.trusted = None if trusted is None else set(trusted)
        self.registered = None if registered is None else frozenset(registered)
        self.view = SwarmView(ttl=3600.0)  # refreshed on demand, not by gossip
        self.rtt: dict[str, float] = {}
        self.dead: set[str] = set()
        self.banned: set[str] = set()  # lost a spot check: never again (`ban`)
        # Seconds per layer of each peer's recent decode steps, as this client timed them.
        self.step_times: dict[str, deque[float]] = {}

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
        """The known servers of this model that are registered (when that is asked) and ask
        at most ``max_price``.

        Returns:
            The servers as the route planner sees them.
        """
        return [s for s in self.announced()
                if self.is_registered(s.peer_id) and s.price <= self.max_price]

    def server_map(self) -> dict[str, ServerInfo]:
        """`servers`, by peer id."""
        return {s.peer_id: s for s in self.servers()}

    def is_registered(self, peer_id: str) -> bool:
        """Whether ``peer_id`` may serve: registered on the chain, or no chain is checked."""
        return self.registered is None or peer_id in self.registered

    def announced(self) -> list[ServerInfo]:
        """Every known server of this model, registered or not."""
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
        """The tokens/s of a server: announced, capped by what this client measured.

        A slow default when unknown.
        """
        return next((s.throughput for s in cap_throughput(self.servers(), self.measured())
                     if s.peer_id == peer_id), 1.0)

    def record_step(self, peer_id: str, layers: int, seconds: float) -> None:
        """Note that a one-position step through ``layers`` of ``peer_id`` took ``seconds``.

        The round trip (measured at discovery) is taken off; the last
        `MEASURED_STEPS` are kept.
        """
        compute = max(seconds - self.rtt.get(peer_id, 0.0), 1e-6)
        self.step_times.setdefault(peer_id, deque(maxlen=MEASURED_STEPS)).append(
            compute / max(layers, 1))

    def measured(self) -> dict[str, float]:
        """Tokens/s through each timed server's whole span, from the median of its steps."""
        spans = {s.peer_id: s.end - s.start for s in self.servers()}
        return {peer: 1.0 / (statistics.median(times) * spans[peer])
                for peer, times in self.step_times.items() if times and peer in spans}

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
        a = self.announcement(peer_id)
        return () if a is None else tuple(addr for addr in a.addrs
                                          if addr.endswith(f"/p2p/{peer_id}"))

    def announcement(self, peer_id: str) -> Announce | None:
        """The fresh signed announcement of ``peer_id``; None when there is none."""
        return next((a for a in self.view.fresh(trio.current_time())
                     if str(announce_peer(a)) == peer_id), None)

    # -- exclusion --------------------------------------------------------------------

    def exclude(self, peer_id: str) -> None:
        """Route no more through ``peer_id`` (it failed) until `clear_exclusions`."""
        self.dead.add(peer_id)

    def clear_exclusions(self) -> None:
        """Forget the excluded peers (not the banned): a new generation tries them again."""
        self.dead = set(self.banned)

    def ban(self, peer_id: str) -> None:
        """Route no more through ``peer_id`` for this client's lifetime (it lied: 9.5)."""
        self.banned.add(peer_id)
        self.dead.add(peer_id)  # and no more views asked of it

    # -- routes -----------------------------------------------------------------------

    def plan(self, start: int, end: int, also_exclude: Collection[str] = (), *,
             positions: int = 1, chunk: int = 1, ignore_load: bool = False) -> list[Hop]:
        """The cheapest route over [start, end) avoiding excluded (and ``also_exclude``) servers.

        Args:
            start, end: the layers to cover.
            also_exclude: peers to avoid for this plan only (e.g. busy ones).
            positions, chunk: only servers announcing at least these
                ``max_session_positions`` and ``max_chunk_positions``.
            ignore_load: plan as if no server were loaded or full (what a
                route would cost once they have room: the payment preflight).

        Returns:
            The hops, as `wallet.client.route.plan_route` chooses them.

        Raises:
            SessionTooLong: every known server of some layer has smaller caps.
            NoRoute: the usable servers do not cover the span; its
                ``unregistered`` is set when the first uncovered layer is
                served, but only by servers not registered on the chain.
        """
        try:
            servers = [replace(s, load=0) if ignore_load else s for s in self.servers()]
            return plan_route(cap_throughput(servers, self.measured()), start, end,
                              rtt=self.rtt, allowed=self.trusted,
                              exclude=self.dead | self.banned | set(also_exclude),
                              min_session_positions=positions, min_chunk_positions=chunk)
        except NoRoute as exc:
            if type(exc) is not NoRoute:
                raise
            if self._only_unregistered(exc.first):
                raise NoRoute(exc.first, exc.last, exc.trusted_only, unregistered=True) from None
            asks = [s.price for s in self.announced() if s.start <= exc.first < s.end
                    and s.price > self.max_price and self.is_registered(s.peer_id)
                    and (self.trusted is None or s.peer_id in self.trusted)]
            if asks:
                raise TooExpensive(exc.first, min(asks), self.max_price) from None
            raise

    def _only_unregistered(self, layer: int) -> bool:
        """Whether servers (trusted ones, if asked) hold ``layer``, and none is registered.

        False when no server holds the layer, and when a registered one does
        but is excluded or busy: then the layer is out of reach for that
        reason, and --allow-unregistered would be the wrong advice.
        """
        if self.registered is None:
            return False
        holders = [s.peer_id for s in self.announced() if s.start <= layer < s.end
                   and (self.trusted is None or s.peer_id in self.trusted)]
        return bool(holders) and not any(map(self.is_registered, holders))
