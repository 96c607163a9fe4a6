"""Block executors: forward, backward and attention-head blocks (ARCHITECTURE.md, compute).

Owns how one compute block of a training step (a `BlockSpec` of
compute/partition.py) runs: pure functions of (weights, inputs) that keep no
state between calls (compute/train.py chains them into a step). Positions
start at 0 and there is no KV cache: these are training blocks over whole
sequences.

Whole layers. A spec over layers [s, e) maps the states entering layer s to
those leaving layer e-1, exactly as `Transformer.run_layers`.

Pieces of a layer (eq. 9-10). A spec with slots [p, q) inside layer L holds
query heads [p, q) & [0, H) and MLP slices [p - H, q - H) & [0, M) (H query
heads, M slices, `mlp_slices_of`). The layer, h_mid = h + attn(norm1(h)),
h_out = h_mid + mlp(norm2(h_mid)), splits into two halves, each a sum:

    attention: partial_g = heads_g(norm1(h)) @ W^O[:, cols_g]^T           (B, T, C)
               h_mid = h + sum_g partial_g                     `aggregate_heads`
    MLP:       partial_s = (silu(x @ gate_s^T) * (x @ up_s^T)) @ down[:, f_s]^T,
               x = norm2(h_mid)                                          (B, T, C)
               h_out = h_mid + sum_s partial_s                 `aggregate_mlp`

heads_g are the attention outputs of the group's query heads, each over its
own KV head (a piece computes the k/v rows of the KV heads its heads use);
cols_g their W^O columns; f_s = [F*s // M, F*(s+1) // M) the ffn columns of
slice s. A piece with heads and slices runs in both halves: its block is
called with half="attention" (input h) and half="mlp" (input h_mid). Sums
add partials in slot order whatever order they arrive in.

Backward. `backward_block` re-runs the block's forward from its input under
autograd and returns the input gradient and the weight gradients, keyed by
parameter name ("layers.3.attn.wqkv.weight"), full-shaped: for a piece,
non-zero only where it reads (q rows, its KV heads' k/v rows, W^O or down
columns, the norm), so a layer's pieces' gradients add up to the layer's.
A piece's input gradient is its share; `aggregate_grads` adds the residual:
dL/dh = dL/dh_mid + sum_g share_g.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch.func import functional_call

from compute.errors import ComputeError, DeviceError, ShapeError
from compute.model import DecoderLayer, Transformer
from compute.partition import BlockSpec, Partition, model_units, partition

HALVES = ("attention", "mlp")
HALF_PARAMS = {
    "attention": ("attn_norm.weight", "attn.wqkv.weight", "attn.wo.weight"),
    "mlp": ("mlp_norm.weight", "mlp.w_gate_up.weight", "mlp.w_down.weight"),
}
FORWARD_KINDS = ("forward", "attention_heads")
Grads = dict[str, torch.Tensor]
Weights = dict[str, torch.Tensor]


class BlockError(ComputeError, ValueError):
    """A block spec, half or set of partials does not fit the model."""


def mlp_slices_of(model: Transformer, mlp_slices: int | None = None) -> int:
    """MLP slices per layer: `mlp_slices`, or the default of `model_units`.

    Raises:
        BlockError: mlp_slices outside 1..ffn_dim.
    """
    cfg = model.config
    if mlp_slices is None:
        one = model_units(1, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim, cfg.vocab_size)
        return len(one) - cfg.n_heads
    if isinstance(mlp_slices, bool) or not 1 <= mlp_slices <= cfg.ffn_dim:
        raise BlockError(f"expected mlp_slices in 1..{cfg.ffn_dim}, got {mlp_slices!r}")
    return mlp_slices


def model_partition(model: Transformer, k: int, mlp_slices: int | None = None) -> Partition:
    """The model's layers cut into k sections (`compute.partition.partition`)."""
    c = model.config
    m = mlp_slices_of(model, mlp_slices)
    units = model_units(
        c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.ffn_dim, c.vocab_size, c.tie_embeddings, m
    )
    return partition(units, k)


