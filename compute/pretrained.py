"""Jobs that start from a released model: its GGUF file by hash, its tokenizer for the text.

Owns what a job with ``init`` set needs (specs/compute.md 7): finding the
GGUF file whose SHA-256 ``init`` names (`model_file`: the files registered
with `register_model_file`, and the bundled SmolLM2-135M-Instruct), its
model config (`pretrained_config`), its weights as the job's initial model
(`pretrained_model`, float32, in training mode) and a text in its
tokens (`text_tokens`). A file is hashed once
per process.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path

import torch

from compute import hashing
from compute.config import ModelConfig
from compute.errors import ConfigError, ModelFileError
from compute.model import Transformer

__all__ = ["model_file", "pretrained_config", "pretrained_model", "register_model_file",
           "text_tokens"]

_registered: dict[str, Path] = {}


@lru_cache(maxsize=8)
def _hashed(path: str, mtime_ns: int, size: int) -> str:
    return hashing.file_sha256(path)


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of a model file (cached per path, mtime and size)."""
    st = Path(path).stat()
    return _hashed(str(Path(path).resolve()), st.st_mtime_ns, st.st_size)


def register_model_file(path: Path, sha256: str | None = None) -> str:
    """Make a local GGUF file findable by its SHA-256; returns the hash.

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
    """The GGUF file whose SHA-256 is ``sha256``.

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
    raise ModelFileError(f"no GGUF file with SHA-256 {sha256[:16]}.. is known here (the "
                         "bundled SmolLM2 is another)")


def pretrained_config(sha256: str, max_seq_len: int) -> ModelConfig:
    """The model config of the GGUF file ``sha256``, its context cut to ``max_seq_len``."""
    from compute.gguf import config_from_gguf, open_gguf

    return config_from_gguf(open_gguf(model_file(sha256)), max_seq_len=max_seq_len)


def pretrained_model(sha256: str, config: ModelConfig) -> Transformer:
    """The GGUF file's weights as a float32 model in training mode.

    Raises:
        ConfigError: ``config`` is not the file's (with its context cut as ``config`` says).
    """
    from compute.gguf import load_gguf, open_gguf

    reader = open_gguf(model_file(sha256))
    model = load_gguf(reader=reader, max_seq_len=config.max_seq_len)
    if model.config != config:
        differ = [f"{f.name} {getattr(config, f.name)} (the file's: "
                  f"{getattr(model.config, f.name)})" for f in dataclasses.fields(config)
                  if getattr(config, f.name) != getattr(model.config, f.name)]
        raise ConfigError(f"the job's model is not the file's: {', '.join(differ)}")
    return model.train()


def text_tokens(text: bytes, init: str) -> torch.Tensor:
    """UTF-8 ``text`` in the tokens of the model file ``init``: (N,) int64, no BOS."""
    return torch.tensor(_tokenizer(init).encode(text.decode("utf-8"), add_bos=False),
                        dtype=torch.int64)


@lru_cache(maxsize=2)
def _tokenizer(init: str):
    from compute.gguf import open_gguf
    from compute.tokenizer import Tokenizer

    return Tokenizer.from_gguf(reader=open_gguf(model_file(init)))
