"""`pwallet infer --local`: the real SmolLM2 against transformers as the reference."""

from __future__ import annotations

import pytest
import torch

from wallet import client
from wallet.client import LocalModel

CHAT = "What is the capital of France?"
RAW = "The capital of France is"


def hf_greedy(hf_smol, ids: list[int], n: int, eos: set[int]) -> list[int]:
    """transformers' greedy continuation, cut after the first end-of-turn token."""
    with torch.inference_mode():
        out = hf_smol.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                               pad_token_id=0)[0, len(ids):].tolist()
    for i, t in enumerate(out):
        if t in eos:
            return out[: i + 1]
    return out


@pytest.fixture
def shared_model(monkeypatch, smol, smol_tokenizer):
    """Make the CLI reuse the session's loaded model (loading costs seconds)."""
    local = LocalModel.from_parts(smol, smol_tokenizer)
    monkeypatch.setattr(client, "LocalModel", lambda path=None: local)
    return local


def test_chat_greedy_matches_transformers(pwallet, shared_model, hf_smol, hf_tokenizer):
    r = pwallet("infer", CHAT, "--local", "--greedy", "--max-tokens", "24", "--json")
    assert r.code == 0, r.err
    # The reference renders the chat template with transformers' own tokenizer.
    prompt = hf_tokenizer.apply_chat_template([{"role": "user", "content": CHAT}],
                                              add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    eos = set(shared_model.tokenizer.stop_ids)
    assert r.json()["token_ids"] == hf_greedy(hf_smol, prompt, 24, eos)
    assert "Paris" in r.json()["text"]


def test_raw_greedy_matches_transformers_and_streams_the_same_text(pwallet, shared_model,
                                                                    hf_smol, hf_tokenizer):
    r = pwallet("infer", RAW, "--local", "--raw", "--greedy", "--max-tokens", "16", "--json")
    ids = hf_tokenizer(RAW)["input_ids"]
    expected = hf_greedy(hf_smol, ids, 16, set(shared_model.tokenizer.stop_ids))
    assert r.json()["token_ids"] == expected
    assert r.json()["text"] == hf_tokenizer.decode(expected, skip_special_tokens=True)
    streamed = pwallet("infer", RAW, "--local", "--raw", "--greedy", "--max-tokens", "16")
    assert streamed.out == r.json()["text"] + "\n"


def test_sampling_is_reproducible_by_seed(pwallet, shared_model):
    args = ["infer", RAW, "--local", "--raw", "--max-tokens", "12", "--temperature", "1.5",
            "--json"]
    a = pwallet(*args, "--seed", "7").json()
    b = pwallet(*args, "--seed", "7").json()
    c = pwallet(*args, "--seed", "8").json()
    assert a == b and a["seed"] == 7
    assert a["token_ids"] != c["token_ids"]


def test_real_loading_path(pwallet):
    r = pwallet("infer", RAW, "--local", "--raw", "--greedy", "--max-tokens", "3", "--json")
    assert r.code == 0 and len(r.json()["token_ids"]) == 3


def test_a_byte_level_jobs_export_runs_with_its_bytes_as_tokens(pwallet, tmp_path):
    """`pnode job export --out m.safetensors` of the default (byte-level) job: its tokens
    are UTF-8 bytes, so it takes any text and streams what its bytes spell."""
    import dataclasses

    from compute.data import JobConfig, make_model
    from compute.export import save_export
    from compute.generate import Sampling, stream
    from compute.jobfile import config_json

    config = JobConfig(model=dataclasses.replace(JobConfig().model, n_layers=2))
    model = make_model(config).eval()
    out = tmp_path / "tiny.safetensors"
    save_export(out, model.state_dict(), config_json(config), "cd" * 32, 7)
    prompt = "Paris é"  # a two-byte character: the prompt is its bytes
    want = list(stream(model, list(prompt.encode()), 12, sampling=Sampling()))
    for chat in ((), ("--raw",)):  # no chat template: the user's text as it is, either way
        r = pwallet("infer", prompt, "--local", *chat, "--greedy", "--max-tokens", "12",
                    "--model", str(out), "--json", "--data-dir", str(tmp_path))
        assert r.code == 0, r.err
        assert r.json()["token_ids"] == want
    r = pwallet("infer", prompt, "--local", "--greedy", "--max-tokens", "12", "--model",
                str(out), "--data-dir", str(tmp_path))
    assert r.out.rstrip("\n") == bytes(t for t in want if t < 256).decode("utf-8", "replace")
    r = pwallet("infer", prompt, "--model", str(out), "--peers", DEAD_PEER, "--data-dir",
                str(tmp_path))
    assert r.code == 2 and "runs with --local only" in r.err  # servers run GGUF files


DEAD_PEER = "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWDVSyhRMdzqy4FDRbRWE8fGdGBLizkNutUdLhXN15Cgcc"


@pytest.mark.parametrize("args, message", [
    (["--local", "--top-p", "0"], "top-p"),
    (["--local", "--temperature", "0"], "temperature"),
    (["--local", "--max-tokens", "0"], "max-tokens"),
    (["--local", "--model", "/nonexistent.gguf"], "cannot read GGUF"),
    (["--peers", "/ip4/127.0.0.1/tcp/1"], "bad peer address"),
    (["--local", "--peers", DEAD_PEER], "--local runs everything here"),
    (["--local", "--push"], "--local runs everything here"),
    (["--local", "--no-push"], "--local runs everything here"),
    ([], "give --peers ADDR or --local"),
])
def test_bad_flags_are_one_line_errors(pwallet, args, message, tmp_path):
    r = pwallet("infer", "hi", "--data-dir", str(tmp_path), *args)
    assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1