@dataclass(frozen=True, slots=True)
class Piece:
    """What a slot-range spec holds of its layer: heads and MLP slices, half-open ranges."""

    layer: int
    head_start: int
    head_end: int
    slice_start: int
    slice_end: int

    @property
    def halves(self) -> tuple[str, ...]:
        """The halves of the layer the piece takes part in, in execution order."""
        sizes = (self.head_end - self.head_start, self.slice_end - self.slice_start)
        return tuple(half for half, n in zip(HALVES, sizes) if n)

    def span(self, half: str) -> tuple[int, int]:
        """The piece's heads (attention) or MLP slices (mlp), half-open."""
        if half == "attention":
            return self.head_start, self.head_end
        return self.slice_start, self.slice_end


def piece_of(model: Transformer, spec: BlockSpec, mlp_slices: int | None = None) -> Piece | None:
    """The piece a spec holds, or None for a spec of whole layers.

    Raises:
        BlockError: layers beyond the model, or slots beyond H + M.
    """
    cfg = model.config
    if spec.layer_end > cfg.n_layers:
        raise BlockError(f"expected layers within 0..{cfg.n_layers}, got {spec}")
    if not spec.head_end:
        return None
    h, m = cfg.n_heads, mlp_slices_of(model, mlp_slices)
    if spec.head_end > h + m:
        raise BlockError(f"expected slots within {h} heads + {m} MLP slices, got {spec}")
    lo, hi = spec.head_start, spec.head_end
    return Piece(spec.layer_start, min(lo, h), min(hi, h), max(lo, h) - h, max(hi, h) - h)


@dataclass(frozen=True, slots=True, eq=False)
class Partial:
    """A piece's term of one half of a layer: out (B, T, C) of heads or slices [start, end)."""

    layer: int
    half: str
    start: int
    end: int
    out: torch.Tensor


def _check_hidden(model: Transformer, h: torch.Tensor) -> None:
    """Raise unless h is (B, T, C), 0 < T <= max_seq_len, with the weights' dtype and device."""
    cfg, w = model.config, model.norm.weight
    t_ok = h.dim() == 3 and 0 < h.shape[1] <= cfg.max_seq_len
    if not t_ok or h.shape[2] != cfg.dim or h.dtype != w.dtype:
        raise ShapeError(
            f"expected hidden states (B, 1..{cfg.max_seq_len}, {cfg.dim}) {w.dtype}, "
            f"got {tuple(h.shape)} {h.dtype}"
        )
    if h.device != w.device:
        raise DeviceError(f"weights are on {w.device}, hidden states on {h.device}")


def _heads_out(
    block: DecoderLayer, w: Weights, a: int, b: int, h: torch.Tensor
) -> torch.Tensor:
    """Query heads [a, b) of a layer through their W^O columns: (B, T, C) -> (B, T, C)."""
    attn = block.attn
    nh, nkv, hd = attn.n_heads, attn.n_kv_heads, attn.head_dim
    rep, (bsz, t, _) = nh // nkv, h.shape
    g0, g1 = a // rep, (b - 1) // rep + 1  # the KV heads these query heads use
    norm_w, wqkv = w["attn_norm.weight"], w["attn.wqkv.weight"]
    x = F.rms_norm(h, norm_w.shape, norm_w, block.attn_norm.eps)  # (B, T, C)
    q = F.linear(x, wqkv[a * hd : b * hd]).view(bsz, t, b - a, hd)
    k = F.linear(x, wqkv[(nh + g0) * hd : (nh + g1) * hd]).view(bsz, t, g1 - g0, hd)
    v = F.linear(x, wqkv[(nh + nkv + g0) * hd : (nh + nkv + g1) * hd]).view(bsz, t, g1 - g0, hd)
    qk = attn.rope(torch.cat((q, k), dim=2), 0)  # (B, T, nq + ng, hd)
    group = torch.arange(a, b, device=h.device) // rep - g0  # KV head of each query head
    q = qk[:, :, : b - a].transpose(1, 2)  # (B, nq, T, hd)
    k = qk[:, :, b - a :].transpose(1, 2).index_select(1, group)  # (B, nq, T, hd)
    v = v.transpose(1, 2).index_select(1, group)  # (B, nq, T, hd)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nq, T, hd)
    y = y.transpose(1, 2).reshape(bsz, t, (b - a) * hd)  # (B, T, nq hd)
    return F.linear(y, w["attn.wo.weight"][:, a * hd : b * hd])  # (B, T, C)


