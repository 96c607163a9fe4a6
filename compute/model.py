"""Llama-style decoder: the one model family compute/ runs.

Owns the model's forward math: RMSNorm, rotary position embedding in the
Llama/HF "rotate_half" convention, grouped-query attention, SwiGLU MLP, tied
or untied LM head, and `DecoderLayer`, one layer of them. Float32 throughout.
The hyperparameters (`ModelConfig`) live in compute/config.py.

The model is cut into pieces a caller can run separately, because sections of
it will run on different machines:

    h = model.embed(ids)                          # (B, T) -> (B, T, C)
    h = model.run_layers(h, 0, 10, cache=cache)   # any contiguous range
    h = model.layer(10)(h, pos=p, cache=cache)    # or one layer at a time
    logits = model.head(h)                        # (B, T, C) -> (B, T, V)

A model may also hold only a `ModelPart`: a server of the swarm loads just
its layers, a client just the embeddings and head (the rest stays on torch's
"meta" device, costing no memory, and calling it raises `ShapeError`).

Q/K/V and gate/up projections are fused into one matrix each (fewer matmuls
per decoded token); loaders map separate checkpoint tensors onto them. Weights
start at zeros: construction draws no randomness.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from compute.config import ModelConfig
from compute.errors import DeviceError, ShapeError
from compute.linear import Linear

if TYPE_CHECKING:
    from compute.kvcache import KVCache


@dataclass(frozen=True, slots=True)
class ModelPart:
    """Which weights a (partial) model holds.

    layers: the decoder layers held, a contiguous range (may be empty).
    ends: the token embeddings, the final norm and the LM head.
    """

    layers: range
    ends: bool

    @classmethod
    def whole(cls, n_layers: int) -> ModelPart:
        return cls(range(n_layers), True)

    def describe(self) -> str:
        span = f"layers {self.layers.start}..{self.layers.stop - 1}" if self.layers else "no layers"
        return span + (" and the embeddings/head" if self.ends else "")


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dimension."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class Rope(nn.Module):
    """Rotary position tables, shared by every layer.

    Uses the HF `rotate_half` convention: a head's first and second halves
    form the rotated pairs, x' = x * cos + rotate_half(x) * sin with
    rotate_half(x) = cat(-x2, x1). `roll(x)` equals cat(x2, x1), so the sign
    is folded into the stored sin table and one addcmul does the rotation.
    """

    def __init__(self, head_dim: int, max_seq_len: int, theta: float) -> None:
        super().__init__()
        half = head_dim // 2
        # Same float32 recipe as transformers' LlamaRotaryEmbedding: the tables match bit for bit.
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        inv_freq = 1.0 / (theta**exponents)  # (hd/2,)
        positions = torch.arange(max_seq_len, dtype=torch.int64).float()
        freqs = torch.outer(positions, inv_freq)  # (L, hd/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (L, hd)
        sin = emb.sin()
        sin[:, :half] = -sin[:, :half]
        self.half = half
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin_signed", sin, persistent=False)

    def forward(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        """Rotate x of shape (B, T, heads, hd) whose first token sits at position pos."""
        t = x.shape[1]
        cos = self.cos[pos : pos + t, None]  # (T, 1, hd)
        sin = self.sin_signed[pos : pos + t, None]  # (T, 1, hd)
        return torch.addcmul(x * cos, x.roll(self.half, dims=-1), sin)


class Attention(nn.Module):
    """Grouped-query causal self-attention with a fused QKV projection."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, rope: Rope) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        # Rows: n_heads query heads, then n_kv_heads key heads, then n_kv_heads value heads.
        self.wqkv = Linear(cfg.dim, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim)
        self.wo = Linear(cfg.n_heads * cfg.head_dim, cfg.dim)
        self.rope = rope

    def forward(self, x: torch.Tensor, pos: int, cache: KVCache | None) -> torch.Tensor:
        b, t, _ = x.shape
        nh, nkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = self.wqkv(x)  # (B, T, (nh + 2 nkv) hd)
        qk = qkv[..., : (nh + nkv) * hd].view(b, t, nh + nkv, hd)  # (B, T, nh + nkv, hd)
        qk = self.rope(qk, pos)  # queries and keys rotate together: one call, not two
        q = qk[:, :, :nh].transpose(1, 2)  # (B, nh, T, hd)
        k = qk[:, :, nh:].transpose(1, 2)  # (B, nkv, T, hd)
        v = qkv[..., (nh + nkv) * hd :].view(b, t, nkv, hd).transpose(1, 2)  # (B, nkv, T, hd)
        if cache is not None:
            k, v = cache.update(self.layer_idx, pos, k, v)  # (B, nkv, L, hd), L = pos + T
        y = _causal_attention(q, k, v)  # (B, nh, T, hd)
        return self.wo(y.transpose(1, 2).reshape(b, t, nh * hd))  # (B, T, C)


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention of T queries over L >= T keys where the queries are the last T keys."""
    t, length = q.shape[2], k.shape[2]
    if t == 1:  # one new token sees every key: no mask
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    if t == length:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    # Query i sits at key position length - t + i and sees keys up to it.
    mask = torch.ones(t, length, dtype=torch.bool, device=q.device).tril(length - t)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)), gate and up fused."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w_gate_up = Linear(cfg.dim, 2 * cfg.ffn_dim)  # rows: gate, then up
        self.w_down = Linear(cfg.ffn_dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() == x.shape[-1] or self.w_gate_up.packs(x):
            # One token, or CPU inference: one fused (packed) projection.
            gate, up = self.w_gate_up(x).chunk(2, dim=-1)  # (B, T, F) each
        else:
            # Many tokens through F.linear: two GEMMs over the weight's
            # contiguous halves run faster than one twice as wide (measured
            # at prefill shapes), and give contiguous outputs.
            w = self.w_gate_up.weight
            half = w.shape[0] // 2
            gate, up = F.linear(x, w[:half]), F.linear(x, w[half:])  # (B, T, F) each
        if torch.is_grad_enabled():
            return self.w_down(F.silu(gate) * up)  # (B, T, C)
        # Inference: gate is a fresh tensor (or a view of one), so work in place.
        return self.w_down(F.silu(gate, inplace=True).mul_(up))  # (B, T, C)


class DecoderLayer(nn.Module):
    """One decoder layer: pre-norm attention and pre-norm MLP, both residual."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, rope: Rope) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg, layer_idx, rope)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self, h: torch.Tensor, pos: int | None = None, cache: KVCache | None = None
    ) -> torch.Tensor:
        """Map hidden states (B, T, C) of tokens at positions [pos, pos + T) to (B, T, C).

        With a cache, keys and values of earlier positions come from it and
        this layer's new ones are written to it; without one, attention sees
        only these T tokens. pos defaults to what the cache holds for this
        layer, or 0 without a cache.
        """
        if pos is None:
            pos = cache.filled(self.attn.layer_idx) if cache is not None else 0
        h = h + self.attn(self.attn_norm(h), pos, cache)
        return h + self.mlp(self.mlp_norm(h))


