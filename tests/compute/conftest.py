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


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one thread skips thread hand-offs, which stall on a busy 2-core machine.

    Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
