"""compute.averaging: Metropolis-Hastings weights and averaging rounds (eq. 7-8)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compute.averaging import (
    AveragingError, average_round, metropolis_weights, spread, take_part,
)


def ring(n: int) -> dict:
    return {i: frozenset({(i - 1) % n, (i + 1) % n}) - {i} for i in range(n)}


@st.composite
def graphs(draw, min_nodes=1, max_nodes=8):
    n = draw(st.integers(min_nodes, max_nodes))
    edges = draw(st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1))))
    g = {i: set() for i in range(n)}
    for a, b in edges:
        if a != b:
            g[a].add(b)
            g[b].add(a)
    return {i: frozenset(s) for i, s in g.items()}


def replicas(n: int, seed: int = 0, shapes=((3, 4), (5,)), dtype=torch.float32) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {i: {f"w{k}": torch.randn(s, generator=gen, dtype=dtype)
                for k, s in enumerate(shapes)} for i in range(n)}


def mean(reps: dict, name: str) -> torch.Tensor:
    return torch.stack([r[name].to(torch.float64) for r in reps.values()]).mean(0)


def test_weights_of_a_small_graph_by_hand():
    # A path 0 - 1 - 2: degrees 1, 2, 1.
    g = {0: frozenset({1}), 1: frozenset({0, 2}), 2: frozenset({1})}
    w = metropolis_weights(g)
    assert w[0] == pytest.approx({1: 1 / 3, 0: 2 / 3})
    assert w[1] == pytest.approx({0: 1 / 3, 2: 1 / 3, 1: 1 / 3})
    assert w[2] == pytest.approx({1: 1 / 3, 2: 2 / 3})


@given(graphs())
def test_weights_are_symmetric_and_rows_sum_to_one(g):
    w = metropolis_weights(g)
    for i, row in w.items():
        assert sum(row.values()) == pytest.approx(1.0, abs=1e-12)
        assert all(v >= 0 for v in row.values())
        for j, v in row.items():
            if j != i:
                assert w[j][i] == v


@settings(max_examples=50, deadline=None)
@given(graphs(min_nodes=2), st.integers(0, 2**32 - 1))
def test_a_round_preserves_the_mean_and_never_widens_the_spread(g, seed):
    reps = replicas(len(g), seed)
    after = average_round(reps, g)
    for name in reps[0]:
        assert torch.allclose(mean(after, name), mean(reps, name), atol=1e-6)
    assert spread(after) <= spread(reps) + 1e-9


def test_on_a_connected_graph_the_spread_shrinks_geometrically():
    g = ring(6)
    reps = replicas(6, seed=3, dtype=torch.float64)  # the math, not float32 rounding
    spreads = [spread(reps)]
    for _ in range(20):
        reps = average_round(reps, g)
        spreads.append(spread(reps))
    ratios = [b / a for a, b in zip(spreads, spreads[1:])]
    # Ring of 6 with MH weights 1/3: second eigenvalue 1/3 + 2/3 cos(2 pi / 6) = 2/3.
    assert max(ratios) <= 2 / 3 + 1e-6
    assert spreads[-1] < spreads[0] * (2 / 3) ** 20 * 1.001


def test_a_neighbour_that_drops_mid_round_is_left_out_without_stalling_the_rest():
    g = ring(5)
    reps = replicas(5, seed=9)
    present = {0, 1, 2, 4}  # replica 3 dropped during the round
    after = average_round(reps, take_part(g, present))
    assert all(torch.equal(after[3][n], reps[3][n]) for n in reps[3])  # left as it was
    for name in reps[0]:
        before = torch.stack([reps[i][name].to(torch.float64) for i in present]).mean(0)
        now = torch.stack([after[i][name].to(torch.float64) for i in present]).mean(0)
        assert torch.allclose(now, before, atol=1e-6)  # the participants' mean is kept


def test_inputs_are_not_modified():
    reps = replicas(3)
    copy = {i: {n: t.clone() for n, t in r.items()} for i, r in reps.items()}
    average_round(reps, ring(3))
    assert all(torch.equal(reps[i][n], copy[i][n]) for i in reps for n in reps[i])


@pytest.mark.parametrize("graph, says", [
    ({0: frozenset({0})}, "lists itself"),
    ({0: frozenset({1})}, "not in the graph"),
    ({0: frozenset({1}), 1: frozenset()}, "no reverse edge"),
])
def test_malformed_graphs_are_refused(graph, says):
    with pytest.raises(AveragingError, match=says):
        metropolis_weights(graph)


def test_mismatched_replicas_are_refused():
    reps = replicas(2)
    reps[1]["w0"] = torch.zeros(2, 2)
    with pytest.raises(AveragingError, match="w0"):
        average_round(reps, ring(2))
