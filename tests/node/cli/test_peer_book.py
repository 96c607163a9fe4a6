"""Restarts without `--peers`, as real `pnode start` processes on 127.0.0.1 (issue 29).

A node keeps the peers it reached in its peer book (``D/peers``) and dials
them again on start; a node redials a peer it lost; a producer that loses
its last peer says so once. Every process is killed on teardown.
"""

from __future__ import annotations

from tests.node.prockit import live_status, node_addr, read, stop, wait_for


def _same_tip(pnode, *dirs, least: int = 0):
    tips = {(s["height"], s["tip"]) for s in (live_status(pnode, d) for d in dirs)}
    return len(tips) == 1 and next(iter(tips))[0] >= least and next(iter(tips))


def _peer_id(addr: str) -> str:
    return addr.rsplit("/p2p/", 1)[1]


def test_restarts_without_peers_reconnect_both_ways(tmp_path, pnode, spawn):
    a, b = tmp_path / "A", tmp_path / "B"
    assert pnode("init", "--no-job", "--data-dir", str(a), "--chain-id", "t-book",
                 "--slot-ms", "50").code == 0
    assert pnode("init", "--data-dir", str(b), "--genesis", str(a / "genesis.json")).code == 0
    proc_a, out_a, err_a = spawn("a1", "--no-serve", "--data-dir", str(a),
                                 "--block-interval-ms", "200")
    addr_a = node_addr(a, proc_a)
    proc_b, _, err_b = spawn("b1", "--no-serve", "--data-dir", str(b), "--peers", addr_a)
    addr_b = node_addr(b, proc_b)
    wait_for(lambda: _same_tip(pnode, a, b, least=3), "A and B on one tip", limit=20)
    wait_for(lambda: live_status(pnode, a)["peers"] == [_peer_id(addr_b)], "A to list B")
    wait_for(lambda: live_status(pnode, a)["height"] >= 12, "A to produce with B connected")

    # B goes: A, a producer that had a peer, says once that it produces alone.
    assert stop(proc_b) == 0, read(err_b)
    wait_for(lambda: live_status(pnode, a)["peers"] == [], "A to see B gone")
    wait_for(lambda: "producing alone: no peer connected since" in read(out_a),
             "A's producing-alone line", limit=20)
    down = live_status(pnode, a)["height"]
    wait_for(lambda: live_status(pnode, a)["height"] >= down + 3, "A to go on producing")
    assert read(out_a).count("producing alone") == 1

    # B again, without --peers: its peer book has A.
    proc_b, out_b, err_b = spawn("b2", "--no-serve", "--data-dir", str(b))
    node_addr(b, proc_b)
    wait_for(lambda: live_status(pnode, b)["peers"] == [_peer_id(addr_a)],
             "B to reconnect to A from its peer book", limit=20)
    wait_for(lambda: _same_tip(pnode, a, b, least=down + 3), "B to catch up with A", limit=20)
    wait_for(lambda: "peers are back" in read(out_a), "A's peers-are-back line")

    # A goes and comes back on its port without --peers: B redials it.
    assert stop(proc_a) == 0, read(err_a)
    wait_for(lambda: live_status(pnode, b)["peers"] == [], "B to see A gone")
    listen = addr_a.rsplit("/p2p/", 1)[0]
    proc_a, out_a, err_a = spawn("a2", "--no-serve", "--data-dir", str(a), "--listen", listen,
                                 "--block-interval-ms", "200")
    assert node_addr(a, proc_a) == addr_a
    wait_for(lambda: live_status(pnode, b)["peers"] == [_peer_id(addr_a)],
             "B to redial A", limit=40)
    height = live_status(pnode, a)["height"]
    wait_for(lambda: _same_tip(pnode, a, b, least=height + 2), "A and B on one tip again",
             limit=20)
    assert "reconnected to peer " + addr_a in read(out_b)
    for proc, err in ((proc_b, err_b), (proc_a, err_a)):
        assert stop(proc) == 0, read(err)
