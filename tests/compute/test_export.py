"""compute.export: a job's weights written as .safetensors or .gguf, and read back.

The whole GGUF path (a trained SmolLM2 job exported, loaded, served, chatted
with) is tests/node/cli/test_devnet.py's SmolLM2 test; here, its pieces.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from compute.data import JobConfig, make_model
from compute.errors import ModelFileError
from compute.export import load_export, save_export
from compute.gguf import _hf_name, gguf_name
from compute.jobfile import config_json

SMALL = JobConfig(model=dataclasses.replace(JobConfig().model, n_layers=2))


def test_every_tensor_name_of_the_bundled_model_maps_back_to_itself(gguf_reader):
    names = [t.name for t in gguf_reader.tensors]
    assert len(names) > 100 and all(gguf_name(_hf_name(n)) == n for n in names)
    for bad in ("model.layers.0.self_attn.q_proj.bias", "lm_head", "model.layers.x.mlp.up_proj.weight"):
        with pytest.raises(ModelFileError, match="not part of a Llama model"):
            gguf_name(bad)


def test_a_safetensors_export_gives_back_the_model_and_its_config(tmp_path):
    model = make_model(SMALL)
    out = tmp_path / "m.safetensors"
    save_export(out, model.state_dict(), config_json(SMALL), "ab" * 32, 3)
    back, text = load_export(out)
    assert text == config_json(SMALL)
    assert all(torch.equal(back.state_dict()[k], v) for k, v in model.state_dict().items())
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]  # no temporary left


def test_refusals_leave_nothing_behind(tmp_path):
    weights = make_model(SMALL).state_dict()
    with pytest.raises(ModelFileError, match="no tokenizer .* export it as .safetensors"):
        save_export(tmp_path / "m.gguf", weights, config_json(SMALL), "ab" * 32, 1)
    with pytest.raises(ModelFileError, match="ending in .safetensors or .gguf"):
        save_export(tmp_path / "m.pt", weights, config_json(SMALL), "ab" * 32, 1)
    other = JobConfig(model=dataclasses.replace(SMALL.model, n_layers=3))
    save_export(tmp_path / "w.safetensors", weights, config_json(other), "ab" * 32, 1)
    with pytest.raises(ModelFileError, match="not the job's model"):
        load_export(tmp_path / "w.safetensors")  # weights of 2 layers, a config of 3
    (tmp_path / "w.safetensors").unlink()
    with pytest.raises(OSError):
        save_export(tmp_path / "absent" / "m.safetensors", weights, config_json(SMALL), "ab", 1)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ModelFileError, match="is not a job's weights"):
        load_export(tmp_path / "junk.safetensors")


def test_an_export_by_hash_is_a_jobs_initial_model_with_its_jobs_tokens(tmp_path):
    """`init` may name a job's .safetensors export: its weights start the job, and its
    tokens are its own job's (bytes here; its init's tokenizer for a SmolLM2 line)."""
    from compute.config import ConfigError
    from compute.data import job_corpus, load_corpus
    from compute.pretrained import (
        gguf_of, pretrained_config, pretrained_model, register_model_file, text_tokens,
        tokenizer_for,
    )

    trained = make_model(SMALL)
    out = tmp_path / "m.safetensors"
    save_export(out, trained.state_dict(), config_json(SMALL), "ab" * 32, 5)
    sha = register_model_file(out)
    assert pretrained_config(sha, 99) == dataclasses.replace(SMALL.model, max_seq_len=99)
    again = dataclasses.replace(SMALL, init=sha, seed=SMALL.seed + 1)  # not its random init
    model = make_model(again)
    assert model.training and all(torch.equal(model.state_dict()[k], v)
                                  for k, v in trained.state_dict().items())
    assert torch.equal(job_corpus(again).tokens, load_corpus(again.data).tokens)  # bytes
    assert text_tokens("é!".encode(), sha).tolist() == list("é!".encode())
    assert tokenizer_for(sha) is None and gguf_of(sha) is None
    other = dataclasses.replace(SMALL.model, n_layers=3)
    with pytest.raises(ConfigError, match=r"not the file's: n_layers 3 \(the file's: 2\)"):
        pretrained_model(sha, other)
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(ModelFileError, match="is not a job's weights"):
        pretrained_config(register_model_file(tmp_path / "junk.safetensors"), 8)
