"""wallet.client.route: hop cost, cheapest route over servers, and repair after a failure."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given, settings, strategies as st

from node.wire import ServerInfo, SpanError
from wallet.errors import NoRoute, RemoteError, RouteError, SessionTooLong, WalletError
from wallet.client.route import Hop, hop_seconds, plan_route, replan

A = ServerInfo("A", 0, 10, 10.0)
B = ServerInfo("B", 10, 20, 10.0)
C = ServerInfo("C", 20, 30, 10.0)
CHAIN = [Hop("A", 0, 10), Hop("B", 10, 20), Hop("C", 20, 30)]


def cost_of(route, servers, rtt=None, default_rtt=0.05):
    """Seconds per token of a route (each peer id names one server)."""
    by_id = {s.peer_id: s for s in servers}
    rtt = rtt or {}
    return sum(hop_seconds(by_id[h.peer_id], h.start, h.end, rtt.get(h.peer_id, default_rtt))
               for h in route)


# --- examples ---------------------------------------------------------------


def test_hop_seconds_is_rtt_plus_share_of_the_step_times_queue():
    s = ServerInfo("s", 0, 10, 4.0, load=1)
    # 5 of 10 layers at 4 tokens/s: 0.125 s, doubled behind one session.
    assert hop_seconds(s, 0, 5, 0.03) == pytest.approx(0.03 + 0.25)
    assert hop_seconds(s, 0, 10, 0.0) == pytest.approx(0.5)
    with pytest.raises(RouteError):
        hop_seconds(s, 5, 11, 0.0)
    with pytest.raises(RouteError):
        hop_seconds(s, 3, 3, 0.0)
    with pytest.raises(RouteError):
        hop_seconds(s, 0, 5, -1.0)


def test_bad_announcements_are_refused():
    for bad in (dict(start=5, end=5), dict(start=-1, end=3), dict(throughput=0.0),
                dict(throughput=math.nan), dict(load=-1), dict(max_sessions=0)):
        fields = dict(peer_id="x", start=0, end=4, throughput=1.0) | bad
        with pytest.raises(SpanError):
            ServerInfo(**fields)
    assert issubclass(SpanError, ValueError)
    assert issubclass(RouteError, WalletError) and issubclass(RouteError, ValueError)
    assert issubclass(NoRoute, WalletError)


def test_three_servers_in_a_chain():
    assert plan_route([C, A, B], 0, 30) == CHAIN


def test_a_fast_middle_server_is_used_for_a_sub_span():
    # Chain A, B, C costs 3 * (0.05 + 0.1) = 0.45; A 0:5, D 5:25, C 25:30
    # costs 3 * 0.05 + 0.05 + 0.05 + 0.05 = 0.3, cheaper than any other split.
    d = ServerInfo("D", 5, 25, 20.0)
    route = plan_route([A, B, C, d], 0, 30)
    assert route == [Hop("A", 0, 5), Hop("D", 5, 25), Hop("C", 25, 30)]
    assert cost_of(route, [A, B, C, d]) == pytest.approx(0.3)


def test_a_whole_model_server_against_a_chain():
    fast = ServerInfo("E", 0, 30, 5.0)  # 0.05 + 0.2 = 0.25 < 0.45
    slow = ServerInfo("E", 0, 30, 2.0)  # 0.05 + 0.5 = 0.55 > 0.45
    assert plan_route([A, B, C, fast], 0, 30) == [Hop("E", 0, 30)]
    assert plan_route([A, B, C, slow], 0, 30) == CHAIN


def test_a_part_of_the_model():
    assert plan_route([A, B, C], 5, 15) == [Hop("A", 5, 10), Hop("B", 10, 15)]


def test_round_trips_and_load_change_the_choice():
    b2 = ServerInfo("B2", 10, 20, 10.0)
    assert plan_route([A, B, b2, C], 0, 30, rtt={"B": 0.5})[1] == Hop("B2", 10, 20)
    loaded = ServerInfo("B", 10, 20, 10.0, load=3)  # 0.4 s instead of 0.1 s
    assert plan_route([A, loaded, b2, C], 0, 30)[1] == Hop("B2", 10, 20)


def test_busy_servers_are_skipped():
    busy = ServerInfo("B", 10, 20, 100.0, load=8, max_sessions=8)
    spare = ServerInfo("B2", 10, 20, 1.0)
    assert plan_route([A, busy, spare, C], 0, 30)[1] == Hop("B2", 10, 20)
    with pytest.raises(NoRoute, match=r"layer 10 \(layers 10\.\.19 uncovered\)"):
        plan_route([A, busy, C], 0, 30)


def test_servers_whose_caps_are_too_small_are_skipped():
    short = ServerInfo("B", 10, 20, 100.0, max_session_positions=64)  # fast, but short
    narrow = ServerInfo("B1", 10, 20, 50.0, max_chunk_positions=16)
    long = ServerInfo("B2", 10, 20, 1.0, max_session_positions=4096)
    servers = [A, short, narrow, long, C]
    assert plan_route(servers, 0, 30)[1] == Hop("B", 10, 20)
    assert plan_route(servers, 0, 30, min_session_positions=65)[1] == Hop("B1", 10, 20)
    assert plan_route(servers, 0, 30, min_session_positions=65,
                      min_chunk_positions=32)[1] == Hop("B2", 10, 20)


def test_a_generation_longer_than_every_server_takes_is_refused_up_front():
    short = ServerInfo("B", 10, 20, 100.0, max_session_positions=64)
    with pytest.raises(SessionTooLong) as err:
        plan_route([A, short, C], 0, 30, min_session_positions=100)
    assert isinstance(err.value, RemoteError) and isinstance(err.value, NoRoute)
    assert err.value.first == 10 and (err.value.needed, err.value.cap) == (100, 64)
    assert "100 positions" in str(err.value) and "at most 64 per session" in str(err.value)
    # Even while a long enough server is busy: that is worth waiting for (NoRoute).
    busy_long = ServerInfo("B2", 10, 20, 1.0, load=8, max_sessions=8)
    with pytest.raises(NoRoute) as err:
        plan_route([A, short, busy_long, C], 0, 30, min_session_positions=100)
    assert not isinstance(err.value, SessionTooLong)
    with pytest.raises(SessionTooLong, match="at most 16 per call"):
        plan_route([A, ServerInfo("B", 10, 20, 1.0, max_chunk_positions=16), C], 0, 30,
                   min_chunk_positions=32)
    # A layer nobody serves is uncovered, not too short.
    with pytest.raises(NoRoute) as err:
        plan_route([A, C], 0, 30, min_session_positions=100)
    assert not isinstance(err.value, SessionTooLong) and err.value.first == 10


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6), st.integers(1, 64),
                          st.integers(1, 64)), min_size=1, max_size=8),
       st.integers(1, 64), st.integers(1, 64))
def test_a_route_never_uses_a_server_below_the_caps(spans, positions, chunk):
    servers = [ServerInfo(f"s{k}", a, a + n, 1.0 + k, max_session_positions=p,
                          max_chunk_positions=c) for k, (a, n, p, c) in enumerate(spans)]
    by_id = {s.peer_id: s for s in servers}
    try:
        route = plan_route(servers, 0, 6, min_session_positions=positions,
                           min_chunk_positions=chunk)
    except SessionTooLong as exc:  # some layer's servers all fall short
        covering = [s for s in servers if s.start <= exc.first < s.end]
        assert covering and not any(s.max_session_positions >= positions
                                    and s.max_chunk_positions >= chunk for s in covering)
        return
    except NoRoute as exc:
        assert not any(s.start <= exc.first < s.end for s in servers)
        return
    assert all(by_id[h.peer_id].max_session_positions >= positions
               and by_id[h.peer_id].max_chunk_positions >= chunk for h in route)


def test_trusted_peers_only():
    d = ServerInfo("D", 5, 25, 20.0)
    assert plan_route([A, B, C, d], 0, 30, allowed={"A", "B", "C"}) == CHAIN
    with pytest.raises(NoRoute, match="only trusted peers were considered") as err:
        plan_route([A, B, C, d], 0, 30, allowed={"A", "B"})
    assert (err.value.first, err.value.last, err.value.trusted_only) == (20, 29, True)


def test_no_route_names_the_first_uncovered_layer():
    with pytest.raises(NoRoute) as err:
        plan_route([A, ServerInfo("x", 13, 20, 1.0), ServerInfo("y", 25, 30, 1.0)], 0, 30)
    assert str(err.value) == "no usable server covers layer 10 (layers 10..12 uncovered)"
    assert "trusted" not in str(err.value)
    with pytest.raises(NoRoute, match=r"layer 29 \(layer 29 uncovered\)"):
        plan_route([A, B, ServerInfo("C", 20, 29, 1.0)], 0, 30)
    with pytest.raises(NoRoute, match="layer 0"):
        plan_route([], 0, 30)
    with pytest.raises(NoRoute, match="layer 10"):
        plan_route([A, B, C], 0, 30, exclude={"B"})


def test_bad_layer_range():
    with pytest.raises(RouteError):
        plan_route([A], 5, 5)
    with pytest.raises(RouteError):
        plan_route([A], -1, 5)
    with pytest.raises(RouteError):
        plan_route([A], 0, 5, rtt={"A": -0.1})


def test_ties_go_to_fewer_hops_then_peer_id():
    # With no round trip, one server 0:30 at 1 token/s costs 1 s, the same as
    # three servers of 10 layers at 3 tokens/s: the single hop wins.
    whole = ServerInfo("Z", 0, 30, 1.0)
    thirds = [ServerInfo(p, a, a + 10, 3.0) for p, a in (("a", 0), ("b", 10), ("c", 20))]
    assert plan_route([*thirds, whole], 0, 30, default_rtt=0.0) == [Hop("Z", 0, 30)]
    # A server is never split into consecutive hops of its own.
    assert plan_route([whole], 0, 30, default_rtt=0.0) == [Hop("Z", 0, 30)]
    twins = [ServerInfo("y", 0, 30, 1.0), ServerInfo("x", 0, 30, 1.0)]
    assert plan_route(twins, 0, 30) == [Hop("x", 0, 30)]
    assert plan_route(twins[::-1], 0, 30) == [Hop("x", 0, 30)]


def test_replan_keeps_the_healthy_hops():
    b2 = ServerInfo("B2", 10, 20, 10.0)
    d = ServerInfo("D", 5, 25, 1.0)  # slow: used only if nothing else is left
    route = plan_route([A, B, C, d], 0, 30)
    assert route == CHAIN
    assert replan(route, 1, [A, B, b2, C, d]) == [CHAIN[0], Hop("B2", 10, 20), CHAIN[2]]
    assert replan(route, 1, [A, B, C, d]) == [CHAIN[0], Hop("D", 10, 20), CHAIN[2]]
    # The failed hop's span may be split over several servers.
    halves = [ServerInfo("h1", 10, 15, 10.0), ServerInfo("h2", 15, 20, 10.0)]
    assert replan(route, 1, [A, B, C, *halves]) == [
        Hop("A", 0, 10), Hop("h1", 10, 15), Hop("h2", 15, 20), Hop("C", 20, 30)]
    with pytest.raises(NoRoute, match="layer 10"):
        replan(route, 1, [A, B, C])
    with pytest.raises(NoRoute, match="layer 10"):
        replan(route, 1, [A, B, b2, C], exclude={"B2"})
    with pytest.raises(NoRoute, match="trusted"):
        replan(route, 1, [A, B, b2, C], allowed={"A", "B", "C"})
    with pytest.raises(RouteError):
        replan(route, 3, [A, B, C])


def test_a_few_hundred_layers_and_servers_plan_quickly():
    servers = [ServerInfo(f"p{k:03d}", (k * 7) % 280, (k * 7) % 280 + 20 + k % 21, 1.0 + k % 5,
                          load=k % 4) for k in range(300)]
    servers.append(ServerInfo("whole", 0, 300, 0.5))
    t0 = time.perf_counter()
    route = plan_route(servers, 0, 300)
    assert time.perf_counter() - t0 < 2.0
    assert route[0].start == 0 and route[-1].end == 300


# --- properties against a brute force -----------------------------------------


def brute_force(servers, start, end, rtt, default_rtt, exclude=(), allowed=None):
    """The least cost over every hop sequence covering [start, end), or None."""
    usable = [s for s in servers if s.load < s.max_sessions and s.peer_id not in exclude
              and (allowed is None or s.peer_id in allowed)]
    best = None

    def walk(i, cost):
        nonlocal best
        if i == end:
            best = cost if best is None else min(best, cost)
            return
        for s in usable:
            if s.start <= i < s.end:
                for j in range(i + 1, min(s.end, end) + 1):
                    walk(j, cost + rtt.get(s.peer_id, default_rtt)
                         + (j - i) / (s.end - s.start) / s.throughput * (1 + s.load))

    walk(start, 0.0)
    return best


def first_uncovered(servers, start, end, exclude=(), allowed=None):
    for layer in range(start, end):
        if not any(s.start <= layer < s.end and s.load < s.max_sessions and s.peer_id not in exclude
                   and (allowed is None or s.peer_id in allowed) for s in servers):
            return layer
    return None


@st.composite
def swarms(draw):
    """Up to 5 servers on up to 8 layers, with round trips and filters (often coverable)."""
    n_layers = draw(st.integers(1, 8))
    ids = draw(st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=5, unique=True))
    # The first servers tile the model (so many swarms have multi-hop routes),
    # the rest hold random spans.
    cuts = []
    if n_layers > 1:
        cuts = sorted(draw(st.sets(st.integers(1, n_layers - 1), max_size=len(ids) - 1)))
    tiles = list(zip([0, *cuts], [*cuts, n_layers]))
    servers = []
    for k, peer in enumerate(ids):
        if k < len(tiles):
            start, end = tiles[k]
        else:
            start = draw(st.integers(0, n_layers - 1))
            end = draw(st.integers(start + 1, n_layers))
        servers.append(ServerInfo(
            peer, start, end,
            throughput=draw(st.sampled_from([0.5, 1.0, 2.0, 3.0, 7.5])),
            load=draw(st.integers(0, 2)), max_sessions=draw(st.integers(1, 8)),
        ))
    start, end = 0, n_layers
    if draw(st.booleans()):
        start = draw(st.integers(0, n_layers - 1))
        end = draw(st.integers(start + 1, n_layers))
    rtt = {p: draw(st.sampled_from([0.0, 0.01, 0.05, 0.3])) for p in ids if draw(st.booleans())}
    default_rtt = draw(st.sampled_from([0.0, 0.05, 0.2]))
    peers = st.sampled_from([*ids, "z"])
    allowed = draw(st.one_of(st.none(), st.none(), st.sets(peers, min_size=len(ids) - 1)))
    exclude = draw(st.sets(peers, max_size=1))
    return servers, start, end, rtt, default_rtt, exclude, allowed


def check_route(route, servers, start, end, exclude, allowed):
    by_id = {s.peer_id: s for s in servers}
    assert route[0].start == start and route[-1].end == end
    for hop, nxt in zip(route, route[1:]):
        assert hop.end == nxt.start
    for hop in route:
        s = by_id[hop.peer_id]
        assert s.start <= hop.start < hop.end <= s.end
        assert not s.busy and hop.peer_id not in exclude
        assert allowed is None or hop.peer_id in allowed
    for hop, nxt in zip(route, route[1:]):
        # Two hops in a row on one server never win: one hop costs no more.
        assert hop.peer_id != nxt.peer_id


@settings(max_examples=300, deadline=None)
@given(swarms())
def test_plan_route_is_optimal(case):
    servers, start, end, rtt, default_rtt, exclude, allowed = case
    want = brute_force(servers, start, end, rtt, default_rtt, exclude, allowed)
    if want is None:
        with pytest.raises(NoRoute) as err:
            plan_route(servers, start, end, rtt=rtt, default_rtt=default_rtt,
                       exclude=exclude, allowed=allowed)
        assert err.value.first == first_uncovered(servers, start, end, exclude, allowed)
        assert f"layer {err.value.first} " in str(err.value)
        assert err.value.trusted_only == (allowed is not None)
        return
    assert first_uncovered(servers, start, end, exclude, allowed) is None
    route = plan_route(servers, start, end, rtt=rtt, default_rtt=default_rtt,
                       exclude=exclude, allowed=allowed)
    check_route(route, servers, start, end, exclude, allowed)
    assert abs(cost_of(route, servers, rtt, default_rtt) - want) <= 1e-9
    # The same swarm in another order gives the same route.
    assert plan_route(servers[::-1], start, end, rtt=rtt, default_rtt=default_rtt,
                      exclude=exclude, allowed=allowed) == route


@settings(max_examples=200, deadline=None)
@given(swarms(), st.data())
def test_replan_is_optimal_around_the_failure(case, data):
    servers, start, end, rtt, default_rtt, exclude, allowed = case
    kwargs = dict(rtt=rtt, default_rtt=default_rtt, exclude=exclude, allowed=allowed)
    try:
        route = plan_route(servers, start, end, **kwargs)
    except NoRoute:
        return
    k = data.draw(st.integers(0, len(route) - 1))
    failed = route[k]
    without = {*exclude, failed.peer_id}
    want = brute_force(servers, failed.start, failed.end, rtt, default_rtt, without, allowed)
    if want is None:
        with pytest.raises(NoRoute):
            replan(route, k, servers, **kwargs)
        return
    new = replan(route, k, servers, **kwargs)
    patch = new[k:len(new) - (len(route) - k - 1)]
    assert new[:k] == route[:k] and new[len(new) - len(route) + k + 1:] == route[k + 1:]
    check_route(patch, servers, failed.start, failed.end, without, allowed)
    assert abs(cost_of(patch, servers, rtt, default_rtt) - want) <= 1e-9
