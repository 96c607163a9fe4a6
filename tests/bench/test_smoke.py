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


def test_the_noise_bench_cheats_as_the_attack_battery_does(monkeypatch):
    """bench/pol_noise.py keeps its own copy of the cheat's size (it runs where only torch is)."""
    import importlib.util
    from node.pol.attacks import SUB_THRESHOLD
    monkeypatch.syspath_prepend("bench")  # its sibling benchkit
    spec = importlib.util.spec_from_file_location("pol_noise", "bench/pol_noise.py")
    noise = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noise)
    assert noise.SUB_THRESHOLD == SUB_THRESHOLD

