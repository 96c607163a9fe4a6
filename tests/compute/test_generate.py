"""generate()/stream() on a tiny random model: greedy equals a naive argmax
loop, sampling is reproducible from its seed alone, budgets and stops hold."""

from __future__ import annotations

import pytest
import torch

from compute.errors import CacheFullError, ConfigError, ShapeError
from compute.generate import Sampling, generate, next_token, stream
from compute.kvcache import KVCache
from tests.compute.helpers import TINY, random_ids, tiny_model


@pytest.fixture
def model(generator):
    return tiny_model(generator)


def naive_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Recompute the whole sequence for every token: slow, obviously right."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt) :]


def test_greedy_equals_naive_argmax_loop(model, generator):
    for _ in range(3):
        prompt = random_ids(generator, (1, 5))[0].tolist()
        assert generate(model, prompt, 20) == naive_greedy(model, prompt, 20)


def test_sampling_is_reproducible_from_the_seed_alone(model):
    prompt = [3, 1, 4, 1, 5]
    state = torch.get_rng_state()
    a = generate(model, prompt, 30, greedy=False, temperature=1.5, seed=11)
    torch.manual_seed(999)  # global state must not matter
    b = generate(model, prompt, 30, greedy=False, temperature=1.5, seed=11)
    c = generate(model, prompt, 30, greedy=False, temperature=1.5, seed=12)
    assert a == b != c
    torch.set_rng_state(state)


def test_tiny_top_p_is_greedy(model):
    prompt = [9, 8, 7]
    assert generate(model, prompt, 15, greedy=False, top_p=1e-6, seed=3) == generate(
        model, prompt, 15
    )


def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    gen = torch.Generator().manual_seed(0)
    draws = {int(next_token(logits, Sampling(greedy=False, top_p=0.8), gen)) for _ in range(300)}
    assert draws == {0, 1}  # 0.5 + 0.3 reaches 0.8: tokens 2 and 3 never come


def test_stop_ids_end_generation(model):
    prompt = [1, 2, 3]
    free = generate(model, prompt, 12)
    stop = free[4]
    out = generate(model, prompt, 12, stop_ids={stop})
    assert out == free[: free.index(stop) + 1]


def test_stream_yields_the_same_tokens(model):
    assert list(stream(model, torch.tensor([[5, 6, 7]]), 8)) == generate(model, [5, 6, 7], 8)
    assert generate(model, [5], 0) == []


def test_budget_errors_before_any_work(model):
    with pytest.raises(CacheFullError, match="budget is 64"):
        generate(model, list(range(60)), 6)
    generate(model, list(range(60)), 5)  # 60 + 4 fed back tokens = 64: fits
    cache = KVCache(TINY, 10)
    with pytest.raises(CacheFullError, match="budget is 10"):
        generate(model, [1, 2, 3], 9, cache=cache)
    assert cache.length == 0
    assert len(generate(model, [1, 2, 3], 8, cache=cache)) == 8


@pytest.mark.parametrize("kwargs", [{"temperature": 0.0}, {"top_p": 0.0}, {"top_p": 1.5}])
def test_bad_sampling_parameters(model, kwargs):
    with pytest.raises(ConfigError):
        generate(model, [1], 3, greedy=False, **kwargs)


@pytest.mark.parametrize("seed", [-1, 2**64, 1.5, "7", None, True])
def test_seed_is_a_u64_checked_at_construction(seed):
    with pytest.raises(ConfigError, match=r"seed must be an int in \[0, 2\^64\)"):
        Sampling(greedy=False, seed=seed)
    with pytest.raises(ConfigError, match="seed"):
        Sampling(seed=seed)  # checked even when greedy, like temperature and top_p


@pytest.mark.parametrize("seed", [0, 2**63, 2**64 - 1])
def test_every_u64_seed_samples(model, seed):
    assert len(generate(model, [1], 2, greedy=False, seed=seed)) == 2


def test_bad_prompts(model):
    with pytest.raises(ShapeError):
        generate(model, [], 3)
    with pytest.raises(ShapeError):
        generate(model, [[1, 2], [3, 4]], 3)


def test_stream_checks_its_arguments_at_the_call(model):
    with pytest.raises(CacheFullError):
        stream(model, list(range(60)), 6)  # raised without iterating


def test_continuing_with_a_cache_equals_a_fresh_prompt(model):
    cache = KVCache(TINY, 40)
    first = generate(model, [1, 2, 3], 5, cache=cache)
    assert cache.length == 3 + 4  # the last yielded token was never fed back
    second = generate(model, [first[-1], 7, 8], 6, cache=cache)
    assert second == generate(model, [1, 2, 3, *first, 7, 8], 6)
