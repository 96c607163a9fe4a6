"""`pnode start` on hosts of their own: each node in its own network namespace, its own IP.

Three real node processes (A producing, B and C told only of A's address on the
bridge) reach one tip; a transfer sent on C lands in a block all three hold; C's
cable is cut and plugged back and it catches up. `pnode status` / `pwallet` talk to
each node over its control socket, a file path, which works across namespaces. A node
that reaches A only through the link shaper (100 ms RTT, 100 Mbit/s) syncs A's chain.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ledger.types import COIN
from node.datadir import DataDir
from tests.node.netns.nskit import Host
from tests.node.prockit import live_status, read, stop, wait_for

PORT = 4411  # every host has its own address: the default port each
ENV = dict(os.environ, PYTHONUNBUFFERED="1", PNODE_PASSPHRASE="correct horse")


def _start(host: Host, d: Path, *args: str):
    """`pnode start` on ``host``, listening on its bridge address."""
    proc = host.python("-m", "node.cli", "start", "--log-level", "debug", "--no-serve",
                       "--listen", f"/ip4/{host.ip}/tcp/{PORT}", "--data-dir", str(d), *args,
                       out=d.parent / f"{d.name}.out", err=d.parent / f"{d.name}.err", env=ENV)

    def ready():
        assert proc.poll() is None, f"node {d.name} exited: {read(d.parent / f'{d.name}.err')}"
        return read(d / "node.addr").strip()
    addr = wait_for(ready, f"{d.name}'s node.addr", limit=30)
    assert addr.startswith(f"/ip4/{host.ip}/tcp/{PORT}/p2p/"), addr
    return proc, addr


@pytest.fixture
def three(netns, tmp_path, pnode):
    """A (producing), B and C on their own hosts, B and C told of A; all running."""
    dirs = {n: tmp_path / n for n in "ABC"}
    r = pnode("init", "--no-job", "--data-dir", str(dirs["A"]), "--chain-id", "t-hosts",
              "--slot-ms", "50")
    assert r.code == 0, r.err
    for n in "BC":
        r = pnode("init", "--data-dir", str(dirs[n]), "--genesis", str(dirs["A"] / "genesis.json"))
        assert r.code == 0, r.err
    hosts = {n: netns.add(n.lower()) for n in "ABC"}
    procs = {}
    procs["A"], addr_a = _start(hosts["A"], dirs["A"], "--block-interval-ms", "200")
    for n in "BC":
        procs[n], _ = _start(hosts[n], dirs[n], "--peers", addr_a)
    return dirs, hosts, procs


def _same_tip(pnode, dirs, least: int = 0):
    tips = {(s["height"], s["tip"]) for s in (live_status(pnode, d) for d in dirs)}
    return len(tips) == 1 and next(iter(tips))[0] >= least and next(iter(tips))


def _stop_all(dirs, procs):
    for n in "CBA":
        assert stop(procs[n]) == 0, read(dirs[n].parent / f"{n}.err")


def test_three_hosts_reach_one_tip_and_a_transfer_sent_on_c_is_in_all(three, pnode, pwallet):
    dirs, hosts, procs = three
    a, b, c = dirs["A"], dirs["B"], dirs["C"]
    wait_for(lambda: _same_tip(pnode, (a, b, c), least=3), "A, B and C on one tip", limit=30)
    # Each knows the others by their bridge addresses, not loopback.
    peers_a = live_status(pnode, a)["peers"]
    for n in "BC":
        assert read(dirs[n] / "node.addr").strip().rsplit("/p2p/", 1)[1] in peers_a
    # C holds a copy of A's funded key; the transfer goes in through C's node.
    (c / "wallets").mkdir(exist_ok=True)
    shutil.copy(DataDir(a).wallet_path(None), DataDir(c).wallet_path("alice"))
    bob = pwallet("create", "--data-dir", str(c), "--name", "bob", "--json")
    assert bob.code == 0, bob.err
    bob = bob.json()["address"]
    sent = pwallet("send", bob, "1.5", "--data-dir", str(c), "--wallet", "alice", "--wait",
                   "--timeout", "30", "--json")
    assert sent.code == 0, sent.err
    landed = sent.json()["height"]
    height, tip = wait_for(lambda: _same_tip(pnode, (a, b, c), least=landed),
                           "the block with the transfer on all three", limit=30)
    for d in (a, b, c):
        r = pwallet("balance", bob, "--data-dir", str(d), "--json").json()
        assert r["running"] is True and r["balance_units"] == COIN + COIN // 2, (d, r)
    _stop_all(dirs, procs)
    chains = [DataDir(d).open_chain() for d in (a, b, c)]
    try:
        assert len({db.hash_at(landed) for db in chains}) == 1
    finally:
        for db in chains:
            db.store.close()


def test_c_cut_off_stalls_and_catches_up_when_its_cable_is_back(three, pnode):
    dirs, hosts, procs = three
    a, b, c = dirs["A"], dirs["B"], dirs["C"]
    base, _ = wait_for(lambda: _same_tip(pnode, (a, b, c), least=3), "one tip", limit=30)
    hosts["C"].link(False)
    cut = live_status(pnode, c)["height"]
    wait_for(lambda: live_status(pnode, a)["height"] >= cut + 8, "A to go on without C",
             limit=30)
    wait_for(lambda: _same_tip(pnode, (a, b)), "B to follow A", limit=30)
    assert live_status(pnode, c)["height"] <= cut + 1  # C hears nothing (one block in flight)
    assert procs["C"].poll() is None
    hosts["C"].link(True)
    height, _ = wait_for(lambda: _same_tip(pnode, (a, b, c), least=cut + 8),
                         "C to catch up once its cable is back", limit=45)
    assert height >= base
    _stop_all(dirs, procs)


def test_a_node_behind_a_shaped_link_syncs_the_chain(netns, tmp_path, pnode):
    """C reaches A only through the shaper (50 ms each way, 100 Mbit/s): it still syncs."""
    a, c = tmp_path / "A", tmp_path / "C"
    assert pnode("init", "--no-job", "--data-dir", str(a), "--chain-id", "t-shaped",
                 "--slot-ms", "50").code == 0
    assert pnode("produce", "--data-dir", str(a), "--blocks", "20").code == 0
    assert pnode("init", "--data-dir", str(c), "--genesis", str(a / "genesis.json")).code == 0
    host_a, relay, host_c = netns.add("a"), netns.add("r"), netns.add("c")
    # A holds still: a producing A runs ahead of a follower 100 ms away (it keeps up by
    # syncing a few blocks at a time), and one tip would be a matter of sampling luck.
    proc_a, addr_a = _start(host_a, a, "--no-produce")
    relay.python("-m", "tests.node.netns.shaper", "--listen", f"{relay.ip}:7001",
                 "--target", f"{host_a.ip}:{PORT}", "--delay-ms", "50", "--rate", "12500000",
                 out=tmp_path / "relay.out", err=tmp_path / "relay.err", env=ENV)
    peer_id = addr_a.rsplit("/p2p/", 1)[1]
    proc_c, _ = _start(host_c, c, "--peers", f"/ip4/{relay.ip}/tcp/7001/p2p/{peer_id}")
    wait_for(lambda: peer_id in live_status(pnode, c)["peers"], "C to hold A as a peer", limit=30)
    height, _ = wait_for(lambda: _same_tip(pnode, (a, c)), "C on A's tip through the shaper",
                         limit=40)
    assert height == 20 and "synced 20 blocks" in read(tmp_path / "C.out")
    assert stop(proc_c) == 0, read(tmp_path / "C.err")
    assert stop(proc_a) == 0, read(tmp_path / "A.err")
