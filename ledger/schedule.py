"""The longest-wait rule and fork-choice weights, as pure functions.

Who produces the next block, who executes each compute block, who verifies a
receipt and which of two tips is better: all are decided here from plain
values that every node can recompute from chain state. Nothing here reads a
clock or draws randomness; the only "randomness" is a hash of the parent
block, which no single party controls once the parent is published.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from ledger import crypto

#: A rank-0 block weighs 2**WEIGHT_BITS, rank r weighs 2**(WEIGHT_BITS - r).
WEIGHT_BITS = 32


@dataclass(frozen=True, slots=True)
class Candidate:
    """A node that may be given work: its key, wait, served layers and jail term."""

    node_key: bytes
    last_served_height: int
    layer_start: int
    layer_end: int
    jailed_until: int = 0  # a height; units go to it only when no free node covers them

    def covers(self, layer_start: int, layer_end: int) -> bool:
        return self.layer_start <= layer_start and layer_end <= self.layer_end


def tiebreak(seed: bytes, node_key: bytes) -> bytes:
    """H(seed || node_key): orders nodes that waited equally long."""
    return crypto.domain_hash(crypto.H_TIEBREAK, seed + node_key)


def longest_wait_order(candidates: Iterable[Candidate], seed: bytes) -> list[Candidate]:
    """Candidates sorted by oldest ``last_served_height``, then by tiebreak.

    Args:
        candidates: eligible nodes (the caller filters bond, jail, layers).
        seed: the previous block's hash.

    Returns:
        A new list, the first entry being the node that waited longest.
    """
    return sorted(candidates, key=lambda c: (c.last_served_height, tiebreak(seed, c.node_key)))


def producer_ranking(candidates: Iterable[Candidate], prev_hash: bytes) -> list[bytes]:
    """Node keys in producer rank order for the block after ``prev_hash``.

    Rank r may produce once ``r * slot_ms`` has passed since the parent's time
    (the timeout ladder), so an offline rank-0 node only delays the chain.
    """
    return [c.node_key for c in longest_wait_order(candidates, prev_hash)]


def assign_units(
    units: Sequence[tuple[int, int]],
    candidates: Sequence[Candidate],
    seed: bytes,
    height: int,
    exclude: Sequence[bytes | None] | None = None,
) -> list[bytes | None]:
    """Assign each unit, in order, to the eligible node that waited longest.

    A node handed a unit counts as served at ``height``, so the next unit of
    the same step goes to the next-longest waiter: work spreads over all
    nodes that serve a section before any node gets a second unit. A node
    jailed at ``height`` (``jailed_until > height``) comes after every free
    node that covers the unit, however long it waited: it gets a unit only
    when no free node can take it, so a jail slows nothing down.

    Args:
        units: (layer_start, layer_end) of each unit, in canonical order.
        candidates: registered, bonded nodes.
        seed: the previous block's hash (tiebreak).
        height: the height of the block that opens the assignment.
        exclude: per unit, a node that may not take it (a timed-out assignee).

    Returns:
        The chosen node key per unit, or None where no node covers the unit.
    """
    # (height, turn): turn 0 for nodes not yet handed a unit in this call, so
    # a node served now sorts after every node that last served at <= height.
    served = {c.node_key: (c.last_served_height, 0) for c in candidates}
    chosen: list[bytes | None] = []
    for i, (start, end) in enumerate(units):
        banned = exclude[i] if exclude else None
        able = [c for c in candidates if c.covers(start, end) and c.node_key != banned]
        if not able:
            chosen.append(None)
            continue
        best = min(able, key=lambda c: (c.jailed_until > height, served[c.node_key],
                                        tiebreak(seed, c.node_key)))
        served[best.node_key] = (height, i + 1)
        chosen.append(best.node_key)
    return chosen


def block_weight(rank: int) -> int:
    """Fork-choice weight of a block made by the rank-``rank`` producer."""
    return 1 << max(0, WEIGHT_BITS - rank)


def is_better_tip(weight: int, tip_hash: bytes, than_weight: int, than_hash: bytes) -> bool:
    """Greatest total weight wins; equal weight goes to the lower tip hash."""
    return weight > than_weight or (weight == than_weight and tip_hash < than_hash)
