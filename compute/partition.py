"""Cutting a decoder into sections of near-equal parameter count (eq. 3-4).

Owns the partition of a training step into compute blocks: how a model's
parameters are counted (`model_units`), how they are cut into k contiguous
sections (`partition`) and which blocks a step consists of (`Partition.blocks`).
Pure core: stdlib only. A block's id on chain is the ledger's
`unit_id(job_id, step, UnitTemplate(kind code, layers, slots))`: the ledger
owns that definition, and compute (which may not import the ledger) names a
block by its `BlockSpec`, whose fields map one to one onto a `UnitTemplate`.

Units. A layer is a sequence of *slots*, the smallest pieces a cut may
separate: first its query heads (slots 0..H-1), then its MLP column slices
(slots H..H+M-1). A head unit holds its q rows and o columns plus an even
share of its KV head's k/v rows (exact: 2 * dim * head_dim is a multiple of
the group size), so every query head is a unit, as eq. 9-10 split attention;
a node running some heads of a group holds that group's k/v rows, and the k/v
gradients of the group's pieces are summed. The attention input norm counts
with head 0, the MLP input norm with slice 0. MLP slice s of M holds the
gate/up rows and down columns of ffn columns [ffn*s // M, ffn*(s+1) // M).
Head pieces add up to the attention output (the W^O aggregation), slice
pieces to the MLP output; MLP pieces need the whole attention sum first, so
a layer's pieces run side by side within each half, and the halves in order.

Embedding, final norm and LM head stay with the client (ARCHITECTURE.md,
compute; as in Petals): `client_params` counts them (a tied head once); no section
holds them, and the mean section is the layer parameters over k.

Sections. Each section is either a run of whole layers or a run of slots of
one layer: a piece of a layer never joins another layer, so every section is
one `BlockSpec` (layers, plus a slot range inside one layer). Among such
partitions, `partition` finds one of exactly k sections whose largest section
is as small as possible. A layer is cut only when it is larger than that
optimum, or when k exceeds the sections that whole layers can make; such a
layer's pieces are its own sections. The price of the rule: on layers of very
unequal size a cut straddling two layers could balance better; decoder layers
are all the same size, where it costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from compute.errors import ComputeError

KINDS = ("forward", "backward", "attention_heads")
UNIT_KINDS = ("head", "mlp")
KIND_CODES = {kind: code for code, kind in enumerate(KINDS)}
_U32 = 1 << 32


class PartitionError(ComputeError, ValueError):
    """Units, k or a block spec are inconsistent or out of range."""


@dataclass(frozen=True, slots=True)
class Unit:
    """The parameters of one slot of one layer.

    layer: layer index; slot: position inside the layer (heads first, then MLP
    slices); kind: "head" or "mlp"; index: the head or slice number; params:
    parameter count (>= 1).
    """

    layer: int
    slot: int
    kind: str
    index: int
    params: int


@dataclass(frozen=True, slots=True)
class Section:
    """Units [start, end) of the unit list, with their place in the model.

    A run of whole layers has slot_start == slot_end == 0; a piece of one
    layer has layer_end == layer_start + 1 and slots [slot_start, slot_end).
    """

    start: int
    end: int
    layer_start: int
    layer_end: int
    slot_start: int
    slot_end: int
    params: int
    heads_only: bool

    @property
    def whole_layers(self) -> bool:
        """True when the section is a run of whole layers."""
        return self.slot_start == self.slot_end == 0


@dataclass(frozen=True, slots=True)
class BlockSpec:
    """One compute block: kind, layers [layer_start, layer_end), slots [head_start, head_end).

    head_start == head_end == 0 means whole layers. Otherwise the range indexes
    the layer's slots (query heads, then MLP slices), so for an
    "attention_heads" block it is a range of heads.

    Raises:
        PartitionError: unknown kind, a field outside u32, empty ranges, or an
            attention_heads block over more than one layer.
    """

    kind: str
    layer_start: int
    layer_end: int
    head_start: int = 0
    head_end: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KIND_CODES:
            raise PartitionError(f"kind must be one of {KINDS}, got {self.kind!r}")
        fields = (self.layer_start, self.layer_end, self.head_start, self.head_end)
        if not all(isinstance(v, int) and 0 <= v < _U32 for v in fields):
            raise PartitionError(f"layer and head bounds must be u32 integers, got {fields}")
        if self.layer_start >= self.layer_end or self.head_start > self.head_end:
            raise PartitionError(f"expected non-empty layers and ordered heads, got {fields}")
        if self.head_end and self.head_start == self.head_end:
            raise PartitionError(f"empty head/slot range: {fields}")
        if self.head_end and self.layer_end != self.layer_start + 1:
            raise PartitionError(f"a head/slot range must lie in one layer, got {fields}")
        if self.kind == "attention_heads" and not self.head_end:
            raise PartitionError("an attention_heads block needs a head range")


def model_units(
    n_layers: int,
    dim: int,
    n_heads: int,
    n_kv_heads: int,
    ffn_dim: int,
    vocab_size: int,
    tie_embeddings: bool = True,
    mlp_slices: int | None = None,
) -> list[Unit]:
    """The units of a Llama-style decoder's layers, in model order.

    Args:
        n_layers, dim, n_heads, n_kv_heads, ffn_dim: the model's sizes.
        vocab_size, tie_embeddings: accepted for a uniform signature; the
            embedding and head are the client's (see `client_params`).
        mlp_slices: MLP slices per layer; default ffn_dim / head_dim rounded,
            so one slice is about one head wide.
    Returns:
        n_layers * (n_heads + mlp_slices) units.
    Raises:
        PartitionError: a size is not positive, dim % n_heads or
            n_heads % n_kv_heads is not 0, or mlp_slices exceeds ffn_dim.
    """
    sizes = (n_layers, dim, n_heads, n_kv_heads, ffn_dim, vocab_size)
    if min(sizes) < 1 or dim % n_heads or n_heads % n_kv_heads:
        raise PartitionError(f"inconsistent (layers, dim, heads, kv, ffn, vocab): {sizes}")
    head_dim = dim // n_heads
    rep = n_heads // n_kv_heads
    if mlp_slices is None:
        mlp_slices = max(1, min(ffn_dim, round(ffn_dim / head_dim)))
    if not 1 <= mlp_slices <= ffn_dim:
        raise PartitionError(f"mlp_slices must be in 1..{ffn_dim}, got {mlp_slices}")
    units = []
    for layer in range(n_layers):
        for h in range(n_heads):
            params = 2 * dim * head_dim + 2 * dim * head_dim // rep + (dim if h == 0 else 0)
            units.append(Unit(layer, h, "head", h, params))
        for s in range(mlp_slices):
            columns = ffn_dim * (s + 1) // mlp_slices - ffn_dim * s // mlp_slices
            params = 3 * dim * columns + (dim if s == 0 else 0)
            units.append(Unit(layer, n_heads + s, "mlp", s, params))
    return units


def client_params(dim: int, vocab_size: int, tie_embeddings: bool = True) -> int:
    """Parameters the client keeps: embedding, final norm, LM head (once if tied)."""
    return vocab_size * dim * (1 if tie_embeddings else 2) + dim


@dataclass(frozen=True, slots=True)
class _Layer:
    """Units [lo, hi) of the list form layer `layer` of `params` parameters."""

    layer: int
    lo: int
    hi: int
    params: int


def _check_unit(i: int, u: Unit, prev: Unit | None) -> None:
    """Raise PartitionError unless u may follow prev inside one layer.

    Heads come first, then MLP slices, each numbered from 0, so an
    attention_heads block's slot range is its head range.
    """
    if not isinstance(u.params, int) or u.params < 1 or u.kind not in UNIT_KINDS:
        raise PartitionError(f"unit {i}: expected params >= 1 and kind in {UNIT_KINDS}, got {u}")
    same = prev is not None and prev.layer == u.layer
    if same and prev.kind == "mlp" and u.kind == "head":
        raise PartitionError(f"unit {i}: a head after an MLP slice in layer {u.layer}")
    want = prev.index + 1 if same and prev.kind == u.kind else 0
    if u.index != want:
        raise PartitionError(f"unit {i}: expected {u.kind} {want} in layer {u.layer}, got {u}")


def _layers(units: Sequence[Unit]) -> list[_Layer]:
    """Group the units by layer, checking model order.

    Raises:
        PartitionError: no units, a malformed unit (see `_check_unit`), layers
            not consecutive, or slots of a layer not 0, 1, 2, ... in order.
    """
    if not units:
        raise PartitionError("no units to partition")
    out: list[_Layer] = []
    for i, u in enumerate(units):
        _check_unit(i, u, units[i - 1] if i else None)
        if out and u.layer == out[-1].layer:
            if u.slot != i - out[-1].lo:
                raise PartitionError(f"unit {i}: expected slot {i - out[-1].lo}, got {u}")
            last = out[-1]
            out[-1] = _Layer(last.layer, last.lo, i + 1, last.params + u.params)
        elif u.slot != 0 or (out and u.layer != out[-1].layer + 1):
            raise PartitionError(f"unit {i}: expected slot 0 of the next layer, got {u}")
        else:
            out.append(_Layer(u.layer, i, i + 1, u.params))
    return out


def _pieces(units: Sequence[Unit], lo: int, hi: int, cap: int) -> list[tuple[int, int]]:
    """Greedy cut of units [lo, hi) into the fewest runs of at most cap each."""
    runs, start, acc = [], lo, 0
    for i in range(lo, hi):
        if acc and acc + units[i].params > cap:
            runs.append((start, i))
            start, acc = i, 0
        acc += units[i].params
    runs.append((start, hi))
    return runs


def _greedy(units: Sequence[Unit], layers: list[_Layer], cap: int) -> list[tuple[int, int]]:
    """Fewest sections of at most cap each, as unit ranges (cap >= every unit).

    Fitting layers are packed whole, greedily; a layer above cap is cut alone.
    Splitting a fitting layer never saves a section (its pieces merge back
    into one), so this count is the optimum for that cap.
    """
    runs: list[tuple[int, int]] = []
    start, acc = None, 0
    for g in layers:
        if g.params <= cap and start is not None and acc + g.params <= cap:
            acc += g.params
            continue
        if start is not None:
            runs.append((start, g.lo))
            start = None
        if g.params <= cap:
            start, acc = g.lo, g.params
        else:
            runs.extend(_pieces(units, g.lo, g.hi, cap))
    if start is not None:
        runs.append((start, layers[-1].hi))
    return runs


def _split_to(
    units: Sequence[Unit], pre: list[int], runs: list[tuple[int, int]], k: int
) -> list[tuple[int, int]]:
    """Split runs until there are k, never raising the largest.

    Runs of several whole layers are split first, at layer boundaries, so
    layers stay whole as long as k allows; then the largest layer or piece
    with two or more units is halved. Ties go to the earliest run.
    """
    runs = list(runs)
    while len(runs) < k:
        best = None
        for i, (s, e) in enumerate(runs):
            bounds = [c for c in range(s + 1, e) if units[c].slot == 0]
            many = bool(bounds) or (units[s].layer == units[e - 1].layer and e - s > 1)
            key = (bool(bounds), pre[e] - pre[s], -i)
            if many and (best is None or key > best[0]):
                best = (key, i, bounds or range(s + 1, e))
        _, i, cuts = best  # k <= len(units) guarantees a splittable run
        s, e = runs[i]
        # The cut that leaves the smaller larger half (earliest on ties).
        c = min(cuts, key=lambda c: (max(pre[c] - pre[s], pre[e] - pre[c]), c))
        runs[i : i + 1] = [(s, c), (c, e)]
    return runs


def _section(units: Sequence[Unit], pre: list[int], s: int, e: int) -> Section:
    """The Section for units [s, e)."""
    whole = units[s].slot == 0 and (e == len(units) or units[e].slot == 0)
    slots = (0, 0) if whole else (units[s].slot, units[e - 1].slot + 1)
    heads = not whole and all(u.kind == "head" for u in units[s:e])
    return Section(s, e, units[s].layer, units[e - 1].layer + 1, *slots, pre[e] - pre[s], heads)


@dataclass(frozen=True, slots=True)
class Partition:
    """k contiguous sections covering every unit once, in model order."""

    sections: tuple[Section, ...]
    total: int

    @property
    def k(self) -> int:
        """Number of sections."""
        return len(self.sections)

    @property
    def max_params(self) -> int:
        """Parameters of the largest section (the bottleneck)."""
        return max(s.params for s in self.sections)

    @property
    def imbalance(self) -> float:
        """Largest section over the mean section (1.0 is a perfect split)."""
        return self.max_params * self.k / self.total

    def blocks(self) -> list[BlockSpec]:
        """The blocks of one training step, in execution order.

        Forward of each section in model order, then backward of each in
        reverse. The forward of a heads-only piece is an "attention_heads"
        block (its output is a partial sum that the W^O aggregation adds up,
        eq. 9-10); its backward is a "backward" block over the same heads, so
        no two blocks of a step share an id.
        """

        def spec(kind: str, s: Section) -> BlockSpec:
            return BlockSpec(kind, s.layer_start, s.layer_end, s.slot_start, s.slot_end)

        forward = [spec("attention_heads" if s.heads_only else "forward", s) for s in self.sections]
        return forward + [spec("backward", s) for s in reversed(self.sections)]


def partition(units: Sequence[Unit], k: int) -> Partition:
    """Cut units into k contiguous sections with the smallest possible largest one.

    Sections are runs of whole layers or pieces of one layer (see the module
    docstring). Binary search over the bottleneck with a greedy count, about
    n * log2(total) steps for n units, then up to k - 1 splits of O(n) each.

    Args:
        units: the model's units in model order (`model_units`).
        k: number of sections, 1 <= k <= len(units).
    Returns:
        The partition.
    Raises:
        PartitionError: k out of range, or units empty, out of order or with
            a parameter count below 1.
    """
    layers = _layers(units)
    if not isinstance(k, int) or not 1 <= k <= len(units):
        raise PartitionError(f"k must be in 1..{len(units)} (the unit count), got {k!r}")
    pre = [0]
    for u in units:
        pre.append(pre[-1] + u.params)
    total = pre[-1]
    lo, hi = max(max(u.params for u in units), -(-total // k)), total
    while lo < hi:
        mid = (lo + hi) // 2
        if len(_greedy(units, layers, mid)) <= k:
            hi = mid
        else:
            lo = mid + 1
    runs = _split_to(units, pre, _greedy(units, layers, lo), k)
    return Partition(tuple(_section(units, pre, s, e) for s, e in runs), total)
