"""node.cliutil: the OpenMP spin default that swarm processes set before torch loads, and
the one-line errors of both CLIs."""

from __future__ import annotations

import os

import click
import pytest

from node import cliutil
from wallet.errors import WalletError


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


@pytest.mark.parametrize("raised, code, line", [
    (BaseExceptionGroup("g", [ExceptionGroup("h", [WalletError("no route")])]), 2,
     "error: no route"),
    (BaseExceptionGroup("g", [KeyboardInterrupt()]), 130, "interrupted"),
])
def test_a_nursery_wrapped_error_prints_one_line(monkeypatch, capsys, raised, code, line):
    """trio wraps what a generation raises; the CLI still prints one line."""
    @click.group()
    def group() -> None:
        pass

    @group.command()
    def fail() -> None:
        raise raised

    monkeypatch.setattr("sys.argv", ["prog", "fail"])
    with pytest.raises(SystemExit) as exit_:
        cliutil.run(group)
    assert exit_.value.code == code
    assert capsys.readouterr().err.strip() == line


def test_several_errors_in_a_group_are_not_hidden():
    """Two leaves: no single line would be true, so the group goes up whole."""
    group = ExceptionGroup("g", [ValueError("a"), WalletError("b")])
    assert cliutil.single_leaf(group) is group
