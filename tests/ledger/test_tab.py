"""Tabs (ledger/tab.py, ledger/tabrules.py): open, claim, close, expire.

Every rule is checked on real blocks of a test chain (real keys, real
signatures); every rejection has its own typed error, and every block
`grow` adds re-checks the supply invariant, locked coins included.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ledger import errors as E
from ledger import merkle
from ledger.codec import encode
from ledger.crypto import SigningKey
from ledger.state import TAB, Overlay, check_supply
from ledger.tab import MAX_TAB, MIN_TAB, Claim, Lane, OpenTab, Voucher, locked, sign_voucher
from ledger.transition import validate_block
from ledger.types import COIN, ZERO_SIG, sign, tx_hash
from tests.ledger.chainkit import CHAIN, balance, grow, make_net, new_db, next_block


@pytest.fixture
def chain():
    net = make_net()
    return net, new_db(net)


def refused(db, net, tx, error):
    """The next block with ``tx`` in it is invalid with ``error``."""
    block = next_block(db, net).block
    header = replace(block.header, txs_root=merkle.merkle_root([encode(tx)]))
    block = replace(block, header=sign(header, net.node_key(header.producer)), txs=(tx,))
    with pytest.raises(error) as info:
        validate_block(db.state, db.tip, block, block.header.time_ms)
    return str(info.value)


def open_tab(db, client: SigningKey, lanes, *, life=100, nonce=0, chain_id=CHAIN) -> OpenTab:
    """A signed tab of ``lanes`` ((node key, cap) pairs) expiring ``life`` blocks after the
    block that would include it."""
    return sign(OpenTab(chain_id, client.public, b"\x5e" * 32,
                        tuple(Lane(k, cap) for k, cap in lanes), db.tip.height + 1 + life,
                        nonce, ZERO_SIG), client)


def voucher(client: SigningKey, tab: OpenTab, amounts, chain_id=CHAIN) -> Voucher:
    return sign_voucher(client, Voucher(chain_id, tx_hash(tab), tuple(amounts), ZERO_SIG))


def claim(node: SigningKey, v: Voucher, close: bool = False) -> Claim:
    return sign(Claim(CHAIN, node.public, v, close, ZERO_SIG), node)


@pytest.fixture
def tab(chain):
    """users[0] opened a tab: lane 0 for nodes[0] (cap 5 coins), lane 1 for nodes[1] (3)."""
    net, db = chain
    client = net.users[0]
    t = open_tab(db, client, [(net.nodes[0].public, 5 * COIN), (net.nodes[1].public, 3 * COIN)])
    grow(db, net, 1, [t])
    return net, db, client, t


def test_a_tab_locks_its_caps_and_a_claim_pays_every_lane_what_it_is_owed(tab):
    net, db, client, t = tab
    s0, s1 = net.wallets[0].public, net.wallets[1].public  # the lanes' accounts
    assert balance(db, client.public) == 92 * COIN
    assert locked(db.state.get(TAB + tx_hash(t))) == 8 * COIN
    b0, b1 = balance(db, s0), balance(db, s1)
    # One claim, by lane 1's server, settles both lanes (a vanished client pays all).
    grow(db, net, 1, [claim(net.nodes[1], voucher(client, t, [2 * COIN, 1 * COIN]))])
    assert (balance(db, s0), balance(db, s1)) == (b0 + 2 * COIN, b1 + 1 * COIN)
    # Cumulative amounts: only the new part is paid; a lane is never paid past its cap.
    v2 = voucher(client, t, [3 * COIN, 7 * COIN])
    grow(db, net, 1, [claim(net.nodes[0], v2, close=True)])
    assert (balance(db, s0), balance(db, s1)) == (b0 + 3 * COIN, b1 + 3 * COIN)
    assert balance(db, client.public) == 92 * COIN + 2 * COIN  # lane 0's rest, at its close
    record = db.state.get(TAB + tx_hash(t))
    assert record.paid == (3 * COIN, 3 * COIN) and record.closed == (True, False)
    grow(db, net, 1, [claim(net.nodes[1], v2, close=True)])  # pays nothing new, but closes
    assert db.state.get(TAB + tx_hash(t)) is None  # every lane closed: the tab is gone
    assert balance(db, client.public) == 94 * COIN  # paid 6 of the 8 it locked
    check_supply(db.state)


def test_a_claim_that_gains_nothing_or_lies_is_refused(tab):
    net, db, client, t = tab
    v = voucher(client, t, [2 * COIN, 1 * COIN])
    grow(db, net, 1, [claim(net.nodes[0], v)])
    assert "pays no lane" in refused(db, net, claim(net.nodes[0], v), E.StaleVoucher)
    older = voucher(client, t, [1 * COIN, 1 * COIN])
    refused(db, net, claim(net.nodes[1], older), E.StaleVoucher)
    inflated = replace(v, amounts=(4 * COIN, 1 * COIN))  # the client never signed this
    assert "client" in refused(db, net, claim(net.nodes[0], inflated), E.BadSignature)
    by_server = sign_voucher(net.nodes[0], replace(v, amounts=(4 * COIN, 1 * COIN)))
    refused(db, net, claim(net.nodes[0], by_server), E.BadSignature)
    short = voucher(client, t, [4 * COIN])
    assert "lanes" in refused(db, net, claim(net.nodes[0], short), E.BadVoucher)
    refused(db, net, claim(net.nodes[2], voucher(client, t, [4 * COIN, 1 * COIN])), E.NotALane)
    other_chain = voucher(client, t, [4 * COIN, 1 * COIN], chain_id="elsewhere")
    refused(db, net, claim(net.nodes[0], other_chain), E.WrongChainId)
    nowhere = sign_voucher(client, Voucher(CHAIN, b"\x01" * 32, (COIN, COIN), ZERO_SIG))
    refused(db, net, claim(net.nodes[0], nowhere), E.UnknownTab)
    forged_claim = replace(claim(net.nodes[0], voucher(client, t, [4 * COIN, 1 * COIN])),
                           node_key=net.nodes[1].public)  # signed by node 0, names node 1
    refused(db, net, forged_claim, E.BadSignature)
    grow(db, net, 1, [claim(net.nodes[0], voucher(client, t, [4 * COIN, 1 * COIN]), True)])
    later = voucher(client, t, [5 * COIN, 2 * COIN])
    refused(db, net, claim(net.nodes[0], later), E.LaneClosed)
    grow(db, net, 1, [claim(net.nodes[1], later)])  # the other lane goes on
    assert db.state.get(TAB + tx_hash(t)).paid == (4 * COIN, 2 * COIN)


def test_an_expired_tab_gives_its_rest_back_and_takes_no_more_claims(chain):
    net, db = chain
    client = net.users[0]
    t = open_tab(db, client, [(net.nodes[0].public, 5 * COIN)], life=MIN_TAB)
    grow(db, net, 1, [t])
    grow(db, net, 1, [claim(net.nodes[0], voucher(client, t, [2 * COIN]))])
    record = db.state.get(TAB + tx_hash(t))
    grow(db, net, record.expiry_height - db.tip.height)  # the last block it is open in
    assert db.state.get(TAB + tx_hash(t)) is not None
    assert balance(db, client.public) == 95 * COIN
    grow(db, net, 1)  # the next block's prelude refunds it
    assert db.state.get(TAB + tx_hash(t)) is None
    assert balance(db, client.public) == 98 * COIN
    refused(db, net, claim(net.nodes[0], voucher(client, t, [3 * COIN])), E.UnknownTab)
    refused(db, net, t, E.BadNonce)  # the tab itself cannot be opened again


@pytest.mark.parametrize("lanes, life, error, words", [
    ([], 100, E.BadTab, "at least one lane"),
    ([(0, COIN), (0, COIN)], 100, E.BadTab, "twice"),
    ([(0, 0)], 100, E.BadTab, "above 0"),
    ([(0, COIN)], MIN_TAB - 1, E.BadTab, "expire"),
    ([(0, COIN)], MAX_TAB + 1, E.BadTab, "expire"),
    ([("stranger", COIN)], 100, E.NotRegistered, "not a registered node"),
    ([(0, 60 * COIN), (1, 41 * COIN)], 100, E.InsufficientFunds, "caps"),
])
def test_opening_a_tab_is_refused_when(chain, lanes, life, error, words):
    net, db = chain
    keys = {"stranger": SigningKey(b"\x09" * 32).public}
    lanes = [(keys[k] if k in keys else net.nodes[k].public, cap) for k, cap in lanes]
    assert words in refused(db, net, open_tab(db, net.users[0], lanes, life=life), error)


def test_coins_locked_in_one_tab_cannot_be_spent_again(tab):
    """A double spend: the coins of a tab are gone from the balance at once."""
    net, db, client, t = tab
    second = open_tab(db, client, [(net.nodes[2].public, 93 * COIN)], nonce=1)
    refused(db, net, second, E.InsufficientFunds)
    refused(db, net, net.transfer(client, net.users[1].public, 93 * COIN, nonce=1),
            E.InsufficientFunds)
    grow(db, net, 1, [open_tab(db, client, [(net.nodes[2].public, 92 * COIN)], nonce=1)])
    assert balance(db, client.public) == 0


def test_the_supply_invariant_counts_the_coins_tabs_lock(tab):
    net, db, client, t = tab
    check_supply(db.state)
    st = Overlay(db.state)
    record = st.get(TAB + tx_hash(t))
    st.put(TAB + tx_hash(t), replace(record, paid=(COIN, 0)))  # a coin paid to no one
    with pytest.raises(E.SupplyMismatch):
        check_supply(st)
