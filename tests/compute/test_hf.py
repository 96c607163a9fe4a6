"""HF checkpoints: the safetensors reader against the reference package, a
checkpoint saved by transformers loading into an equal model, config checks."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from compute.errors import ConfigError, ModelFileError
from compute.hf import (
    config_from_hf,
    hf_shapes,
    hf_state_from_model,
    load_safetensors_model,
    read_safetensors,
)
from tests.compute.helpers import ATOL, TINY, hf_llama, random_ids, tiny_model


def test_reader_matches_the_safetensors_package(tmp_path: Path, generator):
    st = pytest.importorskip("safetensors.torch")
    tensors = {
        "f32": torch.randn(3, 5, generator=generator),
        "f16": torch.randn(7, generator=generator).half(),
        "bf16": torch.randn(2, 2, 2, generator=generator).bfloat16(),
        "i64": torch.arange(6).reshape(2, 3),
        "empty": torch.zeros(0, 4),
        "scalar": torch.tensor(2.5),
    }
    path = tmp_path / "t.safetensors"
    st.save_file(tensors, str(path), metadata={"format": "pt"})
    got = read_safetensors(path)
    assert got.keys() == tensors.keys()
    for name, want in tensors.items():
        assert got[name].dtype == want.dtype and torch.equal(got[name], want), name


def test_checkpoint_saved_by_transformers_loads_equal(tmp_path: Path, generator):
    cfg = dataclasses.replace(TINY, tie_embeddings=False)
    ours = tiny_model(generator, cfg)
    ref = hf_llama(cfg)
    ref.load_state_dict(hf_state_from_model(ours))
    ref.save_pretrained(tmp_path)  # config.json + model.safetensors
    loaded = load_safetensors_model(tmp_path)
    assert loaded.config == cfg
    ids = random_ids(generator, (1, 11), cfg)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), ref(ids).logits, atol=ATOL, rtol=0)


def test_bad_files_are_model_file_errors(tmp_path: Path):
    with pytest.raises(ModelFileError, match="config.json"):
        load_safetensors_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(_hf_config()))
    with pytest.raises(ModelFileError, match="safetensors files"):
        load_safetensors_model(tmp_path)
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(
        len(header).to_bytes(8, "little") + header + b"\0" * 8
    )
    with pytest.raises(ModelFileError, match="tensor w expected 16 bytes"):
        read_safetensors(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").write_bytes(b"\x05\0\0\0\0\0\0\0{nope")
    with pytest.raises(ModelFileError, match="JSON header"):
        read_safetensors(tmp_path / "model.safetensors")


def _safetensors(header: dict | list | str, data: bytes) -> bytes:
    raw = (header if isinstance(header, str) else json.dumps(header)).encode()
    return len(raw).to_bytes(8, "little") + raw + data


W = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
BAD_ENTRIES = {
    "negative start": ({"w": W | {"data_offsets": [-8, 0]}}, "0 <= start <= end"),
    "negative both": ({"w": W | {"data_offsets": [-16, -8]}}, "0 <= start <= end"),
    "inverted": ({"w": W | {"data_offsets": [8, 0]}}, "0 <= start <= end"),
    "beyond the file": ({"w": W | {"data_offsets": [8, 16]}}, "file has 8 bytes of data"),
    "one offset": ({"w": W | {"data_offsets": [0]}}, "data_offsets"),
    "float offsets": ({"w": W | {"data_offsets": [0.0, 8.0]}}, "data_offsets"),
    "no shape": ({"w": {"dtype": "F32", "data_offsets": [0, 8]}}, r"missing \['shape'\]"),
    "no dtype": ({"w": {"shape": [2], "data_offsets": [0, 8]}}, r"missing \['dtype'\]"),
    "no offsets": ({"w": {"dtype": "F32", "shape": [2]}}, r"missing \['data_offsets'\]"),
    "entry not an object": ({"w": [0, 8]}, "expected an object entry"),
    "entry null": ({"w": None}, "expected an object entry"),
    "shape not a list": ({"w": W | {"shape": 2}}, "shape of ints"),
    "negative dim": ({"w": W | {"shape": [-1, -2]}}, "shape of ints"),
    "shape vs bytes": ({"w": W | {"shape": [3]}}, r"expected 12 bytes of data \(shape \[3\] F32\)"),
    "dtype a list": ({"w": W | {"dtype": ["F32"]}}, "unsupported dtype"),
}


@pytest.mark.parametrize("case", BAD_ENTRIES)
def test_bad_safetensors_entries_name_tensor_and_file(tmp_path: Path, case):
    header, match = BAD_ENTRIES[case]
    path = tmp_path / "model.safetensors"
    path.write_bytes(_safetensors(header, bytes(8)))
    with pytest.raises(ModelFileError, match=match) as info:
        read_safetensors(path)
    assert f"{path}: tensor w" in str(info.value)


@pytest.mark.parametrize("header, data, match", [
    ("[1, 2]", b"", "JSON object header"),
    ('{"w": 1, "w": 2}', b"", "appears twice"),
    (None, b"", "8-byte header length"),
])
def test_bad_safetensors_headers(tmp_path: Path, header, data, match):
    path = tmp_path / "model.safetensors"
    if header is None:  # the length says more than the file holds
        path.write_bytes((100).to_bytes(8, "little") + b"{}")
    else:
        path.write_bytes(_safetensors(header, data))
    with pytest.raises(ModelFileError, match=match):
        read_safetensors(path)
    path.write_bytes(b"\x02\0\0")  # shorter than the length field
    with pytest.raises(ModelFileError, match="8-byte header length"):
        read_safetensors(path)


def test_a_tensor_in_two_shards_is_refused(tmp_path: Path, generator):
    st = pytest.importorskip("safetensors.torch")
    (tmp_path / "config.json").write_text(json.dumps(_hf_config()))
    tensors = {n: torch.randn(shape, generator=generator) for n, shape in hf_shapes(TINY).items()}
    names = sorted(tensors)
    st.save_file({n: tensors[n] for n in names[:10]}, str(tmp_path / "a.safetensors"))
    st.save_file({n: tensors[n] for n in names[9:]}, str(tmp_path / "b.safetensors"))
    twice = f"b.safetensors: tensor {names[9]} is also in .*a.safetensors"
    with pytest.raises(ModelFileError, match=twice):
        load_safetensors_model(tmp_path)
    st.save_file({n: tensors[n] for n in names[10:]}, str(tmp_path / "b.safetensors"))
    assert load_safetensors_model(tmp_path).config == TINY


def _hf_config(**changes) -> dict:
    base = {
        "model_type": "llama",
        "vocab_size": TINY.vocab_size,
        "hidden_size": TINY.dim,
        "num_hidden_layers": TINY.n_layers,
        "num_attention_heads": TINY.n_heads,
        "num_key_value_heads": TINY.n_kv_heads,
        "intermediate_size": TINY.ffn_dim,
        "rope_theta": TINY.rope_theta,
        "rms_norm_eps": TINY.norm_eps,
        "max_position_embeddings": TINY.max_seq_len,
        "tie_word_embeddings": True,
    }
    return base | changes


def test_config_from_hf_accepts_plain_llama_only():
    assert config_from_hf(_hf_config()) == TINY
    assert config_from_hf(_hf_config(), max_seq_len=32).max_seq_len == 32
    for bad in (
        {"model_type": "qwen2"},
        {"attention_bias": True},
        {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
        {"head_dim": 32},
    ):
        with pytest.raises(ConfigError):
            config_from_hf(_hf_config(**bad))
