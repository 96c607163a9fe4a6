"""compute.blocks: chained blocks reproduce the whole model (logits and gradients), eq. 9-10.

References are independent of the block code: the model's own forward
(`Transformer.forward`, itself checked against transformers in
test_model.py), torch autograd over the whole stack of layers, and the
model's own attention and MLP modules.

Tolerances (float32, measured on this machine, asserted with room):
- whole-layer sections: bit-identical to the model (same kernels, same order);
- pieces of layers: |logits diff| <= 1e-4 on the tiny model (logits up to ~9,
  measured 8e-6) and <= 5e-4 on SmolLM2 (logits up to ~34, measured 5e-5);
  gradients: max |diff| <= 2e-5 * max |reference| per tensor (measured 3.5e-6).
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from compute.blocks import (
    BlockError,
    Partial,
    aggregate_grads,
    aggregate_heads,
    aggregate_mlp,
    attention_heads_block,
    backward_block,
    forward_block,
    mlp_slices_block,
    mlp_slices_of,
    model_partition,
    piece_of,
)
from compute.errors import ComputeError, DeviceError, ShapeError
from compute.partition import BlockSpec
from compute.train import backward_chain, forward_chain, stages
from tests.compute.helpers import ATOL, TINY, random_ids, tiny_model

SMOL_ATOL = 5e-4
GRAD_RTOL = 2e-5
UNITS = TINY.n_layers * (TINY.n_heads + 10)  # 10 MLP slices per layer (ffn 160 / head 16)
# 1, 2: whole layers; 3: layer 0 in two mixed pieces; 5: an attention_heads block
# and mixed pieces; UNITS: every head and every MLP slice its own section.
KS = (1, 2, 3, 5, UNITS)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return tiny_model(torch.Generator().manual_seed(7))


@pytest.fixture(scope="module")
def hidden(model):
    ids = random_ids(torch.Generator().manual_seed(8), (2, 24))
    with torch.no_grad():
        return model.embed(ids)


def specs(model, k, direction="forward"):
    """A partition's forward (or backward) blocks, in model order."""
    blocks = model_partition(model, k).blocks()
    return blocks[:k] if direction == "forward" else blocks[k:][::-1]


def whole_layers(model, k) -> bool:
    return all(not s.head_end for s in specs(model, k))


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def test_default_mlp_slices_match_the_partition(model):
    assert mlp_slices_of(model) == 10
    assert model_partition(model, UNITS).k == UNITS


@pytest.mark.parametrize("k", KS)
def test_chained_forward_blocks_reproduce_the_logits(model, hidden, k):
    with torch.no_grad():
        reference = model.head(model.run_layers(hidden, 0, TINY.n_layers))
        out, saved = forward_chain(model, specs(model, k), hidden)
        logits = model.head(out)
    assert len(saved) == len(stages(model, specs(model, k)))
    if whole_layers(model, k):
        assert torch.equal(logits, reference)
    else:
        assert (logits - reference).abs().max().item() <= ATOL


@pytest.mark.parametrize("k", KS)
def test_chained_backward_blocks_reproduce_autograd(model, hidden, k):
    grad_out = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(9))
    layer_params = {n: p for n, p in model.named_parameters() if n.startswith("layers.")}
    x = hidden.detach().requires_grad_(True)
    out = model.run_layers(x, 0, TINY.n_layers)
    ref = torch.autograd.grad(out, [x, *layer_params.values()], grad_out)
    with torch.no_grad():
        _, saved = forward_chain(model, specs(model, k), hidden)
    grad_in, grads = backward_chain(model, specs(model, k, "backward"), saved, grad_out)
    assert set(grads) == set(layer_params)
    pairs = [(grad_in, ref[0])] + [(grads[n], g) for n, g in zip(layer_params, ref[1:])]
    for got, want in pairs:
        if whole_layers(model, k):
            assert torch.equal(got, want)
        else:
            assert rel_err(got, want) <= GRAD_RTOL
    assert all(p.grad is None for p in model.parameters())  # pure: .grad untouched


