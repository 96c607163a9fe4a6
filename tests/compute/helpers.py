"""Small builders shared by the compute tests (tiny random models, ids)."""

from __future__ import annotations

import pytest
import torch

from compute.config import ModelConfig
from compute.model import Transformer

# 2 layers, 4 query heads sharing 2 KV heads: small enough for milliseconds.
TINY = ModelConfig(
    vocab_size=96,
    dim=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    ffn_dim=160,
    rope_theta=10000.0,
    max_seq_len=64,
)

# Logits of tiny_model() reach about 10; float32 differences measured <= 2.3e-5.
ATOL = 1e-4


def tiny_model(generator: torch.Generator, cfg: ModelConfig = TINY) -> Transformer:
    """A random model whose logits are far from uniform (std 0.3, non-unit norms)."""
    model = Transformer(cfg).eval()
    model.init_weights(generator, std=0.3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.2 * torch.randn(p.shape, generator=generator))
    return model


def random_ids(
    generator: torch.Generator, shape: tuple[int, int], cfg: ModelConfig = TINY
) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, shape, generator=generator)


def hf_llama(cfg: ModelConfig):
    """transformers' LlamaForCausalLM for cfg (test-only reference; skips without it)."""
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.dim,
        intermediate_size=cfg.ffn_dim,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        rope_theta=cfg.rope_theta,
        rms_norm_eps=cfg.norm_eps,
        max_position_embeddings=cfg.max_seq_len,
        tie_word_embeddings=cfg.tie_embeddings,
    )
    return transformers.LlamaForCausalLM(hf_cfg).eval()
