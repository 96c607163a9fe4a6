"""`pnode start` as real processes on 127.0.0.1: two nodes sync, then stop cleanly.

Every process is killed on teardown if still alive; every wait has a deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.datadir import DataDir

ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate, what: str, limit: float = 15.0, step: float = 0.05):
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

    def start(name: str, *args: str):
        out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        with open(out, "w") as fo, open(err, "w") as fe:
            proc = subprocess.Popen([sys.executable, "-m", "node.cli", "start", *args],
                                    cwd=ROOT, env=env, stdout=fo, stderr=fe)
        procs.append((proc, out, err))
        return proc, out, err

    yield start
    for proc, _, _ in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def stop(proc: subprocess.Popen, limit: float = 10.0) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=limit)


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


@pytest.fixture
def node_a(tmp_path, pnode):
    a = tmp_path / "A"
    r = pnode("init", "--data-dir", str(a), "--chain-id", "t-start", "--slot-ms", "50")
    assert r.code == 0, r.err
    r = pnode("produce", "--data-dir", str(a), "--blocks", "5")
    assert r.code == 0, r.err
    return a


def test_two_nodes_sync_and_stop_cleanly(tmp_path, pnode, spawn, node_a):
    a, b = node_a, tmp_path / "B"
    db = DataDir(a).open_chain()
    a_tip, a_height = db.tip_hash, db.height
    db.store.close()
    assert a_height == 5

    proc_a, out_a, err_a = spawn("a", "--data-dir", str(a))
    addr = wait_for(lambda: read(a / "node.addr").strip(), "A's node.addr")
    assert addr.startswith("/ip4/127.0.0.1/tcp/") and "/p2p/" in addr
    wait_for(lambda: f"listening on {addr}" in read(out_a), "A's listening line")

    r = pnode("init", "--data-dir", str(b), "--genesis", str(a / "genesis.json"))
    assert r.code == 0, r.err
    proc_b, out_b, err_b = spawn("b", "--data-dir", str(b), "--peers", addr)
    wait_for(lambda: "synced 5 blocks" in read(out_b), "B's sync line", limit=20.0)
    assert (b / "node.addr").exists()

    assert stop(proc_b) == 0, read(err_b)
    assert stop(proc_a) == 0, read(err_a)
    assert not (a / "node.addr").exists() and not (b / "node.addr").exists()

    db = DataDir(b).open_chain()
    try:
        assert db.height == a_height and db.tip_hash == a_tip
        db.verify_chain()
    finally:
        db.store.close()
    r = pnode("verify", "chain", "--data-dir", str(b))
    assert r.code == 0, r.out + r.err


def test_start_on_a_data_dir_held_by_a_running_node_fails(spawn, node_a):
    proc_a, _, err_a = spawn("a", "--data-dir", str(node_a))
    wait_for(lambda: (node_a / "node.addr").exists(), "A's node.addr")
    second = subprocess.run(
        [sys.executable, "-m", "node.cli", "start", "--data-dir", str(node_a)],
        cwd=ROOT, capture_output=True, text=True, timeout=20)
    assert second.returncode == 2
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "locked" in lines[0], second.stderr
    assert proc_a.poll() is None  # the running node is unharmed
    assert stop(proc_a) == 0, read(err_a)
    assert not (node_a / "node.addr").exists()


@pytest.mark.parametrize("args, expect", [
    (("--listen", "not-an-addr"), "bad listen address"),
    (("--peers", "/ip4/127.0.0.1/tcp/1"), "bad peer address"),
])
def test_bad_multiaddr_is_one_line_and_exit_2(pnode, node_a, args, expect):
    r = pnode("start", "--data-dir", str(node_a), *args)
    assert r.code == 2 and expect in r.err and len(r.err.strip().splitlines()) == 1


def test_unreachable_peer_is_not_fatal(spawn, node_a, tmp_path):
    dead = "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWDVSyhRMdzqy4FDRbRWE8fGdGBLizkNutUdLhXN15Cgcc"
    proc, out, err = spawn("a", "--data-dir", str(node_a), "--peers", dead)
    wait_for(lambda: "unreachable" in read(err), "a logged dial failure")
    assert proc.poll() is None
    assert stop(proc) == 0, read(err)
