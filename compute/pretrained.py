"""Jobs that start from a trained model: its file by hash, its tokenizer for the text.

Owns what a job with ``init`` set needs (specs/compute.md 7): finding the
file whose SHA-256 ``init`` names (`model_file`: the files registered
with `register_model_file`, and the bundled SmolLM2-135M-Instruct), its
model config (`pretrained_config`), its weights as the job's initial model
(`pretrained_model`, float32, in training mode) and a text in its
tokens (`text_tokens`, `tokenizer_for`). The file is a GGUF (a released
model, or a job's GGUF export) or a job's .safetensors export
(`compute.export`): an export's tokens are those of its own job (bytes for
a byte-level job; its ``init``'s for the others, so that file must be
known too). A file is hashed once per process.
"""

from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from pathlib import Path

import torch

from compute import hashing
from compute.config import ModelConfig
from compute.errors import ComputeError, ConfigError, ModelFileError
from compute.model import Transformer

__all__ = ["export_config_text", "gguf_of", "model_file", "not_an_export", "pretrained_config",
           "pretrained_model", "register_model_file", "text_tokens", "tokenizer_for"]

_registered: dict[str, Path] = {}


@lru_cache(maxsize=8)
def _hashed(path: str, mtime_ns: int, size: int) -> str:
    return hashing.file_sha256(path)


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of a model file (cached per path, mtime and size)."""
    st = Path(path).stat()
    return _hashed(str(Path(path).resolve()), st.st_mtime_ns, st.st_size)


def register_model_file(path: Path, sha256: str | None = None) -> str:
    """Make a local model file (a GGUF or a job's export) findable by its SHA-256; returns
    the hash.

    Args:
        sha256: the file's hash when the caller has just checked it (a
            fetched file); else it is computed.
    """
    sha = sha256 or file_sha256(path)
    _registered[sha] = Path(path)
    return sha


def bundled_sha256() -> str:
    """The SHA-256 of the bundled SmolLM2-135M-Instruct GGUF (`compute.gguf.find_gguf`)."""
    from compute.gguf import find_gguf

    return file_sha256(find_gguf())


def model_file(sha256: str) -> Path:
    """The model file whose SHA-256 is ``sha256``.

    Raises:
        ModelFileError: no registered file and not the bundled model.
    """
    if sha256 in _registered:
        return _registered[sha256]
    from compute.gguf import find_gguf

    try:
        bundled = find_gguf()
    except ModelFileError:
        bundled = None
    if bundled is not None and file_sha256(bundled) == sha256:
        return bundled
    raise ModelFileError(f"no model file with SHA-256 {sha256[:16]}.. is known here (the "
                         "bundled SmolLM2 is another)")


def pretrained_config(sha256: str, max_seq_len: int) -> ModelConfig:
    """The model config of the file ``sha256``, its context cut to ``max_seq_len``.

    The file is a GGUF, or a job's .safetensors export (`compute.export`),
    whose metadata holds its job's config.

    Raises:
        ModelFileError: no such file known here, or not a model file.
    """
    path = model_file(sha256)
    if _is_gguf(path):
        from compute.gguf import config_from_gguf, open_gguf

        return config_from_gguf(open_gguf(path), max_seq_len=max_seq_len)
    return dataclasses.replace(_export_meta(path)[0], max_seq_len=max_seq_len)


def pretrained_model(sha256: str, config: ModelConfig) -> Transformer:
    """The file's weights as a float32 model in training mode.

    Raises:
        ConfigError: ``config`` is not the file's (with its context cut as ``config`` says).
    """
    path = model_file(sha256)
    gguf = _is_gguf(path)
    if gguf:
        from compute.gguf import load_gguf, open_gguf

        model = load_gguf(reader=open_gguf(path), max_seq_len=config.max_seq_len)
        own = model.config
    else:
        own = dataclasses.replace(_export_meta(path)[0], max_seq_len=config.max_seq_len)
    if own != config:
        differ = [f"{f.name} {getattr(config, f.name)} (the file's: {getattr(own, f.name)})"
                  for f in dataclasses.fields(config)
                  if getattr(config, f.name) != getattr(own, f.name)]
        raise ConfigError(f"the job's model is not the file's: {', '.join(differ)}")
    if not gguf:
        from safetensors.torch import load_file

        try:
            model = Transformer.from_state_dict(own, load_file(str(path)))
        except (RuntimeError, KeyError, ValueError) as exc:
            raise ModelFileError(f"{path}: the weights are not its job's model: {exc}") from None
    return model.train()


def text_tokens(text: bytes, init: str) -> torch.Tensor:
    """UTF-8 ``text`` in the tokens of the model file ``init``: (N,) int64, no BOS.

    A byte-level job's export reads bytes (token i is byte i).
    """
    tokenizer = tokenizer_for(init)
    if tokenizer is None:
        return torch.tensor(list(text), dtype=torch.int64)
    return torch.tensor(tokenizer.encode(text.decode("utf-8"), add_bos=False),
                        dtype=torch.int64)


@lru_cache(maxsize=4)
def tokenizer_for(init: str):
    """The `Tokenizer` of the model file ``init`` ("" or a byte-level job's export: None).

    A GGUF carries its own; a job's export has its job's (that of the job's
    own ``init``, which must be known here too).
    """
    if not init:
        return None
    path = model_file(init)
    if not _is_gguf(path):
        return tokenizer_for(_export_meta(path)[1])
    from compute.gguf import open_gguf
    from compute.tokenizer import Tokenizer

    return Tokenizer.from_gguf(reader=open_gguf(path))


def gguf_of(init: str) -> Path | None:
    """The GGUF file a model descends from: ``init`` itself, or its export's job's ``init``
    (None: a byte-level line, with no tokenizer a GGUF could carry)."""
    if not init:
        return None
    path = model_file(init)
    return path if _is_gguf(path) else gguf_of(_export_meta(path)[1])


def _is_gguf(path: Path) -> bool:
    """By its magic (a file named .gguf is read as one, to say what is wrong with it)."""
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF" or Path(path).suffix == ".gguf"


def export_config_text(path: Path) -> str:
    """The job config JSON in a .safetensors export's metadata (`compute.export`).

    Raises:
        ModelFileError: not an export of pnode's.
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt") as f:
            return (f.metadata() or {})["pnode_config"]
    except (OSError, KeyError, SafetensorError) as exc:
        raise not_an_export(path, exc) from None


def not_an_export(path: Path, why: BaseException) -> ModelFileError:
    """The error for a file that is not a job's export as `pnode job export` writes it."""
    return ModelFileError(f"{path} is not a job's weights as `pnode job export` writes them: "
                          f"{why}")


def _export_meta(path: Path) -> tuple[ModelConfig, str]:
    """(model config, its job's ``init``) from an export's metadata (read here rather than
    with `compute.jobfile`, which needs `compute.data`, which needs this module)."""
    text = export_config_text(path)
    try:
        raw = json.loads(text)
        return ModelConfig(**raw["model"]), str(raw.get("init", ""))
    except (KeyError, ValueError, TypeError, ComputeError) as exc:
        raise not_an_export(path, exc) from None