def test_head_groups_and_aggregation_reproduce_attention(model, hidden):
    block = model.layer(1)
    with torch.no_grad():
        reference = hidden + block.attn(block.attn_norm(hidden), 0, None)
    # Groups cut across KV heads (2 query heads per KV head).
    partials = [attention_heads_block(model, 1, a, b, hidden) for a, b in ((0, 1), (1, 3), (3, 4))]
    got = aggregate_heads(model, 1, partials, hidden)
    assert rel_err(got, reference) <= 1e-5
    assert torch.equal(aggregate_heads(model, 1, partials[::-1], hidden), got)  # order-free


def test_mlp_slices_and_aggregation_reproduce_the_mlp(model, hidden):
    block = model.layer(0)
    with torch.no_grad():
        reference = hidden + block.mlp(block.mlp_norm(hidden))
    partials = [mlp_slices_block(model, 0, a, b, hidden) for a, b in ((0, 3), (3, 4), (4, 10))]
    assert rel_err(aggregate_mlp(model, 0, partials, hidden), reference) <= 1e-5


def test_smollm2_chained_pieces_reproduce_the_logits(smol):
    """k = 150: layers in 5 pieces, e.g. heads [0, 7) (cutting KV head 2), heads 7-8 + slices 0-4.

    The one SmolLM2 check: real sizes (9 heads over 3 KV heads, 24 MLP slices).
    """
    draw = torch.Generator().manual_seed(3)
    ids = torch.randint(0, smol.config.vocab_size, (1, 16), generator=draw)
    forward = specs(smol, 150)
    first = [(s.head_start, s.head_end) for s in forward if s.layer_start == 0]
    assert first[:2] == [(0, 7), (7, 14)]
    with torch.no_grad():
        reference = smol(ids)
        out, _ = forward_chain(smol, forward, smol.embed(ids))
        logits = smol.head(out)
    assert (logits - reference).abs().max().item() <= SMOL_ATOL
    assert torch.equal(logits.argmax(-1), reference.argmax(-1))


def test_blocks_are_bit_identical_across_runs(model, hidden):
    piece = BlockSpec("forward", 0, 1, 2, 9)  # heads 2-3 and MLP slices 0-4
    whole = BlockSpec("forward", 0, 2)
    for spec, half in ((whole, None), (piece, "attention"), (piece, "mlp")):
        once, twice = (forward_block(model, spec, hidden, half=half) for _ in range(2))
        assert torch.equal(once, twice)
        back = dataclasses.replace(spec, kind="backward")
        g = torch.ones_like(hidden)
        (gi1, w1), (gi2, w2) = (backward_block(model, back, hidden, g, half=half) for _ in range(2))
        assert torch.equal(gi1, gi2) and w1.keys() == w2.keys()
        assert all(torch.equal(w1[n], w2[n]) for n in w1)


def test_piece_weight_grads_touch_only_what_the_piece_reads(model, hidden):
    spec = BlockSpec("backward", 1, 2, 1, 2)  # query head 1 alone (KV head 0)
    _, grads = backward_block(model, spec, hidden, torch.ones_like(hidden))
    hd, nh = TINY.head_dim, TINY.n_heads
    wqkv = grads["layers.1.attn.wqkv.weight"]
    rows = wqkv.abs().sum(1).nonzero().flatten().tolist()
    assert rows == list(range(hd, 2 * hd)) + list(range(nh * hd, (nh + 1) * hd)) + list(
        range((nh + 2) * hd, (nh + 3) * hd)
    )
    cols = grads["layers.1.attn.wo.weight"].abs().sum(0).nonzero().flatten().tolist()
    assert cols == list(range(hd, 2 * hd))


def test_piece_of_splits_slots_into_heads_and_slices(model):
    assert piece_of(model, BlockSpec("forward", 0, 2)) is None
    p = piece_of(model, BlockSpec("forward", 1, 2, 3, 7))
    assert (p.layer, p.head_start, p.head_end, p.slice_start, p.slice_end) == (1, 3, 4, 0, 3)
    assert p.halves == ("attention", "mlp")
    assert piece_of(model, BlockSpec("forward", 0, 1, 5, 14)).halves == ("mlp",)


