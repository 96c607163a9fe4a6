"""Run the real `pnode` / `pwallet` entry points in-process and capture the result."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import pytest


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


def run_cli(capsys, monkeypatch, main, prog: str, *args: str) -> Result:
    """Call a console entry point with argv, as the shell would."""
    monkeypatch.setattr(sys, "argv", [prog, *args])
    capsys.readouterr()
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    out, err = capsys.readouterr()
    return Result(code, out, err)


@pytest.fixture
def pnode(capsys, monkeypatch):
    from node.cli.pnode import main
    monkeypatch.setenv("PNODE_PASSPHRASE", "correct horse")
    return lambda *args: run_cli(capsys, monkeypatch, main, "pnode", *args)


@pytest.fixture
def pwallet(capsys, monkeypatch):
    from wallet.cli import main
    monkeypatch.setenv("PNODE_PASSPHRASE", "correct horse")
    return lambda *args: run_cli(capsys, monkeypatch, main, "pwallet", *args)
