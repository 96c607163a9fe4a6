"""compute.partition: unit counts, optimal contiguous sections, block specs and ids."""

from __future__ import annotations

import itertools
import time

import pytest
from hypothesis import given, settings, strategies as st

from compute.config import ModelConfig
from compute.errors import ComputeError
from compute.partition import (
    KINDS, BlockSpec, Partition, PartitionError, Unit, client_params, model_units, partition,
)

SMOL = dict(n_layers=30, dim=576, n_heads=9, n_kv_heads=3, ffn_dim=1536, vocab_size=49152)
SMOL_LAYER = 576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536 + 2 * 576  # 3,540,096


def units_of(layers: list[list[int]]) -> list[Unit]:
    """Units from per-layer lists of parameter counts (all called heads)."""
    return [Unit(i, s, "head", s, p) for i, sizes in enumerate(layers) for s, p in enumerate(sizes)]


def section_is_valid(units: list[Unit], s: int, e: int) -> bool:
    """A run of whole layers, or units of one layer only."""
    whole = units[s].slot == 0 and (e == len(units) or units[e].slot == 0)
    return whole or units[s].layer == units[e - 1].layer


def brute_force(units: list[Unit], k: int, constrained: bool) -> int:
    """Smallest possible largest section over all ways to cut (valid ones only if constrained)."""
    n, best = len(units), None
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        pairs = list(zip(bounds, bounds[1:]))
        if constrained and not all(section_is_valid(units, s, e) for s, e in pairs):
            continue
        worst = max(sum(u.params for u in units[s:e]) for s, e in pairs)
        best = worst if best is None else min(best, worst)
    return best


one_layer = st.lists(st.integers(1, 30), min_size=1, max_size=4)
layer_lists = st.lists(one_layer, min_size=1, max_size=5).filter(lambda ls: sum(map(len, ls)) <= 9)


@st.composite
def units_and_k(draw):
    units = units_of(draw(layer_lists))
    return units, draw(st.integers(1, len(units)))


def assert_well_formed(units: list[Unit], p: Partition, k: int) -> None:
    """Exactly k sections tiling the units in order, each valid and self-consistent."""
    assert p.k == k and p.total == sum(u.params for u in units)
    assert [s.start for s in p.sections] == [0] + [s.end for s in p.sections[:-1]]
    assert p.sections[-1].end == len(units)
    for sec in p.sections:
        part = units[sec.start:sec.end]
        assert part and sec.params == sum(u.params for u in part)
        assert section_is_valid(units, sec.start, sec.end)
        assert (sec.layer_start, sec.layer_end) == (part[0].layer, part[-1].layer + 1)
        if not sec.whole_layers:
            assert (sec.slot_start, sec.slot_end) == (part[0].slot, part[-1].slot + 1)
            assert sec.layer_end == sec.layer_start + 1


# --- optimality and coverage ---------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(units_and_k())
def test_partition_is_optimal_among_valid_cuts(case):
    units, k = case
    p = partition(units, k)
    assert_well_formed(units, p, k)
    assert p.max_params == brute_force(units, k, constrained=True)
    assert p.max_params >= brute_force(units, k, constrained=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=9), st.data())
def test_one_unit_layers_match_the_unconstrained_optimum(sizes, data):
    units = units_of([[p] for p in sizes])
    k = data.draw(st.integers(1, len(units)))
    assert partition(units, k).max_params == brute_force(units, k, constrained=False)


@settings(max_examples=300, deadline=None)
@given(units_and_k())
def test_layers_are_cut_only_when_needed(case):
    """A cut layer is above the bottleneck, or no section holds two or more layers."""
    units, k = case
    p = partition(units, k)
    multi = any(s.layer_end - s.layer_start > 1 for s in p.sections)
    for sec in p.sections:
        if not sec.whole_layers:
            layer = sum(u.params for u in units if u.layer == sec.layer_start)
            assert layer > p.max_params or not multi


