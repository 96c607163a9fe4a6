"""The model's configuration: `ModelConfig`, the hyperparameters of a Llama-style decoder.

Owns the numbers that fix a model's shape (sizes, head counts, RoPE base,
norm epsilon, context limit, tied head) and their consistency checks. It sits
apart from compute/model.py so that modules which only need a model's shape
(compute/kvcache.py, the loaders, the job description) need not import the
model, and compute/model.py and compute/kvcache.py do not import each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from compute.errors import ConfigError

__all__ = ["ModelConfig"]


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of a Llama-style decoder.

    Raises:
        ConfigError: a size is not positive, heads do not divide dim, query
            heads are not a multiple of KV heads, or the head size is odd.
    """

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    max_seq_len: int = 2048
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        sizes = ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "max_seq_len")
        for name in sizes:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dim % self.n_heads:
            raise ConfigError(f"dim {self.dim} is not a multiple of n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise ConfigError(f"rotary embedding needs an even head size, got {self.head_dim}")
        if not (self.rope_theta > 0 and self.norm_eps > 0):
            raise ConfigError(
                f"rope_theta and norm_eps must be > 0, got {self.rope_theta}, {self.norm_eps}"
            )

    @property
    def head_dim(self) -> int:
        """Size of one attention head."""
        return self.dim // self.n_heads

    @property
    def n_rep(self) -> int:
        """Query heads sharing one key/value head."""
        return self.n_heads // self.n_kv_heads
