"""Which layers a server serves when started with ``--auto`` (as Petals).

Owns the swarm's per-layer capacity (`layer_throughput`), the span a joining
server takes (`choose_span`) and whether a running server should move
(`should_move`). Pure core: no clock, file or randomness; the caller hands
in the announced servers, so every server that sees the same announcements
decides the same.

Servers are `node.wire.ServerInfo` records, the span record the client's
route planner reads too (only ``peer_id``, ``start``, ``end`` and
``throughput`` matter here). A server holds layers [start, end); parts of a
span outside [0, n_layers) are ignored. ``throughput`` is the server's tokens/s through all its layers; a
layer's throughput is the sum over the servers that hold it, and the swarm's
bottleneck is the least of these (0 when some layer is uncovered): a token
goes through every layer, so the weakest layer bounds the whole swarm. A
throughput that is not a positive finite number (announcements come from
untrusted peers) counts as 0, so it can neither poison nor fake capacity.
"""

from __future__ import annotations

import math
from typing import Collection, Sequence

from node.errors import PlacementError
from node.wire import ServerInfo


def layer_throughput(
    servers: Sequence[ServerInfo], n_layers: int, *, exclude: Collection[str] = ()
) -> list[float]:
    """Per layer, the summed throughput of the servers that hold it.

    Args:
        servers: the announced servers.
        n_layers: layers in the model (>= 1).
        exclude: peer ids left out (e.g. the server asking about itself).

    Returns:
        n_layers sums, 0.0 for a layer no server holds.

    Raises:
        PlacementError: n_layers < 1.
    """
    if n_layers < 1:
        raise PlacementError(f"a model has at least one layer, not {n_layers}")
    excluded = set(exclude)
    totals = [0.0] * n_layers
    for server in servers:
        if server.peer_id in excluded:
            continue
        capacity = _capacity(server)
        for layer in range(max(server.start, 0), min(server.end, n_layers)):
            totals[layer] += capacity
    return totals


def choose_span(
    servers: Sequence[ServerInfo], n_layers: int, span_len: int, *, exclude: Collection[str] = ()
) -> int:
    """The first layer of the span of ``span_len`` layers where the swarm is weakest.

    Among all windows [s, s + span_len), the one whose weakest layer has the
    least throughput; ties go to the smaller summed throughput, then to the
    smaller s (so every server with the same view picks the same window).

    Args:
        servers: the announced servers.
        n_layers: layers in the model (>= 1).
        span_len: layers the server will hold (>= 1; more than n_layers
            means all of them).
        exclude: peer ids left out (the server itself, when it moves).

    Returns:
        The start s, 0 <= s <= n_layers - span_len after clamping.

    Raises:
        PlacementError: n_layers < 1 or span_len < 1.
    """
    if span_len < 1:
        raise PlacementError(f"a span holds at least one layer, not {span_len}")
    totals = layer_throughput(servers, n_layers, exclude=exclude)
    return _weakest_window(totals, min(span_len, n_layers))


def should_move(
    servers: Sequence[ServerInfo], me_peer_id: str, n_layers: int, *, min_gain: float = 1.25
) -> int | None:
    """Where server ``me_peer_id`` should move its span, or None to stay.

    The candidate is `choose_span` of the swarm without me, with my span's
    length. Moving there is proposed only if, counting me at the new place,
    the swarm's bottleneck becomes at least ``min_gain`` times the current
    one. When the current bottleneck is 0 (some layer uncovered), a move
    counts as a gain when it leaves fewer layers uncovered (all of them
    covered included), since a factor of 0 means nothing.

    Why a factor above 1 (hysteresis): moving costs a server its sessions and
    a reload of weights, and throughputs are noisy measurements. Moving on any
    gain would let two servers with nearly equal views trade places forever,
    each seeing the other's region as slightly weaker; requiring a clear gain
    makes a move settle the question.

    Args:
        servers: the announced servers, me among them.
        me_peer_id: my peer id.
        n_layers: layers in the model (>= 1).
        min_gain: the least factor of improvement worth a move (>= 1).

    Returns:
        My new start layer, or None.

    Raises:
        PlacementError: I am not announced exactly once, my span lies outside
            the model, n_layers < 1 or min_gain < 1.
    """
    if not min_gain >= 1.0:
        raise PlacementError(f"min_gain must be >= 1, not {min_gain}")
    mine = [s for s in servers if s.peer_id == me_peer_id]
    if len(mine) != 1:
        raise PlacementError(f"{me_peer_id} is announced {len(mine)} times, not once")
    me = mine[0]
    current = layer_throughput(servers, n_layers)
    here = max(me.start, 0)
    span_len = min(me.end, n_layers) - here
    if span_len < 1:
        raise PlacementError(f"{me_peer_id}'s span [{me.start}, {me.end}) is outside the model")

    moved = layer_throughput(servers, n_layers, exclude={me_peer_id})
    there = _weakest_window(moved, span_len)
    if there == here:
        return None
    for layer in range(there, there + span_len):
        moved[layer] += _capacity(me)

    before, after = min(current), min(moved)
    if before > 0:
        gain = after >= min_gain * before
    else:
        gain = moved.count(0.0) < current.count(0.0)
    return there if gain else None


def _capacity(server: ServerInfo) -> float:
    """The server's throughput, or 0.0 when it is not a positive finite number."""
    t = server.throughput
    return float(t) if math.isfinite(t) and t > 0 else 0.0


def _weakest_window(totals: list[float], span_len: int) -> int:
    """The start of the window of ``span_len`` layers chosen by `choose_span`."""
    best_key: tuple[float, float, int] | None = None
    for s in range(len(totals) - span_len + 1):
        window = totals[s:s + span_len]
        key = (min(window), sum(window), s)
        if best_key is None or key < best_key:
            best_key = key
    assert best_key is not None  # 1 <= span_len <= len(totals)
    return best_key[2]