@settings(max_examples=200, deadline=None)
@given(units_and_k())
def test_partition_is_deterministic_and_blocks_are_unique(case):
    units, k = case
    p = partition(units, k)
    assert partition(list(units), k) == p
    blocks = p.blocks()
    assert len(blocks) == 2 * k
    assert len(set(blocks)) == 2 * k
    assert [b.kind != "backward" for b in blocks] == [True] * k + [False] * k


def test_every_k_on_a_mixed_model_is_well_formed():
    units = units_of([[5, 1, 1], [2], [9, 9], [1, 1, 1, 1], [3, 4]])
    for k in range(1, len(units) + 1):
        assert_well_formed(units, partition(units, k), k)


def test_large_inputs_are_fast():
    units = model_units(**{**SMOL, "n_layers": 64}, mlp_slices=24)  # 2112 units
    start = time.perf_counter()
    for k in (7, 64, 200, 2112):
        assert_well_formed(units, partition(units, k), k)
    assert time.perf_counter() - start < 5


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, -1, 4, 2.0, None])
def test_k_out_of_range_is_refused(k):
    with pytest.raises(PartitionError):
        partition(units_of([[1, 2], [3]]), k)


@pytest.mark.parametrize("units", [
    [],
    units_of([[1, 0]]),
    [Unit(0, 1, "head", 0, 5)],  # slot 1 first
    [Unit(0, 0, "head", 0, 5), Unit(2, 0, "head", 0, 5)],  # layer 1 missing
    [Unit(0, 0, "head", 0, 5), Unit(0, 2, "head", 2, 5)],  # slot 1 missing
    [Unit(1, 0, "head", 0, 5), Unit(0, 0, "head", 0, 5)],  # out of order
    [Unit(0, 0, "attn", 0, 5)],  # unknown kind
    [Unit(0, 0, "mlp", 0, 5), Unit(0, 1, "head", 0, 5)],  # head after MLP
    [Unit(0, 0, "head", 0, 5), Unit(0, 1, "head", 2, 5)],  # head 1 missing
    [Unit(0, 0, "head", 0, 5), Unit(0, 1, "mlp", 1, 5)],  # MLP slice 0 missing
])
def test_malformed_units_are_refused(units):
    with pytest.raises(PartitionError) as info:
        partition(units, 1)
    assert isinstance(info.value, ComputeError)


# --- model_units ---------------------------------------------------------------------------


