"""node.cliutil: the OpenMP spin default that swarm processes set before torch loads."""

from __future__ import annotations

import os

import pytest

from node import cliutil


@pytest.mark.parametrize("env, want", [
    ({}, {"GOMP_SPINCOUNT": cliutil.SPIN_COUNT}),
    ({"GOMP_SPINCOUNT": "0"}, {"GOMP_SPINCOUNT": "0"}),
    ({"OMP_WAIT_POLICY": "ACTIVE"}, {"OMP_WAIT_POLICY": "ACTIVE"}),
])
def test_short_spin_unless_the_user_chose(monkeypatch, env, want):
    for key in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cliutil.share_cpus_politely()
    got = {k: os.environ[k] for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY") if k in os.environ}
    assert got == want
