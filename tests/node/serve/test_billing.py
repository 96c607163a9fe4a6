"""node.serve.billing: a server's checks of a session's tab and of each step's voucher.

Real keys and signatures. The property: a client that vouches exactly for
what was delivered is never refused until the cap, and what the server
counts owed is always bid x layers x the positions it ran.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.codec import encode
from ledger.crypto import SigningKey
from ledger.tab import Lane, OpenTab, Voucher, sign_voucher
from ledger.types import ZERO_SIG, sign, tx_hash
from node.serve.billing import Bill, PaymentError, check_tab
from node.wire import charge
from wallet.client.route import Hop
from wallet.payer import ClientTab

CHAIN = "pnode-test"
CLIENT, SERVER, OTHER = (SigningKey(bytes([i]) * 32) for i in (1, 2, 3))
LAYERS, BID = 10, 5


def tab(cap: int = 10_000, lanes=None, chain_id=CHAIN) -> OpenTab:
    lanes = lanes or (Lane(OTHER.public, 99), Lane(SERVER.public, cap))
    return sign(OpenTab(chain_id, CLIENT.public, bytes(32), lanes, 100, 0, ZERO_SIG), CLIENT)


def voucher(t: OpenTab, amounts, key=CLIENT) -> bytes:
    return encode(sign_voucher(key, Voucher(t.chain_id, tx_hash(t), tuple(amounts), ZERO_SIG)))


def checked(raw: bytes, bid=BID, ask=BID):
    return check_tab(raw, chain_id=CHAIN, node_key=SERVER.public, bid=bid, ask=ask,
                     layers=LAYERS)


def test_check_tab_finds_the_lane():
    t = tab()
    assert checked(encode(t)) == (t, 1)


@pytest.mark.parametrize("raw, kw, reason", [
    (b"\x01garbage", {}, "does not decode"),
    (encode(tab(chain_id="elsewhere")), {}, "is for chain 'elsewhere'"),
    (encode(tab()), {"bid": 4}, "a bid of 4 is below this server's ask of 5"),
    (encode(tab(lanes=(Lane(OTHER.public, 5000),))), {}, "no lane for this server"),
    (encode(tab(cap=charge(1, LAYERS, BID) - 1)), {}, "less than one position"),
    (encode(replace(tab(), expiry_height=101)), {}, "not signed by its client"),
])
def test_check_tab_refuses(raw, kw, reason):
    with pytest.raises(PaymentError, match=reason):
        checked(raw, **kw)


def bill(cap=10_000) -> tuple[OpenTab, Bill]:
    t = tab(cap)
    return t, Bill.of(t, 1, BID)


def test_pay_after_delivery_with_one_step_of_credit():
    t, b = bill()
    b.take(b"", 6, LAYERS)  # the first step runs on credit
    b.deliver(6, LAYERS)
    assert b.owed == 300
    with pytest.raises(PaymentError, match="payment behind: no voucher, 300 owed"):
        b.take(b"", 1, LAYERS)
    with pytest.raises(PaymentError, match="payment behind: the voucher pays 299, 300"):
        b.take(voucher(t, (0, 299)), 1, LAYERS)
    b.take(voucher(t, (0, 300)), 1, LAYERS)
    assert b.verify_pending() and b.paid == 300


def test_the_cap_is_never_passed():
    t, b = bill(cap=charge(7, LAYERS, BID))
    b.take(b"", 6, LAYERS)
    b.deliver(6, LAYERS)
    with pytest.raises(PaymentError, match="tab exhausted: 300 owed, a step of 100 more"):
        b.take(voucher(t, (0, 300)), 2, LAYERS)
    b.take(voucher(t, (0, 300)), 1, LAYERS)  # exactly to the cap


def test_a_forged_voucher_ends_the_lane_at_the_next_step():
    t, b = bill()
    b.take(b"", 2, LAYERS)
    b.deliver(2, LAYERS)
    b.take(voucher(t, (0, 10**6), key=SERVER), 1, LAYERS)  # taken: checked after the step
    b.deliver(1, LAYERS)
    assert not b.verify_pending() and b.forged and b.voucher is None
    with pytest.raises(PaymentError, match="not signed by the tab's client"):
        b.take(voucher(t, (0, 150)), 1, LAYERS)


@pytest.mark.parametrize("make, reason", [
    (lambda t: voucher(tab(cap=1), (0, 100)), "for another tab"),
    (lambda t: voucher(t, (100,)), "1 amounts for 2 lanes"),
    (lambda t: voucher(t, (0, 100)), "amounts went down"),
    (lambda t: b"\x02junk", "does not decode"),
])
def test_bad_vouchers_are_refused(make, reason):
    t, b = bill()
    b.take(voucher(t, (1, 200)), 1, LAYERS)
    with pytest.raises(PaymentError, match=reason):
        b.take(make(t), 1, LAYERS)


def test_settle_checks_the_signature_at_once():
    t, b = bill()
    b.deliver(3, LAYERS)
    with pytest.raises(PaymentError, match="final voucher is not signed"):
        b.settle(voucher(t, (0, 150), key=OTHER))
    b2 = Bill.of(t, 1, BID)
    b2.deliver(3, LAYERS)
    b2.settle(voucher(t, (0, 150)))
    assert b2.paid == 150


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.integers(1, 40), min_size=1, max_size=12),
       cap=st.integers(1_000, 30_000))
def test_an_honest_client_is_refused_only_at_the_cap(steps, cap):
    t, b = bill(cap)
    vouched = ran = covered = 0
    for n in steps:
        raw = b"" if vouched == 0 else voucher(t, (0, vouched))
        if b.owed + charge(n, LAYERS, BID) > cap:
            with pytest.raises(PaymentError, match="tab exhausted"):
                b.take(raw, n, LAYERS)
            break
        b.take(raw, n, LAYERS)
        b.deliver(n, LAYERS)
        assert b.verify_pending()
        covered, vouched, ran = vouched, b.owed, ran + n
    assert b.owed == charge(ran, LAYERS, BID) <= cap
    assert b.paid == covered  # the last voucher taken: every step but the last one run


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.integers(1, 64), max_size=12), bid=st.integers(0, 50))
def test_the_client_counts_a_lane_as_its_server_does(steps, bid):
    # Both ends count by `node.wire.charge`: a client's vouchers are never behind.
    t = tab(cap=10**12)
    hop = Hop("server", 3, 3 + LAYERS)
    client = ClientTab(t, CLIENT, {"server": 1}, {"server": bid}, [0, 0])
    server = Bill.of(t, 1, bid)
    for n in steps:
        client.deliver(hop, n)
        server.deliver(n, LAYERS)
        assert client.owed("server") == server.owed
    assert server.owed == charge(sum(steps), LAYERS, bid)
