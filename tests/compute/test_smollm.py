"""The real SmolLM2-135M-Instruct (bundled GGUF) against transformers reading
the same file: logits, cached decoding, greedy generation, sections."""

from __future__ import annotations

import pytest
import torch

from compute.config import ModelConfig
from compute.generate import generate
from compute.kvcache import KVCache

# Max abs logit difference measured against transformers, float32, 2 threads:
# <= 9.1e-5 (full forward and cached decoding, prompts of 5 to 301 tokens,
# logits up to about 38). The bound leaves a 5x margin for other CPUs.
LOGIT_ATOL = 5e-4

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "日本語の文章を書いてください。🤗",
    "The history of the Roman Empire spans many centuries. " * 12,
]
CHAT = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Name a colour."},
    ],
]


def test_config_from_gguf(smol):
    assert smol.config == ModelConfig(
        vocab_size=49152,
        dim=576,
        n_layers=30,
        n_heads=9,
        n_kv_heads=3,
        ffn_dim=1536,
        rope_theta=100000.0,
        norm_eps=smol.config.norm_eps,
        max_seq_len=8192,
        tie_embeddings=True,
    )
    assert abs(smol.config.norm_eps - 1e-5) < 1e-12


@pytest.mark.parametrize("prompt", [*PROMPTS, "chat"])
def test_logits_match_transformers(smol, smol_tokenizer, hf_smol, prompt):
    text = smol_tokenizer.apply_chat_template(CHAT[0]) if prompt == "chat" else prompt
    ids = torch.tensor([smol_tokenizer.encode(text)])
    with torch.inference_mode():
        want = hf_smol(ids).logits
        got = smol(ids)
    torch.testing.assert_close(got, want, atol=LOGIT_ATOL, rtol=0)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_cached_decoding_matches_transformers(smol, smol_tokenizer, hf_smol):
    ids = torch.tensor([smol_tokenizer.encode(PROMPTS[3])])
    t = ids.shape[1]
    cache = KVCache(smol.config, t)
    with torch.inference_mode():
        want = hf_smol(ids).logits
        steps = [smol(ids[:, : t - 8], cache=cache)]
        steps += [smol(ids[:, i : i + 1], cache=cache) for i in range(t - 8, t)]
    torch.testing.assert_close(torch.cat(steps, dim=1), want, atol=LOGIT_ATOL, rtol=0)


def _hf_greedy(hf_smol, ids: list[int], n: int, stop: int) -> list[int]:
    prompt = torch.tensor([ids])
    with torch.inference_mode():
        out = hf_smol.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=stop,
            pad_token_id=stop,
        )
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("case", ["plain0", "plain1", "plain3", "chat0", "chat1"])
def test_greedy_24_tokens_match_transformers(smol, smol_tokenizer, hf_smol, case):
    kind, index = case[:-1], int(case[-1])
    text = PROMPTS[index] if kind == "plain" else smol_tokenizer.apply_chat_template(CHAT[index])
    ids = smol_tokenizer.encode(text)
    eos = smol_tokenizer.eos_id
    ours = generate(smol, ids, 24, stop_ids={eos})
    assert ours == _hf_greedy(hf_smol, ids, 24, eos)
    if kind == "plain":
        assert len(ours) == 24  # these prompts never stop early: the whole budget is compared


def test_sections_with_their_own_caches_equal_the_whole(smol, smol_tokenizer):
    ids = torch.tensor([smol_tokenizer.encode(PROMPTS[0])])
    cuts = [(0, 7), (7, 19), (19, 30)]
    caches = [KVCache(smol.config, 16, layers=range(a, b)) for a, b in cuts]
    whole = KVCache(smol.config, 16)
    with torch.inference_mode():
        for sl in (slice(0, 3), slice(3, 5)):
            h = smol.embed(ids[:, sl])
            for (a, b), cache in zip(cuts, caches):
                h = smol.run_layers(h, a, b, cache=cache)
            torch.testing.assert_close(smol.head(h), smol(ids[:, sl], cache=whole), atol=0, rtol=0)


def test_answers_sensibly(smol, smol_tokenizer):
    ids = smol_tokenizer.encode_chat(CHAT[0])
    reply = smol_tokenizer.decode(
        generate(smol, ids, 24, stop_ids=smol_tokenizer.stop_ids), skip_special=True
    )
    assert "Paris" in reply