def _mlp_out(
    block: DecoderLayer, w: Weights, f0: int, f1: int, h: torch.Tensor
) -> torch.Tensor:
    """ffn columns [f0, f1) of a layer's SwiGLU MLP: (B, T, C) -> (B, T, C)."""
    ffn = block.mlp.w_down.in_features
    norm_w, w_gu = w["mlp_norm.weight"], w["mlp.w_gate_up.weight"]
    x = F.rms_norm(h, norm_w.shape, norm_w, block.mlp_norm.eps)  # (B, T, C)
    gate = F.linear(x, w_gu[f0:f1])  # (B, T, f1 - f0)
    up = F.linear(x, w_gu[ffn + f0 : ffn + f1])  # (B, T, f1 - f0)
    return F.linear(F.silu(gate) * up, w["mlp.w_down.weight"][:, f0:f1])  # (B, T, C)


def _half_out(
    model: Transformer, piece: Piece, half: str, h: torch.Tensor, m: int, w: Weights
) -> torch.Tensor:
    """The piece's partial (B, T, C) of one half, with the layer's weights w (local names)."""
    block = model.layers[piece.layer]
    if half == "attention":
        return _heads_out(block, w, piece.head_start, piece.head_end, h)
    ffn = model.config.ffn_dim
    return _mlp_out(block, w, ffn * piece.slice_start // m, ffn * piece.slice_end // m, h)


def _half(piece: Piece, half: str | None) -> str:
    """The half to run: the one given, or the piece's only one."""
    if half is None and len(piece.halves) == 1:
        return piece.halves[0]
    if half not in piece.halves:
        raise BlockError(f"expected half in {piece.halves} for {piece}, got {half!r}")
    return half


def _partial(model: Transformer, piece: Piece, half: str, h: torch.Tensor, m: int) -> Partial:
    """Run one half of a piece without autograd and wrap the result."""
    _check_hidden(model, h)
    with torch.no_grad():
        w = dict(model.layers[piece.layer].named_parameters())
        out = _half_out(model, piece, half, h, m, w)
    return Partial(piece.layer, half, *piece.span(half), out)


def attention_heads_block(
    model: Transformer, layer: int, head_start: int, head_end: int, hidden: torch.Tensor
) -> Partial:
    """Heads [head_start, head_end) of a layer's attention, through their W^O columns (eq. 9).

    Args:
        model: the weights.
        layer: layer index.
        head_start, head_end: query heads, 0 <= start < end <= n_heads.
        hidden: the states entering the layer, (B, T, C).
    Returns:
        Partial(layer, "attention", head_start, head_end, out (B, T, C)).
    Raises:
        BlockError: layer or heads out of range.
        ShapeError, DeviceError: hidden does not fit the model.
    """
    cfg = model.config
    if not (0 <= layer < cfg.n_layers and 0 <= head_start < head_end <= cfg.n_heads):
        raise BlockError(
            f"expected layer in 0..{cfg.n_layers - 1} and heads 0 <= a < b <= {cfg.n_heads}, "
            f"got layer {layer} heads [{head_start}, {head_end})"
        )
    return _partial(model, Piece(layer, head_start, head_end, 0, 0), "attention", hidden, 1)


def mlp_slices_block(
    model: Transformer, layer: int, slice_start: int, slice_end: int, hidden: torch.Tensor,
    *, mlp_slices: int | None = None,
) -> Partial:
    """MLP slices [slice_start, slice_end) of a layer: their part of the down projection.

    Args:
        hidden: h_mid, the layer's states after attention, (B, T, C).
        mlp_slices: M (default: `mlp_slices_of`).
    Returns:
        Partial(layer, "mlp", slice_start, slice_end, out (B, T, C)).
    Raises:
        As `attention_heads_block`.
    """
    m = mlp_slices_of(model, mlp_slices)
    if not (0 <= layer < model.config.n_layers and 0 <= slice_start < slice_end <= m):
        raise BlockError(
            f"expected layer in 0..{model.config.n_layers - 1} and slices 0 <= a < b <= {m}, "
            f"got layer {layer} slices [{slice_start}, {slice_end})"
        )
    return _partial(model, Piece(layer, 0, 0, slice_start, slice_end), "mlp", hidden, m)


def _aggregate(
    model: Transformer, layer: int, half: str, partials: Sequence[Partial], hidden: torch.Tensor,
    n: int,
) -> torch.Tensor:
    """hidden + the partials of one half, which must tile units [0, n) of the layer."""
    _check_hidden(model, hidden)
    ordered, at = sorted(partials, key=lambda p: p.start), 0
    for p in ordered:
        if p.layer != layer or p.half != half or p.start != at or p.end <= p.start:
            raise BlockError(
                f"expected {half} partials of layer {layer} tiling [0, {n}); "
                f"at {at} got layer {p.layer} {p.half} [{p.start}, {p.end})"
            )
        if p.out.shape != hidden.shape or p.out.dtype != hidden.dtype:
            raise ShapeError(
                f"expected a partial {tuple(hidden.shape)} {hidden.dtype}, "
                f"got {tuple(p.out.shape)} {p.out.dtype} for [{p.start}, {p.end})"
            )
        if p.out.device != hidden.device:
            raise DeviceError(
                f"expected a partial on {hidden.device}, "
                f"got {p.out.device} for [{p.start}, {p.end})"
            )
        at = p.end
    if at != n:
        raise BlockError(f"expected {half} partials of layer {layer} tiling [0, {n}), end {at}")
    total = ordered[0].out
    for p in ordered[1:]:
        total = total + p.out
    return hidden + total


def aggregate_heads(
    model: Transformer, layer: int, partials: Sequence[Partial], hidden: torch.Tensor
) -> torch.Tensor:
    """The W^O aggregation (eq. 10): hidden + the sum of every head group's partial.

    Args:
        model, layer: the layer (for its head count).
        partials: `attention_heads_block` results tiling heads [0, n_heads), any order.
        hidden: the states entering the layer (the residual), (B, T, C).
    Returns:
        h_mid, the layer's states after attention, (B, T, C).
    Raises:
        BlockError: partials of another layer or half, with gaps or overlaps.
        ShapeError: a partial's shape or dtype differs from hidden's.
        DeviceError: a partial lies on another device than hidden.
    """
    return _aggregate(model, layer, "attention", partials, hidden, model.config.n_heads)


def aggregate_mlp(
    model: Transformer, layer: int, partials: Sequence[Partial], hidden: torch.Tensor,
    *, mlp_slices: int | None = None,
) -> torch.Tensor:
    """h_mid + the MLP partials tiling slices [0, M): the layer's output (raises as above)."""
    return _aggregate(model, layer, "mlp", partials, hidden, mlp_slices_of(model, mlp_slices))


def forward_block(
    model: Transformer, spec: BlockSpec, hidden: torch.Tensor,
    *, half: str | None = None, mlp_slices: int | None = None,
) -> torch.Tensor:
    """Run a forward or attention_heads block.

    Args:
        model: the weights.
        spec: whole layers, or a piece of one layer (module docstring).
        hidden: (B, T, C): the states entering the first layer; h_mid for
            the MLP half of a piece.
        half: "attention" or "mlp"; needed only when the piece has both.
        mlp_slices: M (default: `mlp_slices_of`).
    Returns:
        The states leaving the last layer, or the piece's partial (B, T, C).
    Raises:
        BlockError: a backward spec, layers or slots outside the model, or a
            half the piece does not have.
        ShapeError, DeviceError: hidden does not fit the model.
    """
    if spec.kind not in FORWARD_KINDS:
        raise BlockError(f"expected a block of kind {FORWARD_KINDS}, got {spec.kind!r}")
    piece = piece_of(model, spec, mlp_slices)
    if piece is None:  # run_layers checks hidden; _partial does for a piece
        with torch.no_grad():
            return model.run_layers(hidden, spec.layer_start, spec.layer_end, pos=0)
    if spec.kind == "attention_heads" and piece.halves != ("attention",):
        raise BlockError(f"expected an attention_heads block to hold heads only, got {spec}")
    return _partial(model, piece, _half(piece, half), hidden, mlp_slices_of(model, mlp_slices)).out


def backward_block(
    model: Transformer, spec: BlockSpec, hidden_in: torch.Tensor, grad_out: torch.Tensor,
    *, half: str | None = None, mlp_slices: int | None = None,
) -> tuple[torch.Tensor, Grads]:
    """Gradients of a block, by re-running its forward from hidden_in under autograd.

    Args:
        spec: a "backward" block (whole layers or a piece).
        hidden_in: what the forward block took (h, or h_mid for the MLP half).
        grad_out: dL/d(output), (B, T, C); for a piece, dL/d(the half's
            aggregated output), which is dL/d(its partial).
        half, mlp_slices: as `forward_block`.
    Returns:
        (grad_in (B, T, C), weight grads by parameter name): for a piece,
        its share of grad_in (`aggregate_grads`) and full-shaped grads of
        its half's three tensors.
    Raises:
        BlockError: not a backward spec, or as `forward_block`.
        ShapeError, DeviceError: hidden_in or grad_out does not fit.
    """
    if spec.kind != "backward":
        raise BlockError(f"expected a block of kind 'backward', got {spec.kind!r}")
    piece = piece_of(model, spec, mlp_slices)
    _check_hidden(model, hidden_in)
    if grad_out.shape != hidden_in.shape or grad_out.dtype != hidden_in.dtype:
        raise ShapeError(
            f"expected grad_out {tuple(hidden_in.shape)} {hidden_in.dtype}, "
            f"got {tuple(grad_out.shape)} {grad_out.dtype}"
        )
    layers = range(spec.layer_start, spec.layer_end)
    # Detached aliases of the weights (no copy) for autograd; the model's .grad stays untouched.
    weights = {
        i: {n: p.detach().requires_grad_(True) for n, p in model.layers[i].named_parameters()}
        for i in layers
    }
    which = None if piece is None else _half(piece, half)
    wanted = [(i, n) for i in layers for n in (HALF_PARAMS[which] if which else weights[i])]
    with torch.enable_grad():
        out = x = hidden_in.detach().requires_grad_(True)
        if which is None:
            for i in layers:
                out = functional_call(model.layers[i], weights[i], (out,), {"pos": 0})
        else:
            m = mlp_slices_of(model, mlp_slices)
            out = _half_out(model, piece, which, x, m, weights[piece.layer])
        grads = torch.autograd.grad(out, [x] + [weights[i][n] for i, n in wanted], grad_out)
    return grads[0], {f"layers.{i}.{n}": g for (i, n), g in zip(wanted, grads[1:])}


def aggregate_grads(grad_out: torch.Tensor, shares: Sequence[torch.Tensor]) -> torch.Tensor:
    """dL/d(a half's input): the residual path grad_out plus the pieces' shares, in order.

    Raises:
        BlockError: no shares (a half has at least one piece).
        ShapeError, DeviceError: a share differs from grad_out in shape,
            dtype or device.
    """
    if len(shares) == 0:
        raise BlockError("expected at least one share of the input gradient, got none")
    for i, g in enumerate(shares):
        if g.shape != grad_out.shape or g.dtype != grad_out.dtype:
            raise ShapeError(
                f"expected share {i} {tuple(grad_out.shape)} {grad_out.dtype}, "
                f"got {tuple(g.shape)} {g.dtype}"
            )
        if g.device != grad_out.device:
            raise DeviceError(f"expected share {i} on {grad_out.device}, got {g.device}")
    total = shares[0]
    for s in shares[1:]:
        total = total + s
    return grad_out + total


def add_grads(into: Grads, more: Grads) -> Grads:
    """Add weight gradients by name into `into` (new tensors: no input is modified); returns it."""
    for name, g in more.items():
        into[name] = into[name] + g if name in into else g
    return into

