"""node.serve.placement: per-layer capacity, the span a server takes, and when it moves."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings, strategies as st

from node.errors import PlacementError, NodeError
from node.serve.placement import choose_span, layer_throughput, should_move


@dataclass(frozen=True, slots=True)
class Srv:
    """Any object with these four attributes will do (node does not import wallet)."""

    peer_id: str
    start: int
    end: int
    throughput: float


# --- examples ---------------------------------------------------------------


def test_layer_throughput_sums_the_holders():
    swarm = [Srv("a", 0, 3, 2.0), Srv("b", 2, 5, 1.5), Srv("c", 4, 9, 1.0)]
    assert layer_throughput(swarm, 6) == [2.0, 2.0, 3.5, 1.5, 2.5, 1.0]
    assert layer_throughput(swarm, 6, exclude={"b"}) == [2.0, 2.0, 2.0, 0.0, 1.0, 1.0]
    # Nonsense throughputs from untrusted announcements count as nothing.
    assert layer_throughput([Srv("x", 0, 2, float("nan")), Srv("y", 0, 2, -3.0)], 2) == [0.0, 0.0]


def test_empty_swarm_starts_at_zero():
    assert choose_span([], 30, 10) == 0


def test_a_joiner_takes_the_uncovered_layers():
    assert choose_span([Srv("a", 0, 10, 5.0)], 30, 10) == 10
    # A gap in the middle is filled before any covered layer is doubled.
    swarm = [Srv("a", 0, 15, 1.0), Srv("b", 20, 30, 1.0)]
    assert choose_span(swarm, 30, 5) == 15
    # Wider than the gap: the window holding the gap, the weaker side first.
    swarm = [Srv("a", 0, 15, 1.0), Srv("b", 20, 30, 9.0)]
    assert choose_span(swarm, 30, 8) == 12


def test_the_weakest_layer_decides_then_the_sum_then_the_start():
    swarm = [Srv("a", 0, 4, 3.0), Srv("b", 4, 8, 1.0), Srv("c", 2, 3, 10.0)]
    assert choose_span(swarm, 8, 4) == 4  # every window touching 4..8 has min 1; 4..8 sums least
    assert choose_span([Srv("a", 0, 8, 1.0)], 8, 3) == 0  # all equal: smallest start


def test_span_length_is_clamped_and_checked():
    assert choose_span([Srv("a", 0, 2, 1.0)], 4, 50) == 0
    with pytest.raises(PlacementError):
        choose_span([], 4, 0)
    with pytest.raises(PlacementError):
        choose_span([], 0, 1)
    assert issubclass(PlacementError, NodeError) and issubclass(PlacementError, ValueError)


def test_should_move_to_a_much_weaker_region():
    other, me = Srv("a", 0, 10, 10.0), Srv("me", 0, 10, 10.0)
    # Bottleneck 5 (layers 10..20), 10 after moving: a gain of 2.
    assert should_move([other, me, Srv("b", 10, 20, 5.0)], "me", 20) == 10
    # Bottleneck 9, 10 after moving: a gain of 1.11 is not worth a move.
    assert should_move([other, me, Srv("b", 10, 20, 9.0)], "me", 20) is None
    assert should_move([other, me, Srv("b", 10, 20, 9.0)], "me", 20, min_gain=1.1) == 10


def test_should_move_to_cover_uncovered_layers():
    assert should_move([Srv("a", 0, 10, 10.0), Srv("me", 0, 10, 1.0)], "me", 20) == 10
    # Fewer layers uncovered counts as a gain even when some stay uncovered.
    assert should_move([Srv("a", 0, 10, 1.0), Srv("me", 0, 10, 1.0)], "me", 30) == 10
    # The only holder of its layers stays: moving would uncover them.
    assert should_move([Srv("a", 0, 10, 1.0), Srv("me", 10, 20, 1.0)], "me", 30) is None


def test_should_move_stays_where_it_is_best():
    assert should_move([Srv("me", 0, 10, 1.0)], "me", 10) is None
    assert should_move([Srv("a", 0, 10, 1.0), Srv("me", 10, 20, 1.0)], "me", 20) is None


def test_should_move_checks_its_inputs():
    with pytest.raises(PlacementError, match="0 times"):
        should_move([Srv("a", 0, 10, 1.0)], "me", 10)
    with pytest.raises(PlacementError, match="2 times"):
        should_move([Srv("me", 0, 5, 1.0), Srv("me", 5, 10, 1.0)], "me", 10)
    with pytest.raises(PlacementError, match="outside"):
        should_move([Srv("me", 12, 15, 1.0)], "me", 10)
    with pytest.raises(PlacementError, match="min_gain"):
        should_move([Srv("me", 0, 5, 1.0)], "me", 10, min_gain=0.9)


# --- properties against a brute force -----------------------------------------


@st.composite
def swarms(draw, min_servers=0):
    """Up to 6 servers on up to 12 layers, integer throughputs (exact sums)."""
    n_layers = draw(st.integers(1, 12))
    servers = []
    for k in range(draw(st.integers(min_servers, 6))):
        start = draw(st.integers(0, n_layers - 1))
        end = draw(st.integers(start + 1, n_layers))
        servers.append(Srv(f"p{k}", start, end, float(draw(st.integers(1, 5)))))
    return servers, n_layers


def brute_window_key(totals, start, span_len):
    window = totals[start:start + span_len]
    return min(window), sum(window)


@settings(max_examples=300, deadline=None)
@given(swarms(), st.integers(1, 14), st.data())
def test_choose_span_is_optimal(case, span_len, data):
    servers, n_layers = case
    exclude = data.draw(st.sets(st.sampled_from([s.peer_id for s in servers] or ["none"])))
    kept = [s for s in servers if s.peer_id not in exclude]
    totals = [sum(s.throughput for s in kept if s.start <= layer < s.end) for layer in range(n_layers)]
    k = min(span_len, n_layers)
    got = choose_span(servers, n_layers, span_len, exclude=exclude)
    assert 0 <= got <= n_layers - k
    keys = [brute_window_key(totals, s, k) for s in range(n_layers - k + 1)]
    assert brute_window_key(totals, got, k) == min(keys)
    assert got == keys.index(min(keys))  # the smallest start among the best


def bottleneck(servers, n_layers):
    return min(layer_throughput(servers, n_layers))


@settings(max_examples=300, deadline=None)
@given(swarms(min_servers=1), st.data(), st.sampled_from([1.0, 1.25, 2.0]))
def test_should_move_only_improves_and_settles(case, data, min_gain):
    servers, n_layers = case
    me = data.draw(st.sampled_from(servers))
    to = should_move(servers, me.peer_id, n_layers, min_gain=min_gain)
    if to is None:
        return
    assert to != me.start
    moved_me = replace(me, start=to, end=to + (me.end - me.start))
    assert moved_me.end <= n_layers
    moved = [moved_me if s is me else s for s in servers]
    before, after = bottleneck(servers, n_layers), bottleneck(moved, n_layers)
    assert after >= before
    if before > 0:
        assert after >= min_gain * before
    else:
        uncovered = layer_throughput(servers, n_layers).count(0.0)
        assert layer_throughput(moved, n_layers).count(0.0) < uncovered
    # Once moved, the same view proposes nothing more: no oscillation.
    assert should_move(moved, me.peer_id, n_layers, min_gain=min_gain) is None