def test_errors_say_what_was_expected(model, hidden):
    with pytest.raises(BlockError, match="kind"):
        forward_block(model, BlockSpec("backward", 0, 1), hidden)
    with pytest.raises(BlockError, match="kind 'backward'"):
        backward_block(model, BlockSpec("forward", 0, 1), hidden, hidden)
    with pytest.raises(BlockError, match="half"):
        forward_block(model, BlockSpec("forward", 0, 1, 2, 9), hidden)  # both halves, none named
    with pytest.raises(BlockError, match="slots"):
        forward_block(model, BlockSpec("forward", 0, 1, 0, 15), hidden)
    with pytest.raises(BlockError, match="layers"):
        forward_block(model, BlockSpec("forward", 0, 3), hidden)
    with pytest.raises(ShapeError, match="expected hidden states"):
        forward_block(model, BlockSpec("forward", 0, 1), hidden[..., :8])
    with pytest.raises(ShapeError, match="grad_out"):
        backward_block(model, BlockSpec("backward", 0, 1), hidden, hidden[:1])
    with pytest.raises(BlockError, match="heads"):
        attention_heads_block(model, 0, 2, 5, hidden)


def test_aggregation_refuses_gaps_overlaps_and_other_layers(model, hidden):
    p = [attention_heads_block(model, 0, a, b, hidden) for a, b in ((0, 2), (2, 4))]
    for bad in ([p[0]], [p[0], p[0], p[1]], [p[0], Partial(1, "attention", 2, 4, p[1].out)]):
        with pytest.raises(BlockError, match="partials"):
            aggregate_heads(model, 0, bad, hidden)
    assert issubclass(BlockError, ComputeError)


def test_aggregation_checks_each_partial_dtype_and_device(model, hidden):
    p = [attention_heads_block(model, 0, a, b, hidden) for a, b in ((0, 2), (2, 4))]
    as_double = Partial(0, "attention", 2, 4, p[1].out.double())
    with pytest.raises(ShapeError, match=r"torch.float32, got .* torch.float64 for \[2, 4\)"):
        aggregate_heads(model, 0, [p[0], as_double], hidden)
    elsewhere = Partial(0, "attention", 2, 4, torch.empty(p[1].out.shape, device="meta"))
    with pytest.raises(DeviceError, match=r"on cpu, got meta for \[2, 4\)"):
        aggregate_heads(model, 0, [p[0], elsewhere], hidden)
    m = mlp_slices_of(model)
    mlp = Partial(0, "mlp", 0, m, p[0].out.half())
    with pytest.raises(ShapeError, match="float16"):
        aggregate_mlp(model, 0, [mlp], hidden)


def test_aggregate_grads_refuses_no_shares_and_misfits(hidden):
    with pytest.raises(BlockError, match="at least one share"):
        aggregate_grads(hidden, [])
    with pytest.raises(ShapeError, match="share 1"):
        aggregate_grads(hidden, [hidden, hidden[:1]])
    with pytest.raises(ShapeError, match="share 0 .* torch.float64"):
        aggregate_grads(hidden, [hidden.double()])
    with pytest.raises(DeviceError, match="share 0 on cpu, got meta"):
        aggregate_grads(hidden, [torch.empty(hidden.shape, device="meta")])
    assert torch.equal(aggregate_grads(hidden, [hidden, hidden]), hidden + (hidden + hidden))


def test_stages_refuse_incomplete_layers(model):
    forward = specs(model, 3)
    with pytest.raises(BlockError, match="tiling"):
        stages(model, forward[1:])
    with pytest.raises(BlockError, match="from layer"):
        stages(model, [BlockSpec("forward", 0, 1), BlockSpec("forward", 0, 2)])


def test_random_tilings_of_a_layer_reproduce_it(model, hidden):
    """Any cut of a layer's 14 slots into pieces composes to the layer (seeded draws)."""
    draw = random.Random(11)
    with torch.no_grad():
        reference = model.run_layers(hidden, 1, 2)
    for _ in range(5):
        cuts = sorted(draw.sample(range(1, 14), draw.randint(1, 6)))
        bounds = [0, *cuts, 14]
        stage = [BlockSpec("forward", 1, 2, a, b) for a, b in zip(bounds, bounds[1:])]
        out, _ = forward_chain(model, stage, hidden)
        assert rel_err(out, reference) <= 1e-5
