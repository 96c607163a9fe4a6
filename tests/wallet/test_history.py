"""`wallet.history`: an account's rows add up to its balance, tabs included.

Real blocks of a test chain (tests/ledger/chainkit.py): a tab claimed in
part, closed lane by lane, and one left to expire. The reference is the
chain's own state: for every account, the sum of its rows' deltas is its
balance (no mining rewards on this chain).
"""

from __future__ import annotations

from ledger.state import TAB
from ledger.tab import MIN_TAB
from ledger.types import COIN, tx_hash
from tests.ledger.chainkit import balance, grow, make_net, new_db
from tests.ledger.test_tab import claim, open_tab, voucher
from wallet.history import history_rows


def settled(db, account: bytes) -> int:
    return sum(r["delta"] for r in history_rows(db, account) if r["height"] is not None)


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
    assert [r["delta"] for r in rows] == [100 * COIN, -8 * COIN, 0, 2 * COIN, -4 * COIN, 0,
                                          3 * COIN]
    assert rows[-1]["height"] == expiry + 1 and rows[-1]["txid"] == tx_hash(short).hex()
    for account in [*(k.public for k in net.users), *(w.public for w in net.wallets)]:
        assert settled(db, account) == balance(db, account)
    # Lane 1's account: 1 coin at the first claim, 2 more (its cap) at the second.
    server1 = [r for r in history_rows(db, net.wallets[1].public) if r["type"] == "Claim"]
    assert [r["delta"] for r in server1] == [COIN, 2 * COIN]
    assert history_rows(db, other.public) == [r for r in history_rows(db, other.public)
                                              if r["type"] == "Allocation"]


def test_a_queued_claim_is_pending_and_changes_nothing_settled():
    net = make_net()
    db = new_db(net)
    client = net.users[0]
    t = open_tab(db, client, [(net.nodes[0].public, 5 * COIN)])
    grow(db, net, 1, [t])
    before = settled(db, client.public)
    db.add_to_mempool(claim(net.nodes[0], voucher(client, t, [2 * COIN]), close=True))
    queued = [r for r in history_rows(db, client.public) if r["height"] is None]
    assert [(r["type"], r["delta"]) for r in queued] == [("Claim", None)]
    assert settled(db, client.public) == before == balance(db, client.public)