class Transformer(nn.Module):
    """The whole decoder, runnable in pieces (see module docstring).

    Args:
        config: model hyperparameters.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(
            config.vocab_size, config.dim, _weight=torch.zeros(config.vocab_size, config.dim)
        )
        self.rope = Rope(config.head_dim, config.max_seq_len, config.rope_theta)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, self.rope) for i in range(config.n_layers)
        )
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.lm_head = Linear(config.dim, config.vocab_size)
        if config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.part = ModelPart.whole(config.n_layers)

    @classmethod
    def from_state_dict(
        cls, config: ModelConfig, state: dict[str, torch.Tensor], part: ModelPart | None = None
    ) -> Transformer:
        """Build a model that adopts the tensors of `state` (no copy), in eval mode.

        Faster than construct-then-load: the zero weights are never allocated.

        Args:
            config: the whole model's hyperparameters.
            state: exactly the tensors of `part` (names as `state_dict()`).
            part: the weights held (default: all); the others stay on "meta".

        Raises:
            RuntimeError: from `load_state_dict` when names or shapes differ.
        """
        part = part or ModelPart.whole(config.n_layers)
        with torch.device("meta"):
            model = cls(config)
        model.part = part
        expected = set(part_state_names(config, part))
        if set(state) != expected:
            raise RuntimeError(
                f"state for {part.describe()}: missing {sorted(expected - set(state))[:4]}, "
                f"unexpected {sorted(set(state) - expected)[:4]}"
            )
        model.load_state_dict(state, strict=False, assign=True)
        if config.tie_embeddings and part.ends:  # assign made two Parameters; share one again
            model.lm_head.weight = model.tok_emb.weight
        device = model._reference_weight().device
        model.rope = Rope(config.head_dim, config.max_seq_len, config.rope_theta).to(device)
        for block in model.layers:
            block.attn.rope = model.rope
        return model.eval()

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) int64 -> hidden states (B, T, C).

        Raises:
            ShapeError: ids not 2-D integer, empty, or outside the vocabulary.
            DeviceError: ids on another device than the weights.
        """
        self._check_ends()
        if ids.dim() != 2 or ids.shape[1] == 0 or ids.dtype not in (torch.int64, torch.int32):
            raise ShapeError(
                "expected token ids of shape (B, T>0) and integer dtype, "
                f"got {tuple(ids.shape)} {ids.dtype}"
            )
        if ids.device != self.tok_emb.weight.device:
            raise DeviceError(
                f"weights are on {self.tok_emb.weight.device}, token ids on {ids.device}"
            )
        lo, hi = (int(x) for x in torch.aminmax(ids))
        if lo < 0 or hi >= self.config.vocab_size:
            raise ShapeError(
                f"expected token ids in 0..{self.config.vocab_size - 1}, got range {lo}..{hi}"
            )
        return self.tok_emb(ids)

    def layer(self, i: int) -> DecoderLayer:
        """The i-th decoder layer; call it as layer(h, pos=..., cache=...)."""
        return self.layers[i]

    def run_layers(
        self,
        h: torch.Tensor,
        start: int,
        end: int,
        *,
        pos: int | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """Run layers start..end-1 on hidden states (B, T, C).

        Args:
            h: hidden states entering layer `start`.
            start: first layer (inclusive).
            end: last layer (exclusive).
            pos: position of h's first token; default: the cache's filled
                length, or 0 without a cache.
            cache: KV cache holding (at least) these layers.

        Returns:
            Hidden states leaving layer end-1, (B, T, C).

        Raises:
            ShapeError: bad layer range, hidden-state shape or dtype, or a
                position past the context limit.
            DeviceError: h is on another device than the weights.
            CacheFullError: the cache budget has no room for T more tokens.
            CacheError: the cache lacks one of these layers or pos leaves a
                gap (cache errors are raised before any layer writes).
        """
        if not 0 <= start <= end <= self.config.n_layers:
            raise ShapeError(
                f"expected layers 0 <= start <= end <= {self.config.n_layers}, got {start}..{end}"
            )
        if start < end and not (self.part.layers.start <= start and end <= self.part.layers.stop):
            raise ShapeError(f"this model holds {self.part.describe()}, asked for layers "
                             f"{start}..{end - 1}")
        self._check_hidden(h)
        t = h.shape[1]
        if pos is None:
            pos = cache.length if cache is not None else 0
        if pos < 0 or pos + t > self.config.max_seq_len:
            raise ShapeError(
                f"positions {pos}..{pos + t - 1} exceed the context limit {self.config.max_seq_len}"
            )
        if cache is not None:
            cache.check_room(pos, t, range(start, end))
        for i in range(start, end):
            h = self.layers[i](h, pos, cache)
        return h

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head: hidden states (B, T, C) -> logits (B, T, V)."""
        self._check_ends()
        return self.lm_head(self.norm(h))

    def forward(
        self,
        ids: torch.Tensor,
        *,
        pos: int | None = None,
        cache: KVCache | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """Whole model: token ids (B, T) -> logits (B, T, V), or (B, 1, V) with last_only.

        Args and Raises: as `embed` and `run_layers`.
        """
        h = self.run_layers(self.embed(ids), 0, self.config.n_layers, pos=pos, cache=cache)
        return self.head(h[:, -1:] if last_only else h)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator, std: float = 0.02) -> None:
        """Random init for tests and training from scratch: N(0, std) matrices, unit norms."""
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, std, generator=generator)

    def unpack(self) -> None:
        """Free the packed CPU copies of the weights (see compute/linear.py)."""
        for m in self.modules():
            if isinstance(m, Linear):
                m.unpack()

    def move(self, device: torch.device | str) -> Transformer:
        """Move the weights this part holds (and the RoPE tables) to ``device``.

        `nn.Module.to` cannot move a partial model: the weights it does not
        hold live on "meta" and have no data to copy.
        """
        held: list[nn.Module] = [self.layers[i] for i in self.part.layers]
        if self.part.ends:
            held += [self.tok_emb, self.norm, self.lm_head]
        for module in held + [self.rope]:
            module.to(device)
        return self

    def serve_only(self) -> Transformer:
        """Keep only the packed inference copies of the held layers' matrices.

        Halves a CPU server's memory for its layers (see
        `compute.linear.Linear.release_weight`); afterwards these layers can
        only run CPU float32 inference. The embeddings and head are kept as
        they are (the head may share the embedding's tensor).

        Raises:
            ComputeError: the weights are not on the CPU or cannot be packed.
        """
        for i in self.part.layers:
            for m in self.layers[i].modules():
                if isinstance(m, Linear):
                    m.release_weight()
        return self

    def _reference_weight(self) -> torch.Tensor:
        """A weight this part holds: it says the dtype and device of hidden states."""
        if self.part.ends or not self.part.layers:
            return self.norm.weight
        return self.layers[self.part.layers.start].attn_norm.weight

    def _check_ends(self) -> None:
        if not self.part.ends:
            raise ShapeError(f"this model holds {self.part.describe()}, not the embeddings/head")

    def _check_hidden(self, h: torch.Tensor) -> None:
        w = self._reference_weight()
        if h.dim() != 3 or h.shape[2] != self.config.dim or h.shape[1] == 0 or h.dtype != w.dtype:
            raise ShapeError(
                f"expected hidden states (B, T>0, {self.config.dim}) {w.dtype}, "
                f"got {tuple(h.shape)} {h.dtype}"
            )
        if h.device != w.device:
            raise DeviceError(f"weights are on {w.device}, hidden states on {h.device}")


def part_state_names(config: ModelConfig, part: ModelPart) -> list[str]:
    """The `Transformer.state_dict()` names of the weights `part` holds."""
    # A tied head is listed too: state_dict() names the shared tensor twice.
    names = ["tok_emb.weight", "norm.weight", "lm_head.weight"] if part.ends else []
    for i in part.layers:
        names += [f"layers.{i}.{n}.weight" for n in
                  ("attn_norm", "mlp_norm", "attn.wqkv", "attn.wo", "mlp.w_gate_up", "mlp.w_down")]
    return names
