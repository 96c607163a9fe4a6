"""Autoregressive text generation on one machine, with a KV cache.

Owns the decoding loop and the choice of the next token (greedy, or sampling
with temperature and nucleus/top-p from a seeded `torch.Generator`: no global
random state). One prompt at a time; the prompt is run once (prefill), then one
token per step, each step reading earlier keys and values from the cache.

The per-token path is kept short on purpose: one model call on a (1, 1) id
tensor, an argmax or a draw, one `.item()`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

from compute.errors import CacheFullError, ConfigError, ShapeError
from compute.kvcache import KVCache
from compute.model import Transformer


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen.

    greedy: take the most likely token (temperature, top_p, seed unused).
    temperature: divide logits by this (> 0) before the softmax.
    top_p: sample among the smallest set of most likely tokens whose
        probabilities sum to at least top_p (0 < top_p <= 1).
    seed: seeds the private generator of one generation, an int in [0, 2^64).
    """

    greedy: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ConfigError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not (
            0 <= self.seed < 1 << 64
        ):
            raise ConfigError(f"seed must be an int in [0, 2^64), got {self.seed!r}")


def next_token(
    logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None
) -> torch.Tensor:
    """Pick a token id from logits of shape (V,); returns a 0-d int64 tensor."""
    if sampling.greedy:
        return logits.argmax()
    probs = torch.softmax(logits / sampling.temperature, dim=-1)  # (V,)
    if sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # Keep a token while the mass before it is still short of top_p; the first always stays.
        keep = sorted_probs.cumsum(0) - sorted_probs < sampling.top_p
        choice = torch.multinomial(sorted_probs * keep, 1, generator=generator)
        return order[choice[0]]
    return torch.multinomial(probs, 1, generator=generator)[0]


def stream(
    model: Transformer,
    prompt: Sequence[int] | torch.Tensor,
    max_new_tokens: int,
    *,
    sampling: Sampling = Sampling(),
    stop_ids: Iterable[int] = (),
    cache: KVCache | None = None,
) -> Iterator[int]:
    """Yield up to max_new_tokens new token ids, one per step.

    Args:
        model: the decoder.
        prompt: token ids, a sequence or a 1-D tensor (not empty).
        max_new_tokens: how many tokens at most.
        sampling: greedy or sampling parameters.
        stop_ids: stop after yielding one of these (it is yielded).
        cache: continue after what this cache holds (e.g. earlier turns of a
            chat; the last token a previous call yielded is not in it, so
            the prompt starts with that token); default: a new cache sized
            prompt + max_new_tokens.

    Raises (at the call, before any work):
        ShapeError: empty or malformed prompt.
        ConfigError: negative max_new_tokens.
        CacheFullError: prompt + max_new_tokens exceeds the cache budget or
            the model's context.
    """
    ids = _prompt_tensor(model, prompt)
    if max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    # The last new token is never fed back, so it needs no cache slot.
    need = ids.shape[1] + max(max_new_tokens - 1, 0)
    if need > model.config.max_seq_len or (
        cache is not None and need > cache.max_len - cache.length
    ):
        budget = model.config.max_seq_len if cache is None else cache.max_len - cache.length
        raise CacheFullError(
            f"prompt of {ids.shape[1]} + {max_new_tokens} new tokens needs {need} cache slots, "
            f"budget is {budget}"
        )
    if max_new_tokens == 0:
        return iter(())
    cache = cache if cache is not None else KVCache(model.config, need, device=ids.device)
    return _decode(model, ids, max_new_tokens, sampling, frozenset(stop_ids), cache)


@torch.inference_mode()
def _decode(
    model: Transformer,
    ids: torch.Tensor,
    max_new_tokens: int,
    sampling: Sampling,
    stop: frozenset[int],
    cache: KVCache,
) -> Iterator[int]:
    generator = None
    if not sampling.greedy:
        generator = torch.Generator(device=ids.device).manual_seed(sampling.seed)
    logits = model(ids, cache=cache, last_only=True)  # (1, 1, V)
    for step in range(max_new_tokens):
        tok = next_token(logits[0, -1], sampling, generator)
        tok_id = int(tok.item())
        yield tok_id
        if tok_id in stop or step == max_new_tokens - 1:
            return
        logits = model(tok.view(1, 1), cache=cache)  # (1, 1, V)


def generate(
    model: Transformer,
    prompt: Sequence[int] | torch.Tensor,
    max_new_tokens: int,
    *,
    greedy: bool = True,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    stop_ids: Iterable[int] = (),
    cache: KVCache | None = None,
) -> list[int]:
    """The new token ids that follow prompt (at most max_new_tokens).

    Args: as `stream`, with the `Sampling` fields spelled out.

    Returns:
        New ids only, ending with a stop id if one was produced.

    Raises: as `stream` and `Sampling`.
    """
    sampling = Sampling(greedy=greedy, temperature=temperature, top_p=top_p, seed=seed)
    return list(
        stream(model, prompt, max_new_tokens, sampling=sampling, stop_ids=stop_ids, cache=cache)
    )


def _prompt_tensor(model: Transformer, prompt: Sequence[int] | torch.Tensor) -> torch.Tensor:
    device = model.tok_emb.weight.device
    ids = torch.as_tensor(prompt, dtype=torch.int64, device=device)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1 or ids.numel() == 0:
        raise ShapeError(
            f"expected a non-empty 1-D prompt of token ids, got shape {tuple(ids.shape)}"
        )
    return ids.view(1, -1)  # (1, T)
