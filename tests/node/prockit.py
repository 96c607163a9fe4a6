"""Helpers for tests that run `pnode start` as real processes on 127.0.0.1.

`spawn` (a fixture, registered by tests/node/conftest.py) starts ``python -m
node.cli start ...`` with stdout/stderr in files and kills whatever is still
alive at teardown; `wait_for` polls with a deadline; `stop` sends SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ANY_PORT = "/ip4/127.0.0.1/tcp/0"  # `pnode start` defaults to a fixed port


def wait_for(predicate, what: str, limit: float = 15.0, step: float = 0.05):
    """Poll ``predicate`` until it returns something true; fail after ``limit`` s."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {limit} s waiting for {what}")


@pytest.fixture
def spawn(tmp_path):
    """Start `python -m node.cli start ...`; stdout/stderr go to files."""
    procs: list[tuple[subprocess.Popen, Path, Path]] = []
    env = dict(os.environ, PYTHONUNBUFFERED="1", PNODE_PASSPHRASE="correct horse")

    def start(name: str, *args: str, env_remove: tuple[str, ...] = ()):
        out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        env_here = {k: v for k, v in env.items() if k not in env_remove}
        if "--listen" not in args:  # many nodes on one machine: any free port each
            args = ("--listen", ANY_PORT, *args)
        if "--log-level" not in args:  # the tests read every line, repeats included
            args = ("--log-level", "debug", *args)
        with open(out, "w") as fo, open(err, "w") as fe:
            proc = subprocess.Popen([sys.executable, "-m", "node.cli", "start", *args],
                                    cwd=ROOT, env=env_here, stdout=fo, stderr=fe)
        procs.append((proc, out, err))
        return proc, out, err

    yield start
    for proc, _, _ in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def stop(proc: subprocess.Popen, limit: float = 10.0) -> int:
    """SIGTERM, then the exit code."""
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=limit)


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def node_addr(data_dir: Path, proc: subprocess.Popen | None = None, limit: float = 15.0) -> str:
    """The address a started node wrote to ``node.addr`` (waits up to ``limit`` s)."""
    def ready():
        assert proc is None or proc.poll() is None, f"node on {data_dir} exited"
        return read(data_dir / "node.addr").strip()
    return wait_for(ready, f"{data_dir}/node.addr", limit)


def live_status(pnode, data_dir: Path) -> dict:
    """`pnode status --json` of a running node (fails if it reads the store instead)."""
    r = pnode("status", "--data-dir", str(data_dir), "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["running"] is True, doc
    return doc
