"""The real SmolLM2 model, its tokenizer, and transformers' copies of both.

Each loads once per test session (seconds each). transformers (with
accelerate, which it needs to read GGUF) is a test-only reference installed
by the dev extra. Everything loads from the local GGUF file, offline.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from unittest import mock

import pytest
import torch

from compute.gguf import find_gguf, load_gguf, open_gguf
from compute.tokenizer import Tokenizer


def _offline() -> AbstractContextManager:
    # Nothing may reach the network: transformers must read the local file.
    return mock.patch.dict(os.environ, {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})


@pytest.fixture(scope="session")
def gguf_reader():
    return open_gguf()


@pytest.fixture(scope="session")
def smol(gguf_reader):
    """Our SmolLM2-135M-Instruct, float32."""
    return load_gguf(reader=gguf_reader)


@pytest.fixture(scope="session")
def smol_tokenizer(gguf_reader):
    return Tokenizer.from_gguf(reader=gguf_reader)


@pytest.fixture(scope="session")
def hf_smol():
    """transformers' LlamaForCausalLM read from the same GGUF file."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    path = find_gguf()
    with _offline():
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        )
    return model.eval()


@pytest.fixture(scope="session")
def hf_tokenizer():
    transformers = pytest.importorskip("transformers")
    path = find_gguf()
    with _offline():
        return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
