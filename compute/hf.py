"""Hugging Face Llama checkpoints: config.json, tensor names, safetensors files.

Owns the mapping between HF's LlamaForCausalLM tensor names
(`model.layers.N.self_attn.q_proj.weight`, ...) and this package's fused
parameters (`layers.N.attn.wqkv.weight`, ...), in both directions, with shape
checks. The GGUF loader maps its names onto HF names and comes through here too.

Also reads safetensors files: the header (8-byte length, JSON) is checked
here, so a bad file fails with a `ModelFileError` that names the tensor and the
file; the tensors are then read one at a time through the safetensors
package's `safe_open`, which does not load the whole file into memory.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from compute.config import ModelConfig
from compute.errors import ConfigError, ModelFileError
from compute.model import ModelPart, Transformer

_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def hf_shapes(cfg: ModelConfig, part: ModelPart | None = None) -> dict[str, tuple[int, ...]]:
    """Every HF tensor name of a Llama checkpoint (or of `part` of it) with its shape."""
    part = part or ModelPart.whole(cfg.n_layers)
    c, hd, f = cfg.dim, cfg.head_dim, cfg.ffn_dim
    shapes: dict[str, tuple[int, ...]] = {}
    if part.ends:
        shapes["model.embed_tokens.weight"] = (cfg.vocab_size, c)
        shapes["model.norm.weight"] = (c,)
    if part.ends and not cfg.tie_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, c)
    for i in part.layers:
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (c,)
        shapes[p + "post_attention_layernorm.weight"] = (c,)
        shapes[p + "self_attn.q_proj.weight"] = (cfg.n_heads * hd, c)
        shapes[p + "self_attn.k_proj.weight"] = (cfg.n_kv_heads * hd, c)
        shapes[p + "self_attn.v_proj.weight"] = (cfg.n_kv_heads * hd, c)
        shapes[p + "self_attn.o_proj.weight"] = (c, cfg.n_heads * hd)
        shapes[p + "mlp.gate_proj.weight"] = (f, c)
        shapes[p + "mlp.up_proj.weight"] = (f, c)
        shapes[p + "mlp.down_proj.weight"] = (c, f)
    return shapes


def check_hf_tensors(cfg: ModelConfig, tensors: Mapping[str, torch.Tensor], source: str,
                     part: ModelPart | None = None) -> None:
    """Raise unless `tensors` holds exactly the HF names of `cfg` (or `part`) with right shapes.

    A tied model's `lm_head.weight` may be present (it is ignored).

    Raises:
        ModelFileError: a tensor is missing, unexpected, or has the wrong shape.
    """
    shapes = hf_shapes(cfg, part)
    missing = sorted(set(shapes) - set(tensors))
    unexpected = sorted(set(tensors) - set(shapes) - {"lm_head.weight"})
    if missing or unexpected:
        raise ModelFileError(
            f"{source}: expected Llama tensors; missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    for name, shape in shapes.items():
        if tuple(tensors[name].shape) != shape:
            raise ModelFileError(
                f"{source}: tensor {name} expected shape {shape}, got {tuple(tensors[name].shape)}"
            )


def model_state_from_hf(
    cfg: ModelConfig, tensors: Mapping[str, torch.Tensor], source: str = "checkpoint",
    part: ModelPart | None = None,
) -> dict[str, torch.Tensor]:
    """Convert HF-named tensors into a float32 state dict for `Transformer(cfg)`.

    Args:
        part: the weights `tensors` holds (default: all of them).

    Raises:
        ModelFileError: as `check_hf_tensors`.
    """
    part = part or ModelPart.whole(cfg.n_layers)
    check_hf_tensors(cfg, tensors, source, part)

    def t(name: str, copy: bool = True) -> torch.Tensor:
        # The model adopts these tensors, so each gets storage of its own
        # (torch.cat below copies already).
        return tensors[name].to(torch.float32, memory_format=torch.contiguous_format, copy=copy)

    sd: dict[str, torch.Tensor] = {}
    if part.ends:
        emb = t("model.embed_tokens.weight")
        sd = {"tok_emb.weight": emb, "norm.weight": t("model.norm.weight")}
        sd["lm_head.weight"] = emb if cfg.tie_embeddings else t("lm_head.weight")
    for i in part.layers:
        p, q = f"model.layers.{i}.", f"layers.{i}."
        sd[q + "attn_norm.weight"] = t(p + "input_layernorm.weight")
        sd[q + "mlp_norm.weight"] = t(p + "post_attention_layernorm.weight")
        qkv = [t(p + f"self_attn.{n}_proj.weight", copy=False) for n in "qkv"]
        sd[q + "attn.wqkv.weight"] = torch.cat(qkv, dim=0)
        sd[q + "attn.wo.weight"] = t(p + "self_attn.o_proj.weight")
        gate_up = [t(p + f"mlp.{n}_proj.weight", copy=False) for n in ("gate", "up")]
        sd[q + "mlp.w_gate_up.weight"] = torch.cat(gate_up, dim=0)
        sd[q + "mlp.w_down.weight"] = t(p + "mlp.down_proj.weight")
    return sd


def hf_state_from_model(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's weights under HF LlamaForCausalLM names (views, not copies)."""
    cfg = model.config
    nq, nkv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    sd = model.state_dict()
    out = {
        "model.embed_tokens.weight": sd["tok_emb.weight"],
        "model.norm.weight": sd["norm.weight"],
    }
    out["lm_head.weight"] = sd["lm_head.weight"]
    for i in range(cfg.n_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        out[p + "input_layernorm.weight"] = sd[q + "attn_norm.weight"]
        out[p + "post_attention_layernorm.weight"] = sd[q + "mlp_norm.weight"]
        wq, wk, wv = sd[q + "attn.wqkv.weight"].split([nq, nkv, nkv], dim=0)
        (
            out[p + "self_attn.q_proj.weight"],
            out[p + "self_attn.k_proj.weight"],
            out[p + "self_attn.v_proj.weight"],
        ) = wq, wk, wv
        out[p + "self_attn.o_proj.weight"] = sd[q + "attn.wo.weight"]
        gate, up = sd[q + "mlp.w_gate_up.weight"].chunk(2, dim=0)
        out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = gate, up
        out[p + "mlp.down_proj.weight"] = sd[q + "mlp.w_down.weight"]
    return out


def model_from_hf_tensors(
    cfg: ModelConfig, tensors: Mapping[str, torch.Tensor], source: str = "checkpoint",
    part: ModelPart | None = None,
) -> Transformer:
    """Build a `Transformer(cfg)` holding HF-named weights (copied, float32), or `part` of them."""
    return Transformer.from_state_dict(cfg, model_state_from_hf(cfg, tensors, source, part), part)


def config_from_hf(hf: Mapping, *, max_seq_len: int | None = None) -> ModelConfig:
    """ModelConfig from the dict of a HF Llama `config.json`.

    Args:
        hf: the parsed config.json.
        max_seq_len: cap on the context (default: max_position_embeddings).

    Raises:
        ConfigError: not a plain Llama config (other model type, biases,
            RoPE scaling, a head size other than hidden_size / heads).
    """
    if hf.get("model_type") != "llama":
        raise ConfigError(f"expected model_type 'llama', got {hf.get('model_type')!r}")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise ConfigError("expected a Llama without biases, got attention_bias or mlp_bias set")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ConfigError(f"expected default RoPE, got scaling {rope}")
    heads = hf["num_attention_heads"]
    if hf.get("head_dim") not in (None, hf["hidden_size"] // heads):
        raise ConfigError(f"expected head_dim {hf['hidden_size'] // heads}, got {hf['head_dim']}")
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        dim=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=heads,
        n_kv_heads=hf.get("num_key_value_heads") or heads,
        ffn_dim=hf["intermediate_size"],
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_seq_len=max_seq_len or hf.get("max_position_embeddings", 2048),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Read every tensor of a .safetensors file (dtypes kept), one tensor at a time.

    Args:
        path: the file.

    Returns:
        Each tensor by name, in the header's order, each in storage of its own.

    Raises:
        ModelFileError: the file is missing or truncated, its header is not a
            JSON object (or names a key twice), or a tensor entry is bad (not
            an object; `dtype`, `shape` or `data_offsets` missing or
            malformed; offsets negative, inverted or beyond the file; a byte
            length other than the shape's), naming the tensor and the file;
            or the safetensors package refuses the file (for instance data
            bytes that no tensor covers).
    """
    path = Path(path)
    if sys.byteorder != "little":
        raise ModelFileError("reading safetensors needs a little-endian host")
    names = _safetensors_names(path)
    try:
        with safe_open(path, framework="pt") as f:
            return {name: f.get_tensor(name) for name in names}
    except (OSError, SafetensorError) as e:
        raise ModelFileError(f"{path}: expected a safetensors file, got an error: {e}") from e


def _safetensors_names(path: Path) -> list[str]:
    """The tensor names of a safetensors file, once its header (read alone) checks out.

    The header is checked here rather than left to `safe_open` so that every
    bad entry gets a message naming the tensor, the file and what was wrong.

    Raises:
        ModelFileError: as `read_safetensors`, for the header and its entries.
    """
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            n = int.from_bytes(head, "little")
            if len(head) < 8 or 8 + n > size:
                raise ModelFileError(
                    f"{path}: expected an 8-byte header length and that many header bytes, "
                    f"got {size} bytes in all, header length {n}"
                )
            raw = f.read(n)
    except OSError as e:
        raise ModelFileError(f"cannot read safetensors file {path}: {e}") from e
    try:
        header = json.loads(raw, object_pairs_hook=_unique_keys)
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelFileError(
            f"{path}: expected a safetensors JSON header, got unparsable bytes ({e})"
        ) from e
    if not isinstance(header, dict):
        raise ModelFileError(f"{path}: expected a JSON object header, got {type(header).__name__}")
    names = [name for name in header if name != "__metadata__"]
    for name in names:
        _check_safetensors_entry(size - 8 - n, name, header[name], path)
    return names


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """json object_pairs_hook: a dict, refusing a key that comes twice."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"key {dup!r} appears twice")
    return out


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_safetensors_entry(data_bytes: int, name: str, info: object, path: Path) -> None:
    """Raise a `ModelFileError` unless a header entry describes a tensor within the data.

    Args:
        data_bytes: the size of the file's data section (after the header).
        name: the tensor's name.
        info: its header entry.
        path: the file (for messages).
    """
    where = f"{path}: tensor {name}"
    if not isinstance(info, dict):
        raise ModelFileError(f"{where}: expected an object entry, got {type(info).__name__}")
    missing = [k for k in ("dtype", "shape", "data_offsets") if k not in info]
    if missing:
        raise ModelFileError(f"{where}: expected dtype, shape and data_offsets, missing {missing}")
    dtype = _SAFETENSORS_DTYPES.get(info["dtype"]) if isinstance(info["dtype"], str) else None
    if dtype is None:
        raise ModelFileError(f"{where} has unsupported dtype {info['dtype']!r}")
    shape, offsets = info["shape"], info["data_offsets"]
    if not (isinstance(shape, list) and all(_is_int(d) and d >= 0 for d in shape)):
        raise ModelFileError(f"{where}: expected a shape of ints >= 0, got {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_int, offsets))):
        raise ModelFileError(
            f"{where}: expected data_offsets [start, end] of ints, got {offsets!r}"
        )
    start, end = offsets
    # Offsets count from the end of the header: a negative start would read header bytes.
    if not 0 <= start <= end:
        raise ModelFileError(f"{where}: expected data_offsets 0 <= start <= end, got {offsets}")
    count = 1
    for d in shape:
        count *= d
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    if end - start != nbytes:
        raise ModelFileError(
            f"{where} expected {nbytes} bytes of data (shape {shape} {info['dtype']}), "
            f"data_offsets {offsets} hold {end - start}"
        )
    if end > data_bytes:
        raise ModelFileError(
            f"{where} expected {nbytes} bytes of data at data_offsets {offsets}, "
            f"the file has {data_bytes} bytes of data"
        )


def load_safetensors_model(directory: str | Path, *, max_seq_len: int | None = None) -> Transformer:
    """Load a HF Llama checkpoint directory (config.json + *.safetensors, sharded or not).

    Raises:
        ModelFileError: files missing, a file unreadable (`read_safetensors`),
            a tensor in two files, or tensors unexpected.
        ConfigError: the config is not a supported Llama.
    """
    directory = Path(directory)
    try:
        hf = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ModelFileError(f"expected a readable config.json in {directory}: {e}") from e
    cfg = config_from_hf(hf, max_seq_len=max_seq_len)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelFileError(f"expected *.safetensors files in {directory}, found none")
    tensors: dict[str, torch.Tensor] = {}
    first: dict[str, Path] = {}
    for f in files:
        for name, t in read_safetensors(f).items():
            if name in first:
                raise ModelFileError(
                    f"{f}: tensor {name} is also in {first[name]}; expected each tensor in one file"
                )
            first[name], tensors[name] = f, t
    return model_from_hf_tensors(cfg, tensors, source=str(directory))
