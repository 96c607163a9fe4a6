"""`pnode start` as real processes on 127.0.0.1: sync, produce, status, send, stop.

Every process is killed on teardown if still alive; every wait has a deadline.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from ledger.types import COIN
from node.datadir import DataDir
from tests.node.prockit import ANY_PORT, ROOT, live_status, node_addr, read, stop, wait_for


@pytest.fixture
def node_a(tmp_path, pnode):
    a = tmp_path / "A"
    r = pnode("init", "--no-job", "--data-dir", str(a), "--chain-id", "t-start", "--slot-ms", "50")
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

    proc_a, out_a, err_a = spawn("a", "--no-serve", "--data-dir", str(a), "--no-produce")
    addr = wait_for(lambda: read(a / "node.addr").strip(), "A's node.addr")
    assert addr.startswith("/ip4/127.0.0.1/tcp/") and "/p2p/" in addr
    wait_for(lambda: f"listening on {addr}" in read(out_a), "A's listening line")

    r = pnode("init", "--data-dir", str(b), "--genesis", str(a / "genesis.json"))
    assert r.code == 0, r.err
    proc_b, out_b, err_b = spawn("b", "--no-serve", "--data-dir", str(b), "--peers", addr)
    wait_for(lambda: "synced 5 blocks" in read(out_b), "B's sync line", limit=20.0)
    assert (b / "node.addr").exists() and (b / "node.sock").is_socket()
    wait_for(lambda: "not a registered, bonded producer" in read(out_b), "B to say it does "
             "not produce")  # once its first sync is over; it just follows the chain

    assert stop(proc_b) == 0, read(err_b)
    assert stop(proc_a) == 0, read(err_a)
    for d in (a, b):
        assert not (d / "node.addr").exists() and not (d / "node.sock").exists()
    assert read(out_b).count("not a registered, bonded producer") == 1

    db = DataDir(b).open_chain()
    try:
        assert db.height == a_height and db.tip_hash == a_tip
        db.verify_chain()
    finally:
        db.store.close()
    r = pnode("verify", "chain", "--data-dir", str(b))
    assert r.code == 0, r.out + r.err
    stored = pnode("status", "--data-dir", str(b), "--json").json()
    assert stored["running"] is False and stored["height"] == a_height


def test_start_on_a_data_dir_held_by_a_running_node_fails(spawn, node_a):
    proc_a, _, err_a = spawn("a", "--no-serve", "--data-dir", str(node_a), "--no-produce")
    wait_for(lambda: (node_a / "node.addr").exists(), "A's node.addr")
    second = subprocess.run(
        [sys.executable, "-m", "node.cli", "start", "--data-dir", str(node_a), "--no-serve"],
        cwd=ROOT, capture_output=True, text=True, timeout=20)
    assert second.returncode == 2
    lines = second.stderr.strip().splitlines()
    addr = (node_a / "node.addr").read_text().strip()
    assert len(lines) == 1, second.stderr
    assert f"a node is already running on {node_a} (pid {proc_a.pid}, {addr})" in lines[0]
    assert proc_a.poll() is None  # the running node is unharmed
    assert stop(proc_a) == 0, read(err_a)
    assert not (node_a / "node.addr").exists()
    # A holder with no control socket (a node still starting, a reader): the lock says it.
    with DataDir(node_a).open_chain():
        third = subprocess.run(
            [sys.executable, "-m", "node.cli", "start", "--data-dir", str(node_a), "--no-serve"],
            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert third.returncode == 2
    assert third.stderr.strip().splitlines() == [
        f"error: a node is already running on {node_a} (its chain store is locked; "
        "`pnode status` shows it)"], third.stderr


def test_a_taken_port_is_one_line_and_the_default_port_is_4411(tmp_path, pnode, spawn, node_a):
    # A takes any free port and B asks for it (a port probed free and then handed to A
    # could be taken meanwhile, by any process's outgoing connection).
    proc_a, _, err_a = spawn("a", "--no-serve", "--no-produce", "--data-dir", str(node_a),
                             "--listen", ANY_PORT)
    listen = node_addr(node_a, proc_a).split("/p2p/")[0]
    port = int(listen.rsplit("/tcp/", 1)[1])
    assert listen == f"/ip4/127.0.0.1/tcp/{port}" and port != 0
    b = tmp_path / "B"
    assert pnode("init", "--data-dir", str(b), "--genesis", str(node_a / "genesis.json")).code == 0
    second = subprocess.run(
        [sys.executable, "-m", "node.cli", "start", "--data-dir", str(b), "--no-serve",
         "--listen", listen], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert second.returncode == 2
    assert second.stderr.strip().splitlines() == [
        f"error: cannot listen on {listen}: port {port} is in use (another node?); choose "
        "another port, or tcp/0 for any free one"], second.stderr
    assert not (b / "node.addr").exists() and proc_a.poll() is None
    assert stop(proc_a) == 0, read(err_a)
    r = pnode("start", "--help")
    assert "[default: /ip4/127.0.0.1/tcp/4411]" in " ".join(r.out.split())


@pytest.mark.parametrize("args, expect", [
    (("--listen", "not-an-addr"), "bad listen address"),
    (("--peers", "/ip4/127.0.0.1/tcp/1"), "bad peer address"),
])
def test_bad_multiaddr_is_one_line_and_exit_2(pnode, node_a, args, expect):
    r = pnode("start", "--data-dir", str(node_a), *args)
    assert r.code == 2 and expect in r.err and len(r.err.strip().splitlines()) == 1


def test_unreachable_peer_is_not_fatal(spawn, node_a, tmp_path):
    dead = "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWDVSyhRMdzqy4FDRbRWE8fGdGBLizkNutUdLhXN15Cgcc"
    proc, out, err = spawn("a", "--no-serve", "--data-dir", str(node_a), "--peers", dead)
    wait_for(lambda: "unreachable" in read(err), "a logged dial failure")
    assert proc.poll() is None
    assert stop(proc) == 0, read(err)


# -- the node at work: production, status and transfers through the control socket --


def test_status_of_a_running_node_shows_peers_and_a_growing_height(
        tmp_path, pnode, spawn, node_a):
    proc_a, out_a, err_a = spawn("a", "--no-serve", "--data-dir", str(node_a), "--block-interval-ms", "100")
    addr_a = node_addr(node_a, proc_a)
    b = tmp_path / "B"
    assert pnode("init", "--data-dir", str(b), "--genesis", str(node_a / "genesis.json")).code == 0
    proc_b, _, err_b = spawn("b", "--no-serve", "--data-dir", str(b), "--peers", addr_a)
    node_addr(b, proc_b)

    first = live_status(pnode, node_a)
    assert first["registered"] and first["producing"] and first["height"] >= 5
    assert oct((node_a / "node.sock").stat().st_mode & 0o777) == "0o600"
    b_peer = read(b / "node.addr").strip().rsplit("/p2p/", 1)[1]
    wait_for(lambda: b_peer in live_status(pnode, node_a)["peers"], "A to list B as a peer")
    later = wait_for(lambda: (s := live_status(pnode, node_a))["height"] > first["height"] + 2
                     and s, "A's height to grow")
    assert later["tip"] != first["tip"] and "produced block" in read(out_a)
    status_b = wait_for(lambda: (s := live_status(pnode, b))["height"] >= later["height"] and s,
                        "B to follow A")
    assert status_b["producing"] is False and status_b["peers"] == [addr_a.rsplit("/p2p/", 1)[1]]
    # the store is the node's: `ledger show` asks it through the socket
    shown = pnode("ledger", "show", "--data-dir", str(node_a), "--json")
    assert shown.code == 0 and shown.json()["running"] is True, shown.err
    assert stop(proc_b) == 0, read(err_b)
    assert stop(proc_a) == 0, read(err_a)
    assert pnode("status", "--data-dir", str(node_a), "--json").json()["running"] is False


def test_pwallet_send_while_the_node_runs_lands_in_its_block(pnode, pwallet, spawn, node_a):
    d = str(node_a)
    proc, out, err = spawn("a", "--no-serve", "--data-dir", d, "--block-interval-ms", "100")
    node_addr(node_a, proc)
    bob = pwallet("create", "--data-dir", d, "--name", "bob", "--json").json()["address"]
    before = pwallet("balance", "--data-dir", d, "--json").json()
    assert before["running"] is True
    # Two at once: the second takes its nonce from the node's view, queued tx included.
    sent = [pwallet("send", bob, amount, "--data-dir", d, "--json") for amount in ("2.5", "1")]
    assert all(r.code == 0 for r in sent), [r.err for r in sent]
    assert [r.json()["nonce"] for r in sent] == [before["nonce"], before["nonce"] + 1]
    assert all(r.json()["running"] for r in sent)
    landed = wait_for(lambda: (r := pwallet("balance", bob, "--data-dir", d, "--json").json())
                      ["balance_units"] == 3_500_000 and r, "the transfers to land in a block")
    assert landed["running"] is True and landed["height"] > before["height"]
    mine = pwallet("balance", "--data-dir", d, "--json").json()
    assert (mine["nonce"], mine["queued"]) == (before["nonce"] + 2, 0)
    # A transfer the node refuses is an error, not a queued transaction.
    r = pwallet("send", bob, "100000", "--data-dir", d)
    assert r.code == 2 and "InsufficientFunds" in r.err
    assert stop(proc) == 0, read(err)
    stored = pwallet("balance", bob, "--data-dir", d, "--json").json()  # the store again
    assert stored["running"] is False and stored["balance_units"] == 3 * COIN + COIN // 2


def test_three_nodes_sync_a_chain_produced_while_one_was_down(tmp_path, pnode, spawn):
    a, b, c = (tmp_path / n for n in "ABC")
    assert pnode("init", "--no-job", "--data-dir", str(a), "--chain-id", "t-three", "--slot-ms", "50").code == 0
    for d in (b, c):
        assert pnode("init", "--data-dir", str(d), "--genesis", str(a / "genesis.json")).code == 0
    proc_a, _, err_a = spawn("a", "--no-serve", "--data-dir", str(a), "--block-interval-ms", "200")
    addr_a = node_addr(a, proc_a)
    proc_b, _, err_b = spawn("b", "--no-serve", "--data-dir", str(b), "--peers", addr_a)
    addr_b = node_addr(b, proc_b)
    proc_c, _, err_c = spawn("c1", "--no-serve", "--data-dir", str(c), "--peers", addr_a, "--peers", addr_b)
    node_addr(c, proc_c)

    def same_tip(*dirs, least: int = 0):
        tips = {(s["height"], s["tip"]) for s in (live_status(pnode, d) for d in dirs)}
        return len(tips) == 1 and next(iter(tips))[0] >= least and next(iter(tips))

    wait_for(lambda: same_tip(a, b, c, least=3), "A, B and C on one tip", limit=20)
    assert stop(proc_c) == 0, read(err_c)
    down = pnode("status", "--data-dir", str(c), "--json").json()
    assert down["running"] is False
    wait_for(lambda: live_status(pnode, a)["height"] >= down["height"] + 8,
             "A to produce while C is down")
    wait_for(lambda: same_tip(a, b), "B to follow A")

    proc_c, out_c, err_c = spawn("c2", "--no-serve", "--data-dir", str(c), "--peers", addr_a)
    node_addr(c, proc_c)
    height, _ = wait_for(lambda: same_tip(a, b, c, least=down["height"] + 8),
                         "C to catch up with A and B", limit=20)
    assert "synced" in read(out_c)  # the blocks made while it was down came by sync
    for proc, err in ((proc_c, err_c), (proc_b, err_b), (proc_a, err_a)):
        assert stop(proc) == 0, read(err)
    chains = [DataDir(d).open_chain() for d in (a, b, c)]
    try:
        assert len({db.hash_at(height) for db in chains}) == 1
        chains[2].verify_chain()
    finally:
        for db in chains:
            db.store.close()


@pytest.mark.parametrize("args, expect", [
    (("--layers", "10:5"), "need 0 <= START < END"),
    (("--layers", "0:10", "--auto"), "--layers fixes the span"),
    (("--no-serve", "--layers", "0:10"), "--no-serve cannot go with"),
    (("--gpu", "0"), "cuda"),
    (("--price", "-1"), "-1 is not in the range"),
    (("--trusted-peers", "/nonexistent/file"), "cannot read trusted-peers file"),
])
def test_bad_serving_flags_are_one_line_and_exit_2(pnode, node_a, args, expect):
    r = pnode("start", "--data-dir", str(node_a), *args)
    assert r.code == 2, r.err
    assert expect.lower() in r.err.lower() and len(r.err.strip().splitlines()) == 1
