"""Training decomposed into the compute blocks of a partition, and its local reference.

Owns how the blocks of compute/blocks.py chain into a training step, who owns
and steps which weights, and one training step run two ways:

- decomposed (`train_step_decomposed`), as the network runs it: the client
  embeds the batch; the sections' forward blocks run in model order
  (`forward_chain`; the pieces of a split layer half by half, each half
  aggregated); the client's head computes the mean cross-entropy and its
  gradient; the sections' backward blocks run in reverse (`backward_chain`);
  the client back-propagates into the embedding; then every section steps
  its own AdamW over the weights it owns, and so does the client
  (embedding, final norm, LM head).
- whole-model (`train_step_whole`), the local reference: one AdamW over all
  parameters, autograd over the whole model.

Ownership. A section of whole layers owns those layers' tensors. A piece of
a layer owns what compute/partition.py counts for its units: per query head
its q rows and W^O columns plus an even share (1 / group size, as a run of
flattened elements) of its KV head's k rows and of its v rows, the attention
norm with head 0; per MLP slice its gate and up rows and down columns, the
MLP norm with slice 0. Pieces that read a shared tensor (a norm, k/v rows)
all produce gradients for it; they are summed (`add_grads`) before the owner
steps. AdamW is elementwise, so an optimizer over slices steps as one over
whole tensors would, up to the rounding of vectorized kernels. The slices and
their optimizer (`ParamSlice`, `SliceAdamW`, its state format) live in
compute/optim.py.

The job itself (`JobConfig`, `make_model`, `batch`) lives in compute/data.py
and is re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from compute.blocks import (
    HALVES, BlockError, Grads, Partial, add_grads, aggregate_grads, aggregate_heads, aggregate_mlp,
    backward_block, forward_block, mlp_slices_of, model_partition, piece_of,
)
from compute.data import DEFAULT_MODEL, Corpus, JobConfig, batch, job_corpus, make_model
from compute.errors import ShapeError
from compute.model import Transformer
from compute.optim import ParamSlice, SliceAdamW, adamw
from compute.partition import BlockSpec, Partition

__all__ = [
    "DEFAULT_MODEL", "JobConfig", "Sections", "TrainResult", "batch",
    "average_replicas", "backward_chain", "client_slices", "embed_backward", "forward_chain",
    "grads_decomposed", "head_loss_block", "make_model", "make_sections", "make_whole_optimizer",
    "owned_slices", "stages", "train_local", "train_step_decomposed", "train_step_replicas",
    "train_step_whole",
]


def stages(
    model: Transformer, specs: Sequence[BlockSpec], *, mlp_slices: int | None = None
) -> list[tuple[BlockSpec, ...]]:
    """Group blocks listed in model order into stages: whole layers, or all pieces of one layer.

    Raises:
        BlockError: blocks that do not follow each other layer by layer, or
            pieces of a layer that do not tile its H + M slots in order.
    """
    out: list[tuple[BlockSpec, ...]] = []
    for spec in specs:
        piece, last = piece_of(model, spec, mlp_slices), out[-1][-1] if out else None
        if piece is not None and last and last.head_end and last.layer_start == piece.layer:
            out[-1] = out[-1] + (spec,)
        else:
            out.append((spec,))
    slots = model.config.n_heads + mlp_slices_of(model, mlp_slices)
    for i, stage in enumerate(out):
        if i and stage[0].layer_start != out[i - 1][-1].layer_end:
            want = out[i - 1][-1].layer_end
            raise BlockError(f"expected a block from layer {want}, got {stage[0]}")
        ends = [s.head_end for s in stage]
        if ends[0] and ([s.head_start for s in stage] != [0] + ends[:-1] or ends[-1] != slots):
            raise BlockError(f"expected pieces tiling slots [0, {slots}) of a layer, got {stage}")
    return out


def _terms(
    model: Transformer, stage: tuple[BlockSpec, ...], half: str, h: torch.Tensor, m: int | None
) -> list[Partial]:
    """The partials of one half of a layer: each piece of the stage that has that half, run on h."""
    out = []
    for spec in stage:
        piece = piece_of(model, spec, m)
        if half in piece.halves:
            term = forward_block(model, spec, h, half=half, mlp_slices=m)
            out.append(Partial(piece.layer, half, *piece.span(half), term))
    return out


def forward_chain(
    model: Transformer, specs: Sequence[BlockSpec], hidden: torch.Tensor,
    *, mlp_slices: int | None = None,
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, ...]]]:
    """Forward blocks of consecutive sections in model order; a layer's pieces half by half.

    Returns:
        (the last output, each stage's inputs: (h,) for whole layers,
        (h, h_mid) for the pieces of a layer).
    Raises:
        BlockError: as `stages` and `forward_block`.
    """
    saved, m = [], mlp_slices
    for stage in stages(model, specs, mlp_slices=m):
        if not stage[0].head_end:
            saved.append((hidden,))
            hidden = forward_block(model, stage[0], hidden)
            continue
        layer = stage[0].layer_start
        h_mid = aggregate_heads(model, layer, _terms(model, stage, "attention", hidden, m), hidden)
        saved.append((hidden, h_mid))
        terms = _terms(model, stage, "mlp", h_mid, m)
        hidden = aggregate_mlp(model, layer, terms, h_mid, mlp_slices=m)
    return hidden, saved


def backward_chain(
    model: Transformer, specs: Sequence[BlockSpec], saved: Sequence[tuple[torch.Tensor, ...]],
    grad_out: torch.Tensor, *, mlp_slices: int | None = None,
) -> tuple[torch.Tensor, Grads]:
    """Backward blocks of consecutive sections, last stage first; in a layer, the MLP half first.

    Args:
        specs: the backward blocks, listed in model order.
        saved: `forward_chain`'s stage inputs.
        grad_out: dL/d(the chain's output), (B, T, C).
    Returns:
        (dL/d(the chain's input), the sections' weight grads summed by name).
    Raises:
        BlockError: saved does not match the stages, or as `stages` and `backward_block`.
    """
    grads: Grads = {}
    m = mlp_slices
    chain = stages(model, specs, mlp_slices=m)
    if len(chain) != len(saved):
        raise BlockError(f"expected saved inputs of {len(chain)} stages, got {len(saved)}")
    for stage, inputs in zip(reversed(chain), reversed(saved)):
        if not stage[0].head_end:
            grad_out, g = backward_block(model, stage[0], inputs[0], grad_out)
            add_grads(grads, g)
            continue
        for half, x in zip(reversed(HALVES), reversed(inputs)):
            shares = []
            for spec in (s for s in stage if half in piece_of(model, s, m).halves):
                share, g = backward_block(model, spec, x, grad_out, half=half, mlp_slices=m)
                shares.append(share)
                add_grads(grads, g)
            grad_out = aggregate_grads(grad_out, shares)
    return grad_out, grads


def _head_slices(model: Transformer, layer: int, a: int, b: int) -> list[ParamSlice]:
    """What query heads [a, b) of a layer own (module docstring)."""
    cfg, p = model.config, f"layers.{layer}."
    nh, nkv, hd, rep = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.n_rep
    share = hd * cfg.dim // rep  # one head's share of its KV head's k (or v) block
    out = [ParamSlice(p + "attn_norm.weight", (0, cfg.dim))] if a == 0 else []
    out.append(ParamSlice(p + "attn.wqkv.weight", (a * hd, b * hd)))
    for g in range(a // rep, (b - 1) // rep + 1):
        j0, j1 = max(a, g * rep) - g * rep, min(b, (g + 1) * rep) - g * rep
        for base in (nh + g, nh + nkv + g):  # k rows, then v rows of KV head g
            rows, flat = (base * hd, (base + 1) * hd), (j0 * share, j1 * share)
            out.append(ParamSlice(p + "attn.wqkv.weight", rows, flat=flat))
    out.append(ParamSlice(p + "attn.wo.weight", (0, cfg.dim), cols=(a * hd, b * hd)))
    return out


def _mlp_slices(model: Transformer, layer: int, c: int, d: int, m: int) -> list[ParamSlice]:
    """What MLP slices [c, d) of m of a layer own."""
    cfg, p = model.config, f"layers.{layer}."
    f0, f1, ffn = cfg.ffn_dim * c // m, cfg.ffn_dim * d // m, cfg.ffn_dim
    out = [ParamSlice(p + "mlp_norm.weight", (0, cfg.dim))] if c == 0 else []
    return out + [
        ParamSlice(p + "mlp.w_gate_up.weight", (f0, f1)),
        ParamSlice(p + "mlp.w_gate_up.weight", (ffn + f0, ffn + f1)),
        ParamSlice(p + "mlp.w_down.weight", (0, cfg.dim), cols=(f0, f1)),
    ]


def owned_slices(
    model: Transformer, spec: BlockSpec, mlp_slices: int | None = None
) -> tuple[ParamSlice, ...]:
    """The weights a section (named by its forward or backward spec) owns and steps."""
    piece = piece_of(model, spec, mlp_slices)
    if piece is None:
        return tuple(
            ParamSlice(f"layers.{i}.{n}", (0, t.shape[0]))
            for i in range(spec.layer_start, spec.layer_end)
            for n, t in model.layers[i].named_parameters()
        )
    out = []
    if piece.head_end > piece.head_start:
        out += _head_slices(model, piece.layer, piece.head_start, piece.head_end)
    if piece.slice_end > piece.slice_start:
        m = mlp_slices_of(model, mlp_slices)
        out += _mlp_slices(model, piece.layer, piece.slice_start, piece.slice_end, m)
    return tuple(out)


def client_slices(model: Transformer) -> tuple[ParamSlice, ...]:
    """What the client owns: embedding, final norm, and the LM head unless tied."""
    names = ["tok_emb.weight", "norm.weight"]
    names += [] if model.config.tie_embeddings else ["lm_head.weight"]
    params = dict(model.named_parameters())
    return tuple(ParamSlice(n, (0, params[n].shape[0])) for n in names)


@dataclass(frozen=True, slots=True)
class Sections:
    """Decomposed training state: blocks in model order, an optimizer per section, the client's."""

    partition: Partition
    forward: tuple[BlockSpec, ...]
    backward: tuple[BlockSpec, ...]
    optimizers: tuple[SliceAdamW, ...]
    client: SliceAdamW
    mlp_slices: int


def make_sections(model: Transformer, job: JobConfig) -> Sections:
    """Partition the model into job.k sections and give each (and the client) an AdamW."""
    part = model_partition(model, job.k, job.mlp_slices)
    blocks, k = part.blocks(), part.k
    forward, backward = tuple(blocks[:k]), tuple(reversed(blocks[k:]))
    m = mlp_slices_of(model, job.mlp_slices)
    opts = tuple(SliceAdamW(model, owned_slices(model, s, m), job) for s in forward)
    return Sections(part, forward, backward, opts, SliceAdamW(model, client_slices(model), job), m)


def head_loss_block(
    model: Transformer, hidden: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, Grads]:
    """The client's head: final norm, LM head, mean cross-entropy, and their gradients.

    Args:
        hidden: states leaving the last layer, (B, T, C).
        targets: next-token ids, (B, T) int64.
    Returns:
        (loss (0-d), dL/dhidden (B, T, C), grads of "norm.weight" and of the
        head weight, named "tok_emb.weight" when tied).
    Raises:
        ShapeError: targets are not (B, T) integers matching hidden.
    """
    if targets.shape != hidden.shape[:2] or targets.dtype != torch.int64:
        raise ShapeError(
            f"expected targets {tuple(hidden.shape[:2])} int64, "
            f"got {tuple(targets.shape)} {targets.dtype}"
        )
    head_name = "tok_emb.weight" if model.config.tie_embeddings else "lm_head.weight"
    norm_w = model.norm.weight.detach().requires_grad_(True)
    head_w = model.lm_head.weight.detach().requires_grad_(True)
    with torch.enable_grad():
        x = hidden.detach().requires_grad_(True)
        logits = F.linear(F.rms_norm(x, norm_w.shape, norm_w, model.norm.eps), head_w)  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        g_x, g_norm, g_head = torch.autograd.grad(loss, (x, norm_w, head_w))
    return loss.detach(), g_x, {"norm.weight": g_norm, head_name: g_head}


def embed_backward(model: Transformer, ids: torch.Tensor, grad: torch.Tensor) -> Grads:
    """The client's embedding gradient from dL/d(embedded ids) (B, T, C)."""
    w = model.tok_emb.weight.detach().requires_grad_(True)
    with torch.enable_grad():
        (g,) = torch.autograd.grad(F.embedding(ids, w), w, grad)
    return {"tok_emb.weight": g}


def grads_decomposed(
    model: Transformer, sections: Sections, ids: torch.Tensor, targets: torch.Tensor
) -> tuple[float, Grads]:
    """One shard's loss and weight gradients, block by block (module docstring).

    Gradients of one name are summed in this order: the head's, then the
    sections' (`backward_chain`'s order), then the embedding's.
    """
    with torch.no_grad():
        h0 = model.embed(ids)  # (B, T, C)
    m = sections.mlp_slices
    out, saved = forward_chain(model, sections.forward, h0, mlp_slices=m)
    loss, grad, grads = head_loss_block(model, out, targets)
    grad0, layer_grads = backward_chain(model, sections.backward, saved, grad, mlp_slices=m)
    add_grads(add_grads(grads, layer_grads), embed_backward(model, ids, grad0))
    return loss.item(), grads


def average_replicas(per_replica: Sequence[Grads]) -> Grads:
    """The update's gradients: the replicas' sum by name, in replica order, over R.

    One replica's gradients are returned as they are (no division), so a
    job with one replica steps on exactly its gradients.
    """
    if len(per_replica) == 1:
        return per_replica[0]
    total: Grads = {}
    for grads in per_replica:
        add_grads(total, grads)
    return {name: g / len(per_replica) for name, g in total.items()}


def train_step_decomposed(
    model: Transformer, sections: Sections, ids: torch.Tensor, targets: torch.Tensor
) -> float:
    """One training step run block by block (module docstring); returns the loss before the step."""
    return train_step_replicas(model, sections, [(ids, targets)])[0]


def train_step_replicas(
    model: Transformer, sections: Sections, shards: Sequence[tuple[torch.Tensor, torch.Tensor]]
) -> list[float]:
    """One data-parallel step block by block: each shard's gradients, averaged, then the update.

    Returns:
        Each shard's loss before the step.
    """
    losses, per_replica = [], []
    for ids, targets in shards:
        loss, grads = grads_decomposed(model, sections, ids, targets)
        losses.append(loss)
        per_replica.append(grads)
    grads = average_replicas(per_replica)
    for opt in (*sections.optimizers, sections.client):
        opt.step(grads)
    return losses


def make_whole_optimizer(model: Transformer, job: JobConfig) -> torch.optim.AdamW:
    """The reference's one AdamW over every parameter."""
    return adamw(model.parameters(), job)


def train_step_whole(
    model: Transformer, optimizer: torch.optim.Optimizer, ids: torch.Tensor, targets: torch.Tensor
) -> float:
    """One whole-model training step (autograd over the model); returns the loss before the step."""
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
    loss.backward()
    optimizer.step()
    return loss.item()


@dataclass(frozen=True, slots=True)
class TrainResult:
    """A trained model and the loss of each step (before that step's update)."""

    model: Transformer
    losses: tuple[float, ...]


def train_local(
    job: JobConfig, steps: int | None = None,
    *, decomposed: bool = False, corpus: Corpus | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> TrainResult:
    """Train the job on this machine from its initial model.

    Args:
        job: the job.
        steps: how many steps (default job.steps), batches 0..steps-1 (each
            step's loss: the mean of its replicas').
        decomposed: run each step block by block (as the network does)
            instead of whole-model.
        corpus: the job's corpus, if already loaded.
        on_step: called with (step, loss) after each step (progress display).
    """
    corpus = job_corpus(job) if corpus is None else corpus
    model = make_model(job)
    sections = make_sections(model, job) if decomposed else None
    optimizer = None if decomposed else make_whole_optimizer(model, job)
    losses, r = [], job.replicas
    for step in range(job.steps if steps is None else steps):
        shards = [batch(job, step, i, r, corpus=corpus) for i in range(r)]
        if sections is not None:
            losses.append(sum(train_step_replicas(model, sections, shards)) / r)
        else:  # one batch of every shard's sequences: the same mean loss
            ids, targets = (torch.cat(x) for x in zip(*shards))
            losses.append(train_step_whole(model, optimizer, ids, targets))
        if on_step is not None:
            on_step(step, losses[-1])
    return TrainResult(model, tuple(losses))
