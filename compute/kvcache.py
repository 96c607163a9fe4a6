"""Key/value cache for incremental decoding.

Owns the keys and values that attention layers keep between decoding steps:
one preallocated K and one V tensor per layer, of shape
(batch, n_kv_heads, max_len, head_dim), and how many positions of each layer
are filled. `max_len` is the token budget of a session: a step that would go
past it raises `CacheFullError` before anything is written.

A cache may cover only a contiguous range of layers, so that a server running
one section of the model keeps only that section's keys and values. Positions
are absolute: writing at `pos` keeps positions [0, pos) and drops any later
ones, which lets a caller roll back or replay a suffix.
"""

from __future__ import annotations

import torch

from compute.config import ModelConfig
from compute.errors import CacheError, CacheFullError, ConfigError, ShapeError


class KVCache:
    """Preallocated per-layer K/V tensors for layers in `layers`.

    Args:
        config: the model's configuration (heads, head size, context limit).
        max_len: token budget, at most `config.max_seq_len`.
        batch: number of sequences decoded together.
        layers: the absolute layer indices held (default: all layers).
        device: where the tensors live.

    Raises:
        ConfigError: max_len or layers out of range.
    """

    def __init__(
        self,
        config: ModelConfig,
        max_len: int,
        *,
        batch: int = 1,
        layers: range | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        layers = range(config.n_layers) if layers is None else layers
        if not 0 < max_len <= config.max_seq_len:
            raise ConfigError(f"KV cache max_len must be in 1..{config.max_seq_len}, got {max_len}")
        if batch < 1:
            raise ConfigError(f"KV cache batch must be >= 1, got {batch}")
        if (
            layers.step != 1
            or len(layers) == 0
            or layers.start < 0
            or layers.stop > config.n_layers
        ):
            raise ConfigError(
                "KV cache layers must be a non-empty contiguous range in "
                f"0..{config.n_layers}, got {layers}"
            )
        self.config = config
        self.max_len = max_len
        self.batch = batch
        self.layers = layers
        shape = (batch, config.n_kv_heads, max_len, config.head_dim)
        # Uninitialised: only filled positions are ever read (update returns
        # the filled prefix), so zeroing would be wasted work at every prefill.
        self.k = [torch.empty(shape, device=device) for _ in layers]
        self.v = [torch.empty(shape, device=device) for _ in layers]
        self._filled = [0] * len(layers)

    @property
    def length(self) -> int:
        """Number of leading positions that every held layer has filled."""
        return min(self._filled)

    def filled(self, layer: int) -> int:
        """Number of leading positions that layer (absolute index) has filled."""
        return self._filled[self._index(layer)]

    @property
    def room(self) -> int:
        """How many more tokens fit after `length`."""
        return self.max_len - self.length

    def check_room(self, pos: int, n: int, layers: range | None = None) -> None:
        """Raise unless n tokens can be written at positions [pos, pos + n).

        Args:
            pos: position of the first token.
            n: number of tokens.
            layers: the layers that will write (default: none checked).

        Raises:
            CacheFullError: pos + n exceeds the budget max_len.
            CacheError: pos is negative or leaves a gap after `length`, or a
                layer is not held.
        """
        if (
            layers is not None
            and len(layers)
            and (layers.start < self.layers.start or layers.stop > self.layers.stop)
        ):
            raise CacheError(
                f"this cache holds layers {self._held()}, "
                f"got layers {layers.start}..{layers.stop - 1}"
            )
        if pos + n > self.max_len:
            raise CacheFullError(
                f"KV cache budget is {self.max_len} tokens; a step of {n} token(s) "
                f"at position {pos} needs {pos + n}"
            )
        if not 0 <= pos <= self.length:
            raise CacheError(
                f"expected a write position in 0..{self.length} (filled length), got {pos}"
            )

    def update(
        self, layer: int, pos: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v of shape (B, n_kv_heads, T, head_dim) at positions [pos, pos + T).

        Args:
            layer: absolute layer index.
            pos: position of the first new token.
            k: new keys.
            v: new values.

        Returns:
            Views of all keys and values of that layer, (B, n_kv_heads, pos + T, head_dim).

        Raises:
            CacheFullError: the step exceeds the budget.
            CacheError: the layer is not held, or pos leaves a gap.
            ShapeError: k's batch size differs from the cache's.
        """
        j = self._index(layer)
        end = pos + k.shape[2]
        if end > self.max_len or not 0 <= pos <= self._filled[j]:
            self.check_room(pos, k.shape[2])
            raise CacheError(
                f"layer {layer}: expected a write position in 0..{self._filled[j]}, got {pos}"
            )
        if k.shape[0] != self.batch:
            raise ShapeError(f"KV cache holds batch {self.batch}, got keys for batch {k.shape[0]}")
        kc, vc = self.k[j], self.v[j]
        kc[:, :, pos:end].copy_(k)
        vc[:, :, pos:end].copy_(v)
        self._filled[j] = end
        return kc[:, :, :end], vc[:, :, :end]

    def truncate(self, length: int) -> None:
        """Forget every position >= length in all layers (keep the memory)."""
        if length < 0:
            raise CacheError(f"expected a length >= 0, got {length}")
        self._filled = [min(f, length) for f in self._filled]

    def _index(self, layer: int) -> int:
        j = layer - self.layers.start
        if not 0 <= j < len(self._filled):
            raise CacheError(f"this cache holds layers {self._held()}, got layer {layer}")
        return j

    def _held(self) -> str:
        return f"{self.layers.start}..{self.layers.stop - 1}"

    def reset(self) -> None:
        """Forget everything; the next write starts at position 0."""
        self.truncate(0)
