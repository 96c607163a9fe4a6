"""The decoder on tiny random configs: against transformers' LlamaForCausalLM,
in sections, with the KV cache, and its error paths."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
import torch
import torch.nn.functional as F

from compute.data import JobConfig, batch, make_model
from compute.errors import CacheError, CacheFullError, ConfigError, DeviceError, ShapeError
from compute.hf import config_from_hf, hf_state_from_model, model_from_hf_tensors
from compute.kvcache import KVCache
from compute.linear import Linear
from compute.model import Transformer
from tests.compute.helpers import ATOL, TINY, hf_llama, random_ids, tiny_model


@pytest.mark.parametrize("tie", [True, False])
def test_logits_match_transformers_llama(generator, tie):
    cfg = dataclasses.replace(TINY, tie_embeddings=tie)
    ours = tiny_model(generator, cfg)
    ref = hf_llama(cfg)
    ref.load_state_dict(hf_state_from_model(ours), strict=True)
    ids = random_ids(generator, (2, 17), cfg)
    with torch.no_grad():
        want = ref(ids).logits
        got = ours(ids)
    assert want.std() > 0.5  # far from uniform, so the comparison means something
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    # The other direction: HF names (with HF's own tying) load back into an equal model.
    back = model_from_hf_tensors(config_from_hf(ref.config.to_dict()), ref.state_dict())
    assert back.config == cfg
    with torch.no_grad():
        torch.testing.assert_close(back(ids), got, atol=0, rtol=0)


def test_sections_compose_to_the_whole_model(generator):
    cfg = dataclasses.replace(TINY, n_layers=4)
    model = tiny_model(generator, cfg)
    ids = random_ids(generator, (1, 12), cfg)
    with torch.no_grad():
        h = model.embed(ids)  # (1, 12, C)
        h = model.run_layers(h, 0, 1)
        h = model.layer(1)(h)
        h = model.run_layers(h, 2, 4)
        torch.testing.assert_close(model.head(h), model(ids), atol=0, rtol=0)
        assert model.run_layers(h, 2, 2) is h  # an empty range is the identity


def test_cached_decoding_equals_full_recompute(generator):
    model = tiny_model(generator)
    ids = random_ids(generator, (2, 20))
    cache = KVCache(TINY, 20, batch=2)
    with torch.inference_mode():
        full = model(ids)
        parts = [model(ids[:, :7], cache=cache)]  # prefill
        parts += [model(ids[:, i : i + 1], cache=cache) for i in range(7, 15)]  # one token per step
        parts.append(model(ids[:, 15:], cache=cache))  # a chunk after cached tokens (masked)
    assert cache.length == 20 and cache.room == 0
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=ATOL, rtol=0)


def test_section_cache_holds_only_its_layers(generator):
    cfg = dataclasses.replace(TINY, n_layers=4)
    model = tiny_model(generator, cfg)
    ids = random_ids(generator, (1, 9), cfg)
    front, back = KVCache(cfg, 9, layers=range(0, 2)), KVCache(cfg, 9, layers=range(2, 4))
    with torch.inference_mode():
        full = model(ids)
        steps = []
        for sl in (slice(0, 5), slice(5, 6), slice(6, 9)):
            h = model.run_layers(model.embed(ids[:, sl]), 0, 2, cache=front)
            steps.append(model.head(model.run_layers(h, 2, 4, cache=back)))
        with pytest.raises(CacheError, match="holds layers 0..1, got layers 2..3"):
            model.run_layers(h[:, :1], 2, 4, pos=0, cache=front)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=ATOL, rtol=0)
    assert len(front.k) == 2 and front.length == back.length == 9


def test_cache_budget_error_leaves_cache_untouched(generator):
    model = tiny_model(generator)
    ids = random_ids(generator, (1, 9))
    cache = KVCache(TINY, 8)
    with torch.inference_mode():
        model(ids[:, :6], cache=cache)
        before = [k[:, :, :6].clone() for k in cache.k]  # slots past 6 are uninitialised
        with pytest.raises(CacheFullError, match="budget is 8 tokens"):
            model(ids[:, 6:9], cache=cache)
    assert cache.length == 6
    assert all(torch.equal(a, b[:, :, :6]) for a, b in zip(before, cache.k))
    with pytest.raises(ConfigError):
        KVCache(TINY, TINY.max_seq_len + 1)


def test_cache_rewind_replays_identically(generator):
    model = tiny_model(generator)
    ids = random_ids(generator, (1, 10))
    cache = KVCache(TINY, 16)
    with torch.inference_mode():
        first = model(ids, cache=cache)
        cache.truncate(4)
        again = model(ids[:, 4:], cache=cache)
        with pytest.raises(CacheError, match="write position"):
            model(ids[:, :1], pos=11, cache=cache)
    torch.testing.assert_close(again, first[:, 4:], atol=ATOL, rtol=0)


def test_context_limit_without_cache(generator):
    model = tiny_model(generator)
    with pytest.raises(ShapeError, match="context limit"):
        model(random_ids(generator, (1, TINY.max_seq_len + 1)))


def test_bad_inputs_raise_compute_errors(generator):
    model = tiny_model(generator)
    with pytest.raises(ShapeError, match=r"\(B, T>0\)"):
        model(torch.tensor([1, 2, 3]))
    with pytest.raises(ShapeError, match="token ids in 0..95"):
        model(torch.tensor([[1, 96]]))
    with pytest.raises(DeviceError):
        model(torch.zeros(1, 2, dtype=torch.int64, device="meta"))
    with pytest.raises(ShapeError, match="hidden states"):
        model.run_layers(torch.zeros(1, 3, TINY.dim + 1), 0, 1)
    with pytest.raises(ShapeError, match="start <= end"):
        model.run_layers(torch.zeros(1, 3, TINY.dim), 1, 0)


@pytest.mark.parametrize(
    "changes",
    [{"dim": 66}, {"n_kv_heads": 3}, {"dim": 60, "n_heads": 4}, {"n_layers": 0}, {"norm_eps": 0.0}],
)
def test_config_validation(changes):
    with pytest.raises(ConfigError):
        dataclasses.replace(TINY, **changes)


def test_init_is_deterministic_and_draws_no_global_randomness():
    state = torch.get_rng_state()
    a = tiny_model(torch.Generator().manual_seed(7))
    b = tiny_model(torch.Generator().manual_seed(7))
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not any(p.abs().sum() for p in Transformer(TINY).parameters() if p.dim() == 2)  # zeros


def test_packed_linear_tracks_weight_updates(generator):
    lin = Linear(64, 48).eval()
    with torch.no_grad():
        lin.weight.copy_(torch.randn(48, 64, generator=generator))
    x = torch.randn(1, 1, 64, generator=generator)
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight), atol=1e-5, rtol=1e-5)
        assert lin._packed is not None or not lin.pack_cpu
    with torch.no_grad():
        lin.weight.mul_(2.0)  # as an optimizer step would: in place
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight), atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # a copy packed under inference_mode also serves plain no_grad
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight), atol=1e-5, rtol=1e-5)
    lin.unpack()
    assert lin._packed is None


def test_training_path_has_gradients_and_model_copies(generator):
    model = tiny_model(generator)
    with torch.inference_mode():
        model(random_ids(generator, (1, 1)))  # builds packed weights
    clone = copy.deepcopy(model)
    pickle.loads(pickle.dumps(model))
    ids = random_ids(generator, (1, 8))
    model.train()
    loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    assert clone.lm_head.weight is clone.tok_emb.weight  # tying survives the copy


def test_a_training_model_gives_the_same_bits_with_and_without_autograd():
    """A miner's forward units run under no_grad; backward recomputes with autograd."""
    job = JobConfig()
    model = make_model(job)  # training mode
    ids, _ = batch(job, 0)
    with torch.no_grad():
        quiet = model(ids)
    assert torch.equal(quiet, model(ids).detach())
    model.eval()  # inference may take the packed path: close, not necessarily equal
    with torch.no_grad():
        torch.testing.assert_close(model(ids), quiet, atol=1e-4, rtol=1e-4)