def test_smollm2_counts():
    units = model_units(**SMOL)
    assert len(units) == 30 * (9 + 24)  # default: 24 slices of 64 columns
    layer0 = [u for u in units if u.layer == 0]
    assert sum(u.params for u in layer0) == SMOL_LAYER == 3_540_096
    heads = [u.params for u in layer0 if u.kind == "head"]
    assert heads == [576 * 64 * 2 + 576 * 64 * 2 // 3 + 576] + [98_304] * 8
    assert [u.slot for u in layer0] == list(range(33))
    assert sum(u.params for u in units) == 106_202_880
    assert client_params(576, 49152, True) == 28_312_128
    assert sum(u.params for u in units) + client_params(576, 49152) == 134_515_008  # "135M"


def test_uneven_mlp_slices_spread_columns():
    units = model_units(1, 8, 2, 1, 10, 5, mlp_slices=3)
    mlp = [u.params for u in units if u.kind == "mlp"]
    assert mlp == [3 * 8 * 3 + 8, 3 * 8 * 3, 3 * 8 * 4]  # columns [0, 3), [3, 6), [6, 10)


@pytest.mark.parametrize("tie", [True, False])
def test_counts_match_the_torch_model(tie):
    model = pytest.importorskip("compute.model")
    cfg = ModelConfig(vocab_size=50, dim=24, n_layers=3, n_heads=6, n_kv_heads=2, ffn_dim=40,
                      tie_embeddings=tie)
    net = model.Transformer(cfg)
    units = model_units(3, 24, 6, 2, 40, 50, tie, mlp_slices=7)
    for i in range(3):
        layer = sum(p.numel() for p in net.layer(i).parameters())
        assert sum(u.params for u in units if u.layer == i) == layer
    everything = sum(p.numel() for p in net.parameters())  # a tied head is counted once
    assert sum(u.params for u in units) + client_params(24, 50, tie) == everything


@pytest.mark.parametrize("args", [
    (0, 576, 9, 3, 1536, 49152), (30, 576, 7, 1, 1536, 49152), (30, 576, 9, 2, 1536, 49152),
    (30, 576, 9, 3, 0, 49152),
])
def test_bad_model_sizes_are_refused(args):
    with pytest.raises(PartitionError):
        model_units(*args)


@pytest.mark.parametrize("slices", [0, 11])
def test_bad_mlp_slices_are_refused(slices):
    with pytest.raises(PartitionError):
        model_units(1, 8, 2, 1, 10, 5, mlp_slices=slices)


# --- SmolLM2-135M partitions ---------------------------------------------------------------


def label(s) -> str:
    if s.whole_layers:
        return f"{s.layer_start}-{s.layer_end - 1}"
    return f"{s.layer_start}[{s.slot_start}:{s.slot_end}]"


@pytest.mark.parametrize("k, labels, imbalance", [
    (1, ["0-29"], 1.0),
    (2, ["0-14", "15-29"], 1.0),
    (3, ["0-9", "10-19", "20-29"], 1.0),
    (4, ["0-7", "8-15", "16-23", "24-29"], 8 / 7.5),
    (8, ["0-3", "4-7", "8-11", "12-15", "16-19", "20-23", "24-27", "28-29"], 4 / 3.75),
    (30, [f"{i}-{i}" for i in range(30)], 1.0),
    (60, [f"{i}[{a}:{b}]" for i in range(30) for a, b in ((0, 17), (17, 33))],
     1_770_624 / 1_770_048),
])
def test_smollm2_partitions(k, labels, imbalance):
    p = partition(model_units(**SMOL), k)
    assert [label(s) for s in p.sections] == labels
    assert p.imbalance == pytest.approx(imbalance, rel=1e-12)


def test_head_only_pieces_become_attention_head_blocks():
    p = partition(model_units(**SMOL), 61)  # one layer must go in three
    assert [label(s) for s in p.sections[:3]] == ["0[0:9]", "0[9:17]", "0[17:33]"]
    assert p.sections[0].heads_only and not p.sections[1].heads_only
    blocks = p.blocks()
    assert blocks[0] == BlockSpec("attention_heads", 0, 1, 0, 9)
    assert blocks[1] == BlockSpec("forward", 0, 1, 9, 17)
    assert blocks[-1] == BlockSpec("backward", 0, 1, 0, 9)
    assert blocks[61] == BlockSpec("backward", 29, 30, 17, 33)


def test_blocks_of_whole_layers():
    p = partition(model_units(**SMOL), 3)
    assert p.blocks() == [
        BlockSpec("forward", 0, 10), BlockSpec("forward", 10, 20), BlockSpec("forward", 20, 30),
        BlockSpec("backward", 20, 30), BlockSpec("backward", 10, 20), BlockSpec("backward", 0, 10),
    ]


# --- block specs ----------------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ("sideways", 0, 1, 0, 0), ("forward", 1, 1, 0, 0), ("forward", 2, 1, 0, 0),
    ("forward", 0, 1, 3, 2), ("forward", 0, 2, 0, 1), ("attention_heads", 0, 1, 0, 0),
    ("forward", -1, 1, 0, 0), ("forward", 0, 2**32, 0, 0), ("forward", 0, 1.0, 0, 0),
    ("backward", 2, 3, 1, 1),
])
def test_bad_block_specs_are_refused(args):
    with pytest.raises(PartitionError):
        BlockSpec(*args)


def test_kinds_have_the_documented_codes():
    assert KINDS == ("forward", "backward", "attention_heads")
