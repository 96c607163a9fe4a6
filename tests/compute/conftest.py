"""Fixtures for compute tests. The real-model fixtures (smol, hf_smol, ...)
live in tests/modelkit.py, shared by every test package through tests/conftest.py.
"""

from __future__ import annotations

import pytest
import torch


# Fixed thread count: the timings and rounding the tests see stay comparable.
torch.set_num_threads(2)


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(1234)
