"""node.serve.billing: a server's checks of a session's tab and of each step's voucher.

Real keys and signatures. The properties: the client's vouchers
(`wallet.payer.ClientTab`) are never refused until the cap; whatever a client
sends, a lane serves at most its credit unpaid (specs/network.md 9.6); what
the server counts owed is always bid x layers x the positions it ran.
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
from node.wire import CREDIT_POSITIONS, charge, credit
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


def run(b: Bill, raw: bytes, positions: int) -> None:
    """A step taken and delivered."""
    b.deliver(b.take(raw, positions, LAYERS))


def test_pay_after_delivery_within_the_credit():
    t, b = bill()
    run(b, b"", 6)  # the first step runs on credit
    assert b.owed == 300 and b.running == 0
    with pytest.raises(PaymentError, match="payment behind: the voucher pays 0, 300"):
        b.take(b"", 1, LAYERS)
    with pytest.raises(PaymentError, match="payment behind: the voucher pays 299, 300"):
        b.take(voucher(t, (0, 299)), 1, LAYERS)
    b.take(voucher(t, (0, 300)), 1, LAYERS)
    assert b.verify_pending() and b.paid == 300 and b.running == 50


def test_a_long_first_step_pays_what_passes_the_credit_ahead():
    t, b = bill(cap=10**9)
    step, free = charge(2048, LAYERS, BID), credit(LAYERS, BID)
    with pytest.raises(PaymentError, match=f"beyond the credit: a step of {step} would leave "
                       f"{step} unpaid, the lane's credit is {free}"):
        b.take(b"", 2048, LAYERS)
    with pytest.raises(PaymentError, match=f"must pay {step - free}, it pays {step - free - 1}"):
        b.take(voucher(t, (0, step - free - 1)), 2048, LAYERS)
    assert b.running == 0
    b.take(voucher(t, (0, step - free)), 2048, LAYERS)
    assert b.paid == step - free and b.running == step  # checked before the step ran
    forged = Bill.of(t, 1, BID)
    with pytest.raises(PaymentError, match="not signed by the tab's client"):  # checked now
        forged.take(voucher(t, (0, step), key=OTHER), 2048, LAYERS)
    assert forged.running == 0 and forged.forged


def test_sessions_on_one_tab_share_one_credit():
    t, b = bill(cap=10**9)
    per = CREDIT_POSITIONS // 2
    first = b.take(b"", per, LAYERS)  # two sessions of the lane, each a step running
    b.take(b"", per, LAYERS)
    with pytest.raises(PaymentError, match="beyond the credit"):
        b.take(b"", 1, LAYERS)  # a third, before either delivered: the credit is spent
    b.drop(first)  # one failed before its outputs left: its credit comes back
    b.take(b"", per, LAYERS)


def test_the_cap_is_never_passed():
    t, b = bill(cap=charge(7, LAYERS, BID))
    run(b, b"", 6)
    with pytest.raises(PaymentError, match="tab exhausted: 300 owed or running, a step of 100"):
        b.take(voucher(t, (0, 300)), 2, LAYERS)
    b.take(voucher(t, (0, 300)), 1, LAYERS)  # exactly to the cap


def test_a_forged_voucher_ends_the_lane_at_the_next_step():
    t, b = bill()
    run(b, b"", 2)
    run(b, voucher(t, (0, 10**6), key=SERVER), 1)  # within the credit: checked after the step
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
    b.deliver(150)
    with pytest.raises(PaymentError, match="final voucher is not signed"):
        b.settle(voucher(t, (0, 150), key=OTHER))
    b2 = Bill.of(t, 1, BID)
    b2.deliver(150)
    b2.settle(voucher(t, (0, 150)))
    assert b2.paid == 150


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.integers(1, 300), min_size=1, max_size=12),
       cap=st.integers(1_000, 300_000), forged=st.integers(0, 12))
def test_the_credit_bounds_what_a_lane_serves_unpaid(steps, cap, forged):
    # The honest client's vouchers (`ClientTab.voucher`) are never refused but at the cap;
    # whatever a client sends, the positions served unpaid by checked vouchers stay within
    # the credit, and a forged voucher (from step ``forged`` on) buys nothing beyond it.
    t = tab(cap)
    hop = Hop("server", 3, 3 + LAYERS)
    client = ClientTab(t, CLIENT, {"server": 1}, {"server": BID}, [0, 0])
    b = Bill.of(t, 1, BID)
    for k, n in enumerate(steps):
        raw = client.voucher([(hop, n)])
        if k >= forged:
            raw = voucher(t, (0, 10**9), key=OTHER)
        try:
            step = b.take(raw, n, LAYERS)
        except PaymentError as exc:
            assert k >= forged or "tab exhausted" in str(exc), exc
            break
        assert b.owed + b.running - b.paid <= credit(LAYERS, BID)
        b.deliver(step)
        client.deliver(hop, n)
        b.verify_pending()
        assert b.owed - b.paid <= credit(LAYERS, BID)
        assert client.owed("server") == b.owed


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
        server.deliver(charge(n, LAYERS, bid))
        assert client.owed("server") == server.owed
    assert server.owed == charge(sum(steps), LAYERS, bid)
