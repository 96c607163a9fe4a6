"""The client's inference route: which servers run which layers, in order.

Owns the seconds of one hop (`hop_seconds`), the cheapest route over the
announced servers (`plan_route`) and the repair of a route after one hop
failed (`replan`). Pure core: stdlib only; the caller hands in the announcements
(`ServerInfo`) and the round-trip times it measured, so the same inputs always
give the same route.

Cost model. A route is judged by its expected seconds per decode token (one
token's hidden state through every hop). A hop over layers [i, j) of a server
holding [s, e) costs

    rtt + (j - i) / (e - s) / throughput * (1 + load)

rtt: the client's round trip to that peer (the hidden state goes out and comes
back each token); throughput: the tokens/s the server announces for one token
through all its layers, so one layer takes 1 / ((e - s) * throughput) s;
(1 + load): a server runs its active sessions' steps one after another, so a
new session's step waits on average behind the ``load`` sessions already
there. A server at ``load >= max_sessions`` answers busy and is not used.

Capacity. A route may also need every hop to hold ``min_session_positions``
positions in one session (the generation's prompt plus new tokens) and to
run forward calls of ``min_chunk_positions`` (the chunks its inputs went in,
when a hop is replaced); servers whose announced caps are smaller are not
used. When every known server of some layer is too small, waiting for
another would not help: that is `SessionTooLong`, not `NoRoute`.

Route search. Layer boundaries start..end are the nodes of a DAG; a usable
server holding [s, e) gives an edge i -> j for every s <= i < j <= e. The route
is the cheapest path from start to end, found by dynamic programming from the
end backwards. For one server and a fixed i, the best j minimises
``j * u + best[j]`` (u: that server's seconds per layer), which does not depend
on i; going backwards, each server keeps that minimum as a running value, so
the search is O(layers x servers) instead of O(layers^2 x servers).

Ties (costs equal within a relative 1e-12, which absorbs float rounding) go to
fewer hops, then to the smaller sequence of (peer_id, start, end): the same
inputs give the same route on every client. A server may appear more than once
in a route (never twice in a row: with rtt > 0 one hop is cheaper, and on a tie
fewer hops win); each appearance is its own session.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Collection, Mapping, Sequence

from node.wire import ServerInfo
from wallet.errors import NoRoute, RouteError, SessionTooLong

_NO_RTT: Mapping[str, float] = MappingProxyType({})
# Costs this close (relative) are a tie: rounding must not outvote "fewer hops".
_REL_TIE = 1e-12


@dataclass(frozen=True, slots=True, order=True)
class Hop:
    """Layers [start, end) run on peer ``peer_id`` (a sub-span of what it holds)."""

    peer_id: str
    start: int
    end: int


def hop_seconds(server: ServerInfo, start: int, end: int, rtt_s: float) -> float:
    """Expected seconds per decode token for layers [start, end) on ``server``.

    Args:
        server: the server's announcement.
        start, end: the sub-span it is asked to run; inside its own span.
        rtt_s: the client's round trip to the server, in seconds.

    Returns:
        rtt_s + (end - start) / (server.end - server.start) / server.throughput
        * (1 + server.load); see the module docstring for why.

    Raises:
        RouteError: the sub-span is empty or outside the server's span, or
            rtt_s is negative or not finite.
    """
    if not server.start <= start < end <= server.end:
        raise RouteError(
            f"[{start}, {end}) is not inside {server.peer_id}'s [{server.start}, {server.end})"
        )
    if not (math.isfinite(rtt_s) and rtt_s >= 0):
        raise RouteError(f"rtt {rtt_s} to {server.peer_id} is not a finite number >= 0")
    return rtt_s + (end - start) * _seconds_per_layer(server)


def plan_route(
    servers: Sequence[ServerInfo],
    start: int,
    end: int,
    *,
    rtt: Mapping[str, float] = _NO_RTT,
    default_rtt: float = 0.05,
    exclude: Collection[str] = (),
    allowed: Collection[str] | None = None,
    min_session_positions: int = 1,
    min_chunk_positions: int = 1,
) -> list[Hop]:
    """The cheapest chain of hops that covers layers [start, end) in order.

    Args:
        servers: the announcements the client knows.
        start, end: the layers to cover, 0 <= start < end.
        rtt: measured round trips by peer id, in seconds.
        default_rtt: the round trip assumed for a peer missing from ``rtt``.
        exclude: peers not to use (e.g. ones that just failed).
        allowed: when given, only these peers are used (trusted peers only).
        min_session_positions: only servers whose ``max_session_positions``
            is at least this (the generation's length).
        min_chunk_positions: only servers whose ``max_chunk_positions`` is
            at least this (the longest forward call a replay will send).

    Returns:
        Hops whose spans are contiguous from start to end, each inside its
        server's span; the cheapest by `hop_seconds`, ties as the module says.

    Raises:
        RouteError: start < 0 or end <= start, or a bad rtt.
        SessionTooLong: every known server (not excluded, trusted if asked)
            of some layer has a cap below the minimum (checked first).
        NoRoute: some layer of [start, end) has no usable server.
    """
    if not 0 <= start < end:
        raise RouteError(f"bad layer range [{start}, {end})")
    if min_session_positions > 1 or min_chunk_positions > 1:
        _check_caps(_usable(servers, exclude, allowed, busy_too=True), start, end,
                    min_session_positions, min_chunk_positions)
    usable = [s for s in _usable(servers, exclude, allowed)
              if _fits(s, min_session_positions, min_chunk_positions)]
    _check_coverage(usable, start, end, trusted_only=allowed is not None)
    costs = [_Cost(s, rtt.get(s.peer_id, default_rtt), _seconds_per_layer(s)) for s in usable]
    for c in costs:
        if not (math.isfinite(c.rtt) and c.rtt >= 0):
            raise RouteError(f"rtt {c.rtt} to {c.server.peer_id} is not a finite number >= 0")

    # best[i]: the cheapest route over [i, end), as (cost, hops, path).
    best: list[_Plan | None] = [None] * (end - start + 1)
    best[end - start] = _Plan(0.0, 0, ())
    # running[k]: for server k, the best next boundary j seen so far, keyed by
    # j * u + best[j].cost (the part of the cost that does not depend on i).
    running: list[_Next | None] = [None] * len(costs)
    for i in range(end - 1, start - 1, -1):
        here: _Plan | None = None
        for k, c in enumerate(costs):
            server = c.server
            if not server.start <= i < server.end:
                continue
            # j = i + 1 joins the server's window (i, min(server.end, end)].
            j = i + 1
            after = best[j - start]
            if after is not None:
                candidate = _Next(j * c.per_layer + after.cost, after.hops, j, after.path)
                if running[k] is None or candidate.beats(running[k]):
                    running[k] = candidate
            nxt = running[k]
            if nxt is None:
                continue
            plan = _Plan(
                c.rtt + (nxt.j - i) * c.per_layer + best[nxt.j - start].cost,
                nxt.hops + 1,
                (Hop(server.peer_id, i, nxt.j),) + nxt.path,
            )
            if here is None or plan.beats(here):
                here = plan
        best[i - start] = here
    plan = best[0]
    assert plan is not None  # _check_coverage guarantees a route
    return list(plan.path)


def replan(
    route: Sequence[Hop],
    failed_index: int,
    servers: Sequence[ServerInfo],
    *,
    rtt: Mapping[str, float] = _NO_RTT,
    default_rtt: float = 0.05,
    exclude: Collection[str] = (),
    allowed: Collection[str] | None = None,
) -> list[Hop]:
    """The full route after hop ``failed_index`` failed, the other hops kept.

    Hops before and after the failed one stay as they are, so their sessions
    and KV caches survive; only the failed hop's span is planned again, without
    the failed peer (the client then replays its kept inputs to the new hops).

    Args:
        route: the route in use.
        failed_index: index in ``route`` of the hop that failed.
        servers, rtt, default_rtt, exclude, allowed: as for `plan_route`.

    Returns:
        route[:failed_index] + the new hops for its span + route[failed_index + 1:].

    Raises:
        RouteError: failed_index is not an index of ``route``.
        NoRoute: no usable server (the failed peer excluded) covers its span.
    """
    if not 0 <= failed_index < len(route):
        raise RouteError(f"no hop {failed_index} in a route of {len(route)} hops")
    failed = route[failed_index]
    patch = plan_route(
        servers, failed.start, failed.end, rtt=rtt, default_rtt=default_rtt,
        exclude={*exclude, failed.peer_id}, allowed=allowed,
    )
    return [*route[:failed_index], *patch, *route[failed_index + 1:]]


def cap_throughput(servers: Sequence[ServerInfo], measured: Mapping[str, float]
                   ) -> list[ServerInfo]:
    """``servers`` with each one's throughput capped by what the client measured of it.

    A server may announce any throughput; once the client has timed its
    steps, the route counts min(announced, measured), so one that announces
    a huge figure and is slow stops attracting routes (specs/network.md 10).

    Args:
        servers: the announcements.
        measured: tokens/s through each timed server's whole span, by peer id.

    Returns:
        The servers, in order; a measured one with ``throughput`` at most
        its measured figure (a non-positive or non-finite figure is ignored).
    """
    out = []
    for s in servers:
        m = measured.get(s.peer_id)
        if m is not None and math.isfinite(m) and 0 < m < s.throughput:
            s = replace(s, throughput=m)
        out.append(s)
    return out


def _seconds_per_layer(server: ServerInfo) -> float:
    """One layer's share of a decode step on ``server``, queueing included."""
    return (1 + server.load) / ((server.end - server.start) * server.throughput)


def _usable(
    servers: Sequence[ServerInfo], exclude: Collection[str], allowed: Collection[str] | None,
    *, busy_too: bool = False,
) -> list[ServerInfo]:
    """The servers a route may use: not busy (unless ``busy_too``), not excluded, trusted."""
    excluded = set(exclude)
    trusted = None if allowed is None else set(allowed)
    return [
        s for s in servers
        if (busy_too or not s.busy) and s.peer_id not in excluded
        and (trusted is None or s.peer_id in trusted)
    ]


def _fits(server: ServerInfo, session_positions: int, chunk_positions: int) -> bool:
    return (server.max_session_positions >= session_positions
            and server.max_chunk_positions >= chunk_positions)


def _check_caps(known: list[ServerInfo], start: int, end: int, session_positions: int,
                chunk_positions: int) -> None:
    """Raise SessionTooLong for the first layer of [start, end) whose known servers all fall short.

    A layer no server covers at all is left to `_check_coverage` (`NoRoute`).
    """
    for layer in range(start, end):
        covering = [s for s in known if s.start <= layer < s.end]
        if not covering or any(_fits(s, session_positions, chunk_positions) for s in covering):
            continue
        longest = max(s.max_session_positions for s in covering)
        if longest < session_positions:
            raise SessionTooLong(layer, session_positions, longest)
        widest = max(s.max_chunk_positions for s in covering)
        if widest < chunk_positions:
            raise SessionTooLong(layer, chunk_positions, widest, what="chunk")
        # Some server is long enough and another wide enough, none both: name the length.
        raise SessionTooLong(layer, session_positions, max(
            s.max_session_positions for s in covering if s.max_chunk_positions >= chunk_positions))


def _check_coverage(usable: list[ServerInfo], start: int, end: int, *, trusted_only: bool) -> None:
    """Raise NoRoute naming the first uncovered run of [start, end), if any.

    Every covered layer has a one-layer hop, so full coverage means a route.
    """
    covered = [False] * (end - start)
    for s in usable:
        for layer in range(max(s.start, start), min(s.end, end)):
            covered[layer - start] = True
    if all(covered):
        return
    first = covered.index(False)
    last = first
    while last + 1 < len(covered) and not covered[last + 1]:
        last += 1
    raise NoRoute(start + first, start + last, trusted_only)


def _tie(a: float, b: float) -> bool:
    return abs(a - b) <= _REL_TIE * max(1.0, abs(a), abs(b))


@dataclass(frozen=True, slots=True)
class _Cost:
    """A usable server with its round trip and seconds per layer."""

    server: ServerInfo
    rtt: float
    per_layer: float


@dataclass(frozen=True, slots=True)
class _Plan:
    """A route over [i, end): its cost, number of hops and hops."""

    cost: float
    hops: int
    path: tuple[Hop, ...]

    def beats(self, other: _Plan) -> bool:
        if not _tie(self.cost, other.cost):
            return self.cost < other.cost
        return (self.hops, self.path) < (other.hops, other.path)


@dataclass(frozen=True, slots=True)
class _Next:
    """A candidate next boundary j for one server, keyed as `plan_route` says."""

    key: float
    hops: int
    j: int
    path: tuple[Hop, ...]

    def beats(self, other: _Next) -> bool:
        if not _tie(self.key, other.key):
            return self.key < other.key
        # Same server and same i: the hop (peer, i, j) orders by j, then the rest.
        return (self.hops, self.j, self.path) < (other.hops, other.j, other.path)
