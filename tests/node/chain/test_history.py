"""`node.chain.history`: an account's rows add up to its balance, tabs included.

Real blocks of a test chain (tests/ledger/chainkit.py): a tab claimed in
part, closed lane by lane, and one left to expire. The reference is the
chain's own state: for every account, the sum of its rows' deltas is its
balance (no mining rewards on this chain).
"""

from __future__ import annotations

from ledger.state import JOB, PENDING, TAB
from ledger.tab import MIN_TAB
from ledger.types import COIN, tx_hash
from tests.ledger.chainkit import balance, grow, job, make_net, new_db, receipts_due
from tests.ledger.test_tab import claim, open_tab, voucher
from node.chain.history import history_rows


def settled(db, account: bytes) -> int:
    return sum(r["amount_units"] for r in history_rows(db, account) if r["height"] is not None)


def test_claims_refunds_and_an_expiry_add_up_to_every_balance():
    net = make_net()
    db = new_db(net)
    client, other = net.users
    lanes = [(net.nodes[0].public, 5 * COIN), (net.nodes[1].public, 3 * COIN)]
    t = open_tab(db, client, lanes)
    grow(db, net, 1, [t])
    grow(db, net, 1, [claim(net.nodes[1], voucher(client, t, [2 * COIN, 1 * COIN]))])
    v2 = voucher(client, t, [3 * COIN, 7 * COIN])  # lane 1 is paid up to its cap only
    grow(db, net, 1, [claim(net.nodes[0], v2, close=True)])
    short = open_tab(db, client, [(net.nodes[2].public, 4 * COIN)], life=MIN_TAB, nonce=1)
    grow(db, net, 1, [short])
    grow(db, net, 1, [claim(net.nodes[2], voucher(client, short, [COIN]))])
    expiry = db.state.get(TAB + tx_hash(short)).expiry_height
    grow(db, net, expiry - db.tip.height + 1)  # the prelude after expiry refunds 3 coins

    rows = history_rows(db, client.public)
    assert [r["type"] for r in rows] == ["Allocation", "OpenTab", "Claim", "Claim", "OpenTab",
                                         "Claim", "TabExpired"]
    assert [r["amount_units"] for r in rows] == [100 * COIN, -8 * COIN, 0, 2 * COIN, -4 * COIN, 0,
                                          3 * COIN]
    assert rows[-1]["height"] == expiry + 1 and rows[-1]["txid"] == tx_hash(short).hex()
    for account in [*(k.public for k in net.users), *(w.public for w in net.wallets)]:
        assert settled(db, account) == balance(db, account)
    # Lane 1's account: 1 coin at the first claim, 2 more (its cap) at the second.
    server1 = [r for r in history_rows(db, net.wallets[1].public) if r["type"] == "Claim"]
    assert [r["amount_units"] for r in server1] == [COIN, 2 * COIN]
    assert history_rows(db, other.public) == [r for r in history_rows(db, other.public)
                                              if r["type"] == "Allocation"]


def test_a_claim_that_pays_no_server_is_a_refund_to_the_client():
    net = make_net()
    db = new_db(net)
    client = net.users[0]
    lanes = [(net.nodes[0].public, 5 * COIN), (net.nodes[1].public, 3 * COIN)]
    unused, used = open_tab(db, client, lanes), open_tab(db, client, lanes, nonce=1)
    grow(db, net, 1, [unused, used])
    # The unused tab's lane 0 closed on an empty voucher: its 5 coins back, nothing paid.
    grow(db, net, 1, [claim(net.nodes[0], voucher(client, unused, [0, 0]), close=True),
                      claim(net.nodes[0], voucher(client, used, [COIN, 0]), close=True)])
    rows = [r for r in history_rows(db, client.public) if r["height"] == db.height]
    assert sorted((r["type"], r["amount_units"]) for r in rows) == [
        ("Claim", 4 * COIN), ("TabRefund", 5 * COIN)]  # the other paid a server 1 coin
    assert next(r for r in rows if r["type"] == "TabRefund")["txid"] == tx_hash(
        claim(net.nodes[0], voucher(client, unused, [0, 0]), close=True)).hex()
    # To the server both stay claims (its own, paying it nothing, then 1 coin).
    server = [r for r in history_rows(db, net.wallets[0].public) if r["height"] == db.height]
    assert [(r["type"], r["amount_units"]) for r in server] == [("Claim", 0), ("Claim", COIN)]
    assert settled(db, client.public) == balance(db, client.public)


def test_a_queued_claim_is_pending_and_changes_nothing_settled():
    net = make_net()
    db = new_db(net)
    client = net.users[0]
    t = open_tab(db, client, [(net.nodes[0].public, 5 * COIN)])
    grow(db, net, 1, [t])
    before = settled(db, client.public)
    db.add_to_mempool(claim(net.nodes[0], voucher(client, t, [2 * COIN]), close=True))
    queued = [r for r in history_rows(db, client.public) if r["height"] is None]
    assert [(r["type"], r["amount_units"]) for r in queued] == [("Claim", None)]
    assert settled(db, client.public) == before == balance(db, client.public)


def test_rewards_deposits_and_refunds_are_rows_and_every_balance_adds_up():
    net = make_net()
    db = new_db(net)
    user = net.users[0]
    minted = job(net.authority, steps=2)
    paid = job(user, steps=2, deposit=2 * 2 * 3 * COIN + 5 * COIN)
    grow(db, net, 1, [minted, paid])
    for _ in range(30):  # both jobs run, one after the other; their rewards and refund settle
        grow(db, net, 1, receipts_due(db, net))
    assert not db.state.ids(PENDING) and db.state.get(JOB + tx_hash(paid)).escrow == 0
    for account in [*(k.public for k in net.users), *(w.public for w in net.wallets)]:
        rows = history_rows(db, account)
        assert settled(db, account) == balance(db, account)
        assert "Other" not in {r["type"] for r in rows}  # every change explained
    mine = history_rows(db, user.public)
    assert [(r["type"], r["amount_units"]) for r in mine if r["type"] in ("Job", "JobRefund")] == [
        ("Job", -17 * COIN), ("JobRefund", 13 * COIN)]  # 4 units paid, the rest back
    rewards = [r for w in net.wallets for r in history_rows(db, w.public) if r["type"] == "Reward"]
    assert len(rewards) == 8 and all(r["amount_units"] == COIN for r in rewards)
    assert sorted(r["counterparty"] for r in rewards).count("minted") == 4
    assert {r["counterparty"] for r in rewards} == {"minted", user.public.hex()}
    assert all(r["confirmations"] == db.height - r["height"] + 1 for r in rewards)
