"""A serving `pnode start` registers itself once its wallet can lock the bond (real processes)."""

from __future__ import annotations

from node.cli.common import registry_info
from node.datadir import DataDir
from node.datadir import read_public_key
from tests.node.prockit import live_status, node_addr, read, stop, wait_for


def test_a_serving_node_registers_itself_once_funded(tmp_path, pnode, pwallet, spawn):
    a, b = tmp_path / "A", tmp_path / "B"
    assert pnode("init", "--no-job", "--data-dir", str(a), "--chain-id", "t-reg", "--slot-ms", "50").code == 0
    assert pnode("init", "--data-dir", str(b), "--genesis", str(a / "genesis.json")).code == 0
    proc_a, _, err_a = spawn("a", "--no-serve", "--data-dir", str(a), "--block-interval-ms",
                             "100")
    addr_a = node_addr(a, proc_a)
    # PNODE_PASSPHRASE is set for spawned nodes: B can sign its registration.
    proc_b, out_b, err_b = spawn("b", "--data-dir", str(b), "--peers", addr_a, "--layers",
                                 "0:2", "--no-produce")
    node_addr(b, proc_b, 60)
    wait_for(lambda: "not registered: balance 0 is below the bond of 10" in read(out_b),
             "B to say why it is not registered", limit=30)
    assert live_status(pnode, b)["registered"] is False

    b_wallet = read_public_key(DataDir(b).wallet_file).hex()
    r = pwallet("send", b_wallet, "25", "--data-dir", str(a))
    assert r.code == 0, r.err
    wait_for(lambda: "registering: layers 0:2, bond 10" in read(out_b), "B to register",
             limit=30)
    wait_for(lambda: "registered on chain t-reg: layers 0:2, bond 10" in read(out_b),
             "B to see its registration in a block", limit=30)
    status = wait_for(lambda: (s := live_status(pnode, b))["registered"] and s,
                      "the registration to land in a block", limit=30)
    assert status["layers"] == [0, 2] and status["bond_units"] == 10 * 10**6
    assert status["balance_units"] == 15 * 10**6
    seen_by_a = wait_for(lambda: (s := live_status(pnode, a)) and s, "A's status")
    assert seen_by_a["height"] >= status["height"] - 2
    # The registry a client routes by (A's `registry` op) holds B's peer id
    # as B's libp2p host has it: the peer key B signed its binding with.
    live = wait_for(lambda: (r := registry_info(DataDir(a)))["height"] >= status["height"]
                    and r, "A to hold B's registration")
    nodes = {n["peer_id"]: n for n in live["nodes"]}
    assert live["running"] is True and len(nodes) == 2 and status["peer_id"] in nodes
    assert nodes[status["peer_id"]]["layers"] == [0, 2]
    assert nodes[status["peer_id"]]["account"] == b_wallet
    assert stop(proc_b) == 0, read(err_b)
    assert stop(proc_a) == 0, read(err_a)
    stored = registry_info(DataDir(a))  # no node runs: the same, from the store
    assert stored["running"] is False and stored["nodes"] == live["nodes"]


def test_a_locked_wallet_is_said_clearly_and_a_registered_node_says_so(tmp_path, pnode, spawn):
    a, b = tmp_path / "A", tmp_path / "B"
    assert pnode("init", "--no-job", "--data-dir", str(a), "--chain-id", "t-reg2").code == 0
    assert pnode("init", "--data-dir", str(b), "--genesis", str(a / "genesis.json")).code == 0
    locked = ("PNODE_PASSPHRASE",)
    proc_a, out_a, err_a = spawn("a", "--data-dir", str(a), "--layers", "0:2", "--no-produce",
                                 env_remove=locked)
    proc_b, out_b, err_b = spawn("b", "--data-dir", str(b), "--layers", "0:2", "--no-produce",
                                 env_remove=locked)
    node_addr(a, proc_a, 60)
    node_addr(b, proc_b, 60)
    # Genesis registered A already, for layers 0:30; it serves 0:2, and says why it
    # cannot register those.
    wait_for(lambda: "registered for layers 0:30 but serving 0:2: the wallet is locked"
             in read(out_a), "A's registration line", limit=30)
    wait_for(lambda: "not registered: the wallet is locked" in read(out_b),
             "B to say its wallet is locked", limit=30)
    assert stop(proc_a) == 0, read(err_a)
    assert stop(proc_b) == 0, read(err_b)


