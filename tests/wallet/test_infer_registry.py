"""`pwallet infer` routes only through servers registered on the chain of --data-dir.

The library side (real hosts, a stranger claiming a huge throughput):
tests/wallet/client/test_remote_registry.py.
"""

from __future__ import annotations

from tests.node.prockit import live_status, node_addr, spawn, wait_for  # noqa: F401 (fixture)
from tests.wallet.test_infer import DEAD_PEER

PROMPT = "The capital of France is"


def one_line_error(r, *needles: str) -> None:
    assert r.code == 2, (r.out, r.err)
    assert len(r.err.strip().splitlines()) == 1, r.err
    for needle in needles:
        assert needle in r.err, r.err


def test_without_a_chain_the_client_asks_the_peer_for_the_registry(pwallet, tmp_path):
    r = pwallet("infer", PROMPT, "--peers", DEAD_PEER, "--data-dir", str(tmp_path / "none"))
    one_line_error(r, "no peer reachable")  # it dialed the peer for the registry


def test_allow_unregistered_is_for_the_swarm_only(pwallet, tmp_path):
    r = pwallet("infer", PROMPT, "--local", "--allow-unregistered", "--data-dir", str(tmp_path))
    one_line_error(r, "--local runs everything here", "--allow-unregistered")


def test_allow_unregistered_needs_no_chain(pwallet, tmp_path):
    """Past the chain check, the dead peer is what fails."""
    r = pwallet("infer", PROMPT, "--peers", DEAD_PEER, "--allow-unregistered",
                "--data-dir", str(tmp_path / "none"))
    one_line_error(r, "no peer reachable")


def test_a_stopped_nodes_store_gives_the_registry(pwallet, pnode, tmp_path):
    d = tmp_path / "n"
    assert pnode("init", "--no-job", "--data-dir", str(d), "--chain-id", "t-infer-reg").code == 0
    r = pwallet("infer", PROMPT, "--peers", DEAD_PEER, "--data-dir", str(d))
    one_line_error(r, "no peer reachable")  # the registry was read; then the dial failed


def test_a_registered_server_serves_and_another_chains_client_refuses_it(
        pwallet, pnode, tmp_path, spawn):  # noqa: F811
    """A `pnode start` registered at its genesis serves the client of its own chain.

    A client following another chain (where that server is not registered)
    gets the clear error, and gets through with --allow-unregistered.
    """
    d, other = tmp_path / "n", tmp_path / "other"
    assert pnode("init", "--no-job", "--data-dir", str(d), "--chain-id", "t-infer-reg").code == 0
    assert pnode("init", "--no-job", "--data-dir", str(other), "--chain-id", "t-elsewhere").code == 0
    proc, _, _ = spawn("n", "--data-dir", str(d), "--layers", "0:30", "--no-produce")
    addr = node_addr(d, proc, 90)
    wait_for(lambda: live_status(pnode, d).get("serving"), "the server to serve", limit=60)
    args = ("infer", PROMPT, "--peers", addr, "--raw", "--greedy", "--max-tokens", "4", "--json")
    r = pwallet(*args, "--data-dir", str(d))  # the running node answers `registry`
    assert r.code == 0, r.err
    assert [h["peer_id"] for h in r.json()["route"]] == [addr.rsplit("/p2p/", 1)[1]]
    r = pwallet(*args, "--data-dir", str(other))
    one_line_error(r, "layer 0 is served only by servers not registered on the chain; "
                      "pass --allow-unregistered for a private swarm")
    r = pwallet(*args, "--data-dir", str(other), "--allow-unregistered")
    assert r.code == 0, r.err


def test_paid_inference_from_the_cli(pwallet, pnode, tmp_path, spawn):  # noqa: F811
    """A server asking 5 base units per position per layer: a free-only client is told
    the cheapest ask, a broke wallet stops before any session (exit 2), a funded one
    pays and the server's claim lands."""
    d = tmp_path / "n"
    assert pnode("init", "--no-job", "--data-dir", str(d), "--chain-id", "t-paid", "--slot-ms", "200").code == 0
    bob = pwallet("create", "--data-dir", str(d), "--name", "bob", "--json").json()["address"]
    assert pwallet("create", "--data-dir", str(d), "--name", "broke").code == 0
    proc, _, _ = spawn("n", "--data-dir", str(d), "--layers", "0:30", "--price", "5")
    addr = node_addr(d, proc, 90)
    wait_for(lambda: live_status(pnode, d).get("serving"), "the server to serve", limit=60)
    assert pwallet("send", bob, "3", "--data-dir", str(d)).code == 0
    wait_for(lambda: pwallet("balance", bob, "--data-dir", str(d), "--json").json()["balance_units"]
             == 3_000_000, "bob's coins", limit=30)
    args = ("infer", PROMPT, "--peers", addr, "--raw", "--greedy", "--max-tokens", "4",
            "--data-dir", str(d))
    one_line_error(pwallet(*args), "asks more than free servers only (--max-price 0)",
                   "the cheapest asks 5", "--max-price 5 would fit")
    r = pwallet(*args, "--wallet", "broke", "--max-price", "10")
    one_line_error(r, "insufficient funds: need 0.00", "positions x 30 layers x bid 5 base "
                      "units, x2 margin for failover), balance 0")
    assert live_status(pnode, d)["served_tokens"] == 0  # no session opened
    r = pwallet(*args, "--wallet", "bob", "--max-price", "10", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    [hop] = doc["cost"]
    assert (hop["layers"], hop["bid"]) == (30, 5) and hop["positions"] >= 5
    assert hop["amount_units"] == hop["server_counted_units"] == hop["positions"] * 30 * 5
    assert doc["claims"] == [hop["claim"]] and len(doc["tabs"]) == 1
    wait_for(lambda: pwallet("balance", bob, "--data-dir", str(d), "--json").json()["balance_units"]
             == 3_000_000 - hop["amount_units"], "the claim settled and the rest refunded", limit=30)
    # A wallet without a node (its own directory): the balance through the peer; the
    # library side of --peers (submit, registry, paying) is tests/wallet/test_light.py.
    light = str(tmp_path / "light")
    assert pwallet("create", "--data-dir", light, "--name", "carol").code == 0
    r = pwallet("balance", bob, "--data-dir", light, "--peers", addr, "--json")
    assert r.code == 0 and r.json()["balance_units"] == 3_000_000 - hop["amount_units"], r.err
    proc.terminate()  # the store is the node's while it runs
    proc.wait(timeout=30)
    rows = pwallet("history", "--data-dir", str(d), "--wallet", "bob", "--json").json()["history"]
    kinds = [r["type"] for r in rows]
    assert "OpenTab" in kinds and "Claim" in kinds  # the tab, and the server's claim on it
    tab_row = next(r for r in rows if r["type"] == "OpenTab")
    assert tab_row["amount_units"] < 0 and tab_row["txid"] == doc["tabs"][0]["tab"]
    # The closing claim's row is the refund: Bob's rows add up to his balance.
    assert sum(r["amount_units"] for r in rows) == 3_000_000 - hop["amount_units"], rows
