"""`pnode` from the command line: init, produce, show, status, proof, verify."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch

from ledger import schema
from ledger.chaindb import ChainDB
from ledger.codec import decode
from ledger.store import LevelDBStore
from ledger.types import Receipt, tx_hash
from node.datadir import DataDir, read_seed_file, write_genesis_file
from node.net.identity import PeerIdentity
from tests.ledger.chainkit import grow, make_net, receipts_due


@pytest.fixture
def node_dir(tmp_path, pnode):
    d = tmp_path / "n1"
    r = pnode("init", "--no-job", "--data-dir", str(d), "--chain-id", "t1", "--slot-ms", "50", "--json")
    assert r.code == 0, r.err
    return d, r.json()


def test_init_writes_keys_genesis_and_chain(node_dir):
    d, info = node_dir
    for name in ("node.key", "peer.key", "wallet.json"):
        assert stat.S_IMODE(os.stat(d / name).st_mode) == 0o600
    assert info["chain_id"] == "t1" and len(info["address"]) == 64
    genesis = json.loads((d / "genesis.json").read_text())
    assert genesis["chain_id"] == "t1"
    assert genesis["registrations"][0]["node_key"] == info["node_key"]
    # The peer id as libp2p, `pnode status` and the registry print it (12D3KooW..).
    peer_id = PeerIdentity.from_seed(read_seed_file(d / "peer.key").seed()).peer_id
    assert info["peer_id"] == str(peer_id) and info["peer_id"].startswith("12D3KooW")


def test_join_with_a_genesis_file_gives_the_same_chain(node_dir, pnode, tmp_path):
    d, info = node_dir
    r = pnode("init", "--data-dir", str(tmp_path / "n2"), "--genesis", str(d / "genesis.json"),
              "--json")
    assert r.code == 0, r.err
    assert r.json()["genesis_hash"] == info["genesis_hash"] and r.json()["joined"]


def test_init_twice_is_refused(node_dir, pnode):
    d, _ = node_dir
    r = pnode("init", "--data-dir", str(d))
    assert r.code == 2 and "already initialised" in r.err


def test_produce_show_status_and_verify(node_dir, pnode):
    d, info = node_dir
    r = pnode("produce", "--data-dir", str(d), "--blocks", "3", "--json")
    assert r.code == 0, r.err
    assert [b["height"] for b in r.json()["blocks"]] == [1, 2, 3]
    show = pnode("ledger", "show", "2", "--data-dir", str(d), "--json").json()
    assert show["header"]["height"] == 2 and show["hash"] == r.json()["blocks"][1]["hash"]
    status = pnode("status", "--data-dir", str(d), "--json").json()
    assert status["height"] == 3 and status["registered"] and status["address"] == info["address"]
    ok = pnode("verify", "chain", "--data-dir", str(d), "--json")
    assert ok.code == 0 and ok.json()["ok"]


def _flip_byte(d, height: int, offset: int) -> None:
    store = LevelDBStore(d / "chain")
    try:
        h = store.get(schema.height_key(height))
        raw = bytearray(store.get(schema.block_key(h)))
        raw[offset] ^= 1
        store.write([(schema.block_key(h), bytes(raw))])
    finally:
        store.close()


def test_verify_chain_exits_1_on_a_tampered_block(node_dir, pnode):
    d, _ = node_dir
    pnode("produce", "--data-dir", str(d), "--blocks", "3")
    _flip_byte(d, 2, -2)  # last byte of block 2's header signature (then an empty tx list)
    r = pnode("verify", "chain", "--data-dir", str(d), "--json")
    assert r.code == 1
    assert r.json()["ok"] is False and "height 2" in r.json()["reason"]


def test_verify_block_checks_up_to_that_height(node_dir, pnode):
    d, _ = node_dir
    pnode("produce", "--data-dir", str(d), "--blocks", "3")
    _flip_byte(d, 3, -2)
    assert pnode("verify", "block", "2", "--data-dir", str(d)).code == 0
    r = pnode("verify", "block", "3", "--data-dir", str(d), "--json")
    assert r.code == 1 and "height 3" in r.json()["reason"]
    assert pnode("verify", "block", "9", "--data-dir", str(d)).code == 2


def test_verify_chain_exits_1_on_a_damaged_tip(node_dir, pnode):
    d, _ = node_dir
    pnode("produce", "--data-dir", str(d), "--blocks", "2")
    _flip_byte(d, 2, -1)  # the tip no longer decodes
    r = pnode("verify", "chain", "--data-dir", str(d), "--json")
    assert r.code == 1 and "damaged" in r.json()["reason"]
    assert pnode("status", "--data-dir", str(d)).code == 2  # other commands refuse it


@pytest.fixture
def chain_with_receipts(tmp_path):
    """A data dir whose chain holds receipts (mining comes with a later issue)."""
    net = make_net(with_job=True)
    dd = DataDir(tmp_path / "r")
    dd.path.mkdir()
    write_genesis_file(dd.genesis_file, net.genesis)
    db = ChainDB.create(LevelDBStore(dd.chain_dir), net.genesis)
    for _ in range(3):
        grow(db, net, 1, receipts_due(db, net))
    receipt_ids = [tx_hash(decode(leaf, Receipt)).hex() for leaf in db.log_leaves()]
    db.store.close()
    return dd, receipt_ids


def test_proof_round_trip_through_files(chain_with_receipts, pnode, tmp_path):
    dd, receipt_ids = chain_with_receipts
    r = pnode("proof", receipt_ids[2], "--data-dir", str(dd.path))
    assert r.code == 0, r.err
    proof_file = tmp_path / "receipt.proof"
    proof_file.write_text(r.out)
    ok = pnode("verify", "proof", str(proof_file), "--data-dir", str(dd.path), "--json")
    assert ok.code == 0 and ok.json() == {"ok": True, "kind": "ReceiptProof", "height": 3,
                                          "index": 2}
    doc = json.loads(r.out)
    doc["receipt"]["output_hash"] = "11" * 32
    proof_file.write_text(json.dumps(doc))
    bad = pnode("verify", "proof", str(proof_file))
    assert bad.code == 1 and "FAIL" in bad.out


def test_proof_of_unknown_receipt_is_a_clear_error(chain_with_receipts, pnode):
    dd, _ = chain_with_receipts
    r = pnode("proof", "ab" * 32, "--data-dir", str(dd.path))
    assert r.code == 2 and "neither in this chain's log nor in a main-chain block" in r.err


def test_proof_takes_a_unique_prefix_as_job_commands_do(chain_with_receipts, pnode):
    dd, receipt_ids = chain_with_receipts
    whole = pnode("proof", receipt_ids[1], "--data-dir", str(dd.path))
    assert whole.code == 0, whole.err
    short = pnode("proof", receipt_ids[1][:8].upper(), "--data-dir", str(dd.path))
    assert short.code == 0, short.err
    assert short.out == whole.out
    r = pnode("proof", "", "--data-dir", str(dd.path))  # every id starts so: not one
    assert r.code == 2 and "is not a transaction id (hex; a prefix will do)" in r.err
    for bad, says in (("xyz", "is not a transaction id"), ("ab" * 33, "is not a transaction id")):
        r = pnode("proof", bad, "--data-dir", str(dd.path))
        assert r.code == 2 and says in r.err and "Traceback" not in r.err
    # A prefix of none says so, as `pnode job` says of a job.
    none = next(p for p in (f"{i:04x}" for i in range(1 << 16))
                if not any(r.startswith(p) for r in receipt_ids))
    r = pnode("proof", none, "--data-dir", str(dd.path))
    assert r.code == 2 and f"no transaction on the chain with an id starting {none}" in r.err


def test_a_transactions_proof_round_trips_through_files(tmp_path, pnode, pwallet):
    d = str(tmp_path / "t")
    assert pnode("init", "--no-job", "--data-dir", d, "--chain-id", "t-txproof").code == 0
    bob = pwallet("create", "--data-dir", d, "--name", "bob", "--json").json()["address"]
    txid = pwallet("send", bob, "2.5", "--data-dir", d, "--json").json()["txid"]
    assert pnode("produce", "--data-dir", d, "--blocks", "2").code == 0
    r = pnode("proof", txid, "--data-dir", d)
    assert r.code == 0, r.err
    proof_file = tmp_path / "tx.proof"
    proof_file.write_text(r.out)
    ok = pnode("verify", "proof", str(proof_file), "--data-dir", d, "--json")
    assert ok.code == 0 and ok.json() == {"ok": True, "kind": "TxProof", "height": 1, "index": 0}
    doc = json.loads(r.out)
    doc["tx"]["amount"] = 25_000_000  # ten times what was sent
    proof_file.write_text(json.dumps(doc))
    bad = pnode("verify", "proof", str(proof_file))
    assert bad.code == 1 and "FAIL" in bad.out


@pytest.mark.parametrize("args, message", [
    (["verify", "chain", "--data-dir", "/nonexistent/pnode"], "does not exist"),
    (["ledger", "show", "-3", "--data-dir", "/tmp"], "-3"),
    (["init", "--data-dir", "{tmp}/x", "--layers", "5:2"], "START < END"),
    (["init", "--data-dir", "{tmp}/x", "--premine", "-1"], "positive"),
    (["init", "--data-dir", "{tmp}/x", "--genesis", "{tmp}/garbage.json"], "not valid"),
    (["verify", "proof", "{tmp}/garbage.json"], "cannot read proof"),
    (["nonsense"], "No such command"),
    (["start", "--data-dir", "{tmp}/x", "--no-serve", "--no-mine", "--gpu", "0"],
     "nothing would use the GPU"),
])
def test_bad_input_is_one_line_and_exit_2(pnode, tmp_path, args, message):
    (tmp_path / "garbage.json").write_text("{not json")
    r = pnode(*[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert r.code == 2
    assert message in r.err and len(r.err.strip().splitlines()) == 1
    assert "Traceback" not in r.err


@pytest.mark.parametrize("command", [
    ["init"], ["produce"], ["train"], ["status"], ["proof"], ["ledger", "show"],
    ["verify", "chain"], ["verify", "block"],
    ["verify", "proof"], ["verify", "cert"], ["verify", "pol"], ["pol", "export"],
])
def test_every_command_has_help_with_examples(pnode, command):
    r = pnode(*command, "--help")
    assert r.code == 0 and "Example" in r.out


def test_plural_and_coins_say_one_in_the_singular():
    from node.cli.common import coins, plural

    assert [plural(n, "server") for n in (0, 1, 2)] == ["0 servers", "1 server", "2 servers"]
    assert plural(1, "body", "bodies") == "1 body" and plural(3, "body", "bodies") == "3 bodies"
    assert [coins(u) for u in (1_000_000, 2_500_000, 500_000)] == [
        "1 coin", "2.5 coins", "0.5 coins"]
    assert coins("1") == "1 coin" and coins("1.25") == "1.25 coins"
    assert plural(1.0, "coin") == "1.0 coin" and plural(2.5, "coin") == "2.5 coins"


def test_status_text_lists_peers_and_the_swarm_a_line_each():
    from node.cli.pnode import _status_text

    info = {"height": 7, "balance": 2_500_000, "peers": ["12D3KooWA", "12D3KooWB"],
            "serving": [0, 10],
            "swarm": [{"peer_id": "12D3KooWB", "layers": [10, 20], "throughput": 98.54,
                       "load": 1, "price": 1000}],
            "running": True, "jailed_until": None, "misbehaving": {},
            "mining": {"job": "5e3c", "loss": 1.5},
            "payments": {"owed": 1_500_000, "claim_ids": [], "settled": 2, "lost": 1_000_000}}
    text = _status_text(info)
    lines = text.splitlines()
    assert lines[0].split() == ["height", "7"] and lines[1].split() == ["balance", "2.5", "coins"]
    assert not any(s in text for s in ("None", "{", "[", "True", "range("))  # no Python reprs
    assert "mining           job 5e3c, loss 1.5" in lines and "serving          0:10" in lines
    assert ("payments         owed 1.5 coins, claim_ids none, settled 2, lost 1 coin"
            in lines)  # settled counts lanes; lost is base units
    assert "peers            2 connected" in lines and "  12D3KooWA" in lines
    assert "swarm            1 server announced" in lines  # not "1 servers"
    assert lines[-1].split() == ["layers", "10:20", "98.5", "tok/s", "load", "1", "price",
                                 "1000/position/layer", "12D3KooWB"]


def test_bad_job_file_and_a_used_devnet_dir_are_clear_errors(pnode, tmp_path):
    bad = tmp_path / "job.json"
    bad.write_text('{"model": {"dim": 1}}')
    assert pnode("init", "--no-job", "--data-dir", str(tmp_path / "n"), "--chain-id", "b").code == 0
    r = pnode("start", "--data-dir", str(tmp_path / "n"), "--no-serve", "--job", str(bad))
    assert r.code == 2 and "job.json" in r.err and "dim 1 is not a multiple" in r.err
    used = tmp_path / "dn"
    used.mkdir()
    (used / "x").write_text("")
    r = pnode("devnet", "--data-dir", str(used), "--steps", "1")
    assert r.code == 2 and "is not empty" in r.err and (used / "x").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error of a machine without CUDA")
def test_mining_on_a_gpu_that_is_not_there_is_a_clear_error(pnode, tmp_path):
    assert pnode("init", "--no-job", "--data-dir", str(tmp_path / "x"), "--chain-id", "g").code == 0
    r = pnode("start", "--data-dir", str(tmp_path / "x"), "--no-serve", "--gpu", "0")
    assert r.code == 2 and "no CUDA device" in r.err and "Traceback" not in r.err
    assert "drop --gpu" in r.err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error of a machine without CUDA")
def test_a_devnet_on_a_gpu_that_is_not_there_is_a_clear_error_and_creates_nothing(pnode,
                                                                                 tmp_path):
    r = pnode("devnet", "--data-dir", str(tmp_path / "dn"), "--steps", "1", "--gpu", "0")
    assert r.code == 2 and "no CUDA device" in r.err and "Traceback" not in r.err
    assert not (tmp_path / "dn").exists()
