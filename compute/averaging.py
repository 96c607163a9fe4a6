"""Neighbour-weighted averaging of replica weights (whitepaper eq. 7-8).

Owns the math that keeps replicas of one section in step: every N steps each
replica i replaces its weights by a weighted sum over itself and its current
neighbours,

    x_i' = sum_j W_ij x_j,   W_ij = 1 / (1 + max(d_i, d_j))  for neighbours j,
                             W_ii = 1 - sum_{j != i} W_ij,

with d_i the degree of i in the round's neighbour graph (Metropolis-Hastings
weights). W is symmetric and each row sums to 1, so it is doubly stochastic:
a round preserves the replicas' mean exactly (up to float rounding), and on a
connected graph repeated rounds shrink the spread around the mean
geometrically (by the second-largest eigenvalue modulus of W).

A neighbour that drops out mid-round is simply not in the round's graph: the
weights are computed over the replicas that took part, which keeps W doubly
stochastic for them (their mean is preserved, the absent replica is left as it
was). Pure tensor core: no clock, no network; the caller (the node's
averaging protocol) decides who took part.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import torch

from compute.errors import ComputeError

Node = Hashable
Graph = Mapping[Node, frozenset]  # node -> its neighbours (symmetric, no self loops)
Weights = dict[Node, dict[Node, float]]  # i -> {j: W_ij} including j == i


class AveragingError(ComputeError):
    """A neighbour graph or a set of replica weights that cannot be averaged."""


def check_graph(graph: Graph) -> None:
    """Raise unless ``graph`` is symmetric, without self loops, over its own nodes.

    Raises:
        AveragingError: naming the first offending edge.
    """
    for i, neighbours in graph.items():
        for j in neighbours:
            if j == i:
                raise AveragingError(f"node {i!r} lists itself as a neighbour")
            if j not in graph:
                raise AveragingError(f"node {i!r} has neighbour {j!r}, which is not in the graph")
            if i not in graph[j]:
                raise AveragingError(f"edge {i!r} -> {j!r} has no reverse edge")


def pair_weight(degree_i: int, degree_j: int) -> float:
    """``W_ij`` of two neighbours of degrees ``d_i`` and ``d_j``: ``1 / (1 + max)``."""
    return 1.0 / (1 + max(degree_i, degree_j))


def mix(mine: Mapping[str, torch.Tensor], degree: int,
        heard: list[tuple[int, Mapping[str, torch.Tensor]]]) -> dict[str, torch.Tensor]:
    """One replica's side of a round: ``x_i + sum_j W_ij (x_j - x_i)``.

    The same as ``sum_j W_ij x_j`` with ``W_ii = 1 - sum_j W_ij``, over the
    neighbours ``heard`` (their degree and tensors); a neighbour of the
    round's graph that was not heard from contributes nothing (it is left
    out, and ``W_ii`` keeps its share). Float64 accumulation.
    """
    out = {}
    for name, x in mine.items():
        base = x.to(torch.float64)
        acc = base.clone()
        for their_degree, tensors in heard:
            acc.add_(tensors[name].to(torch.float64) - base, alpha=pair_weight(degree,
                                                                              their_degree))
        out[name] = acc.to(x.dtype)
    return out


def metropolis_weights(graph: Graph) -> Weights:
    """The Metropolis-Hastings weight matrix of ``graph``, row by row.

    Returns:
        ``W[i][j]`` for every node i, its neighbours j and i itself; every row
        sums to 1 and ``W[i][j] == W[j][i]``.

    Raises:
        AveragingError: the graph is not symmetric or has self loops.
    """
    check_graph(graph)
    degree = {i: len(n) for i, n in graph.items()}
    weights: Weights = {}
    for i, neighbours in graph.items():
        row = {j: pair_weight(degree[i], degree[j]) for j in neighbours}
        row[i] = 1.0 - sum(row.values())
        weights[i] = row
    return weights


def take_part(graph: Graph, present: set) -> dict[Node, frozenset]:
    """The round's graph: ``graph`` restricted to the replicas ``present``."""
    return {i: frozenset(j for j in graph[i] if j in present) for i in graph if i in present}


def average_round(
    replicas: Mapping[Node, Mapping[str, torch.Tensor]], graph: Graph
) -> dict[Node, dict[str, torch.Tensor]]:
    """One averaging round: every replica in ``graph`` gets ``sum_j W_ij x_j``.

    Args:
        replicas: each replica's named tensors (same names, shapes, dtypes).
        graph: the round's neighbour graph over (a subset of) the replicas;
            replicas not in it are returned unchanged.

    Returns:
        New tensors for every replica (inputs are not modified). Sums run in
        float64 and are cast back, so the mean moves only by that last cast.

    Raises:
        AveragingError: a graph node without weights, or mismatched tensors.
    """
    missing = [i for i in graph if i not in replicas]
    if missing:
        raise AveragingError(f"graph nodes without weights: {missing[:4]}")
    names = _common_names(replicas, graph)
    weights = metropolis_weights(graph)
    out: dict[Node, dict[str, torch.Tensor]] = {}
    for i, tensors in replicas.items():
        if i not in graph:
            out[i] = {n: t.clone() for n, t in tensors.items()}
            continue
        out[i] = {}
        for name in names:
            acc = torch.zeros_like(tensors[name], dtype=torch.float64)
            for j, w in weights[i].items():
                acc.add_(replicas[j][name].to(torch.float64), alpha=w)
            out[i][name] = acc.to(tensors[name].dtype)
    return out


def spread(replicas: Mapping[Node, Mapping[str, torch.Tensor]]) -> float:
    """Root of the summed squared distance of every replica to their mean (float64)."""
    nodes = list(replicas)
    if not nodes:
        return 0.0
    total = 0.0
    for name in replicas[nodes[0]]:
        stack = torch.stack([replicas[i][name].to(torch.float64) for i in nodes])
        total += float(((stack - stack.mean(0)) ** 2).sum())
    return total ** 0.5


def _common_names(replicas, graph) -> list[str]:
    nodes = list(graph)
    if not nodes:
        return []
    first = replicas[nodes[0]]
    for i in nodes[1:]:
        other = replicas[i]
        if set(other) != set(first):
            raise AveragingError(f"replica {i!r} holds tensors {sorted(other)[:4]}, "
                                 f"expected {sorted(first)[:4]}")
        for name, t in first.items():
            if other[name].shape != t.shape or other[name].dtype != t.dtype:
                raise AveragingError(f"replica {i!r}: {name} is {tuple(other[name].shape)} "
                                     f"{other[name].dtype}, expected {tuple(t.shape)} {t.dtype}")
    return sorted(first)
