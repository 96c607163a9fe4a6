"""Every bench runs: its ``--smoke`` mode, a process of its own (tests/bench/smokekit.py).

This file runs the benches that need no swarm of servers (one process, a
node, or devnets); tests/bench/test_smoke_swarm.py runs the others.
"""

from __future__ import annotations

import pytest

from tests.bench.smokekit import FIGURES, LIMIT_S, SWARM, benches, check_smoke


def test_every_bench_has_a_smoke_test():
    assert benches() == set(FIGURES), "a bench without a smoke test, or a test without a bench"


@pytest.mark.timeout(LIMIT_S + 60)
@pytest.mark.parametrize("name", sorted(set(FIGURES) - SWARM))
def test_smoke(name):
    check_smoke(name)