def test_a_node_restarted_with_other_layers_registers_the_served_span(tmp_path, pnode, spawn):
    a = tmp_path / "A"
    assert pnode("init", "--no-job", "--data-dir", str(a), "--chain-id", "t-reg3", "--slot-ms",
                 "50").code == 0  # genesis registers layers 0:30
    for span, old in (("0:2", "0:30"), ("2:4", "0:2")):
        proc, out, err = spawn(f"a{span}", "--data-dir", str(a), "--layers", span,
                               "--block-interval-ms", "100")
        node_addr(a, proc, 60)
        wait_for(lambda: f"re-registering: layers {span} (registered {old};" in read(out),
                 f"A to register {span}", limit=30)
        wait_for(lambda: f"registered on chain t-reg3: layers {span}, bond 10" in read(out),
                 f"A to see {span} in a block", limit=30)
        status = live_status(pnode, a)
        assert status["layers"] == [int(x) for x in span.split(":")]
        assert status["bond_units"] == 10 * 10**6  # re-registering bonds nothing more
        assert stop(proc) == 0, read(err)


def test_a_span_the_model_lacks_is_refused_at_start_or_replaced_by_the_served_one(
        tmp_path, pnode, spawn):
    a = tmp_path / "A"
    # init cannot know the model a node will serve (`pnode start --model`): it takes the span.
    assert pnode("init", "--no-job", "--data-dir", str(a), "--chain-id", "t-reg4", "--slot-ms",
                 "50", "--layers", "0:99").code == 0
    proc, out, err = spawn("asked", "--data-dir", str(a), "--layers", "0:99")
    assert proc.wait(timeout=120) == 2
    assert "the model has layers 0:30, asked for layers 0:99" in read(err)
    assert "registering" not in read(out) and "serving layers" not in read(out)
    # Placed by the node, it serves what the model has and registers that, not 0:99.
    proc, out, err = spawn("placed", "--data-dir", str(a), "--block-interval-ms", "100")
    node_addr(a, proc, 120)
    wait_for(lambda: "re-registering: layers 0:30 (registered 0:99;" in read(out),
             "A to register what it serves", limit=30)
    wait_for(lambda: "registered on chain t-reg4: layers 0:30, bond 10" in read(out),
             "A to see 0:30 in a block", limit=30)
    assert live_status(pnode, a)["layers"] == [0, 30]
    assert stop(proc) == 0, read(err)


def test_a_server_that_moves_registers_the_span_it_moved_to(tmp_path):
    """A node placing itself moves to other layers while it runs: its `Registrar`, given the
    served span as a function, registers the new span (no further bond) at the next tip."""
    import trio

    from ledger.state import NODE
    from ledger.store import LevelDBStore
    from node.chain import ChainService, Producer, Registrar, TxGossip
    from node.clock import now_ms
    from node.net import PeerIdentity
    from node.net.host import open_host
    from node.wire.sync import BLOCKS_TOPIC, TXS_TOPIC
    from tests.ledger.chainkit import make_net, new_db, peer_key
    from tests.node.netkit import eventually, run

    net = make_net(n_nodes=1, n_users=0, layers=[(0, 10)])
    wallet, node = net.wallets[0], net.nodes[0]
    served = [(0, 10)]

    async def main():
        db = new_db(net, LevelDBStore(tmp_path / "chain"))
        try:
            identity = PeerIdentity.from_seed(peer_key(node).seed())
            async with open_host(identity, gossip_topics=[BLOCKS_TOPIC, TXS_TOPIC]) as host, \
                    trio.open_nursery() as nursery:
                service = await nursery.start(ChainService(db, host, now_ms).run)
                txs = await nursery.start(TxGossip(service).run)
                await nursery.start(Producer(service, node, now_ms, interval_ms=100).run)
                lines: list[str] = []
                registrar = Registrar(service, txs, wallet, wallet.public, node, peer_key(node),
                                      lambda: served[0], report=lines.append)
                nursery.start_soon(registrar.run)

                def span():
                    record = db.state.get(NODE + node.public)
                    return (record.layer_start, record.layer_end)
                await eventually(lambda: registrar.registered, "the registration seen", 20)
                served[0] = (10, 20)  # the server moved
                await eventually(lambda: span() == (10, 20), "the moved span registered", 20)
                assert any("re-registering: layers 10:20 (registered 0:10" in x for x in lines)
                nursery.cancel_scope.cancel()
        finally:
            db.close()
    run(main, deadline=60)
