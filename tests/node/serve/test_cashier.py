"""node.serve.cashier: admitting a session's tab through the node's chain (a fake chain here).

A tab whose nonce is ahead (`BadNonce.ahead`) is tried again while its
predecessors may still arrive by gossip; every other refusal is a
`TabRefused` at once, whose text starts with `node.wire.TAB_REFUSED`: what
a client reads off the wire.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import trio
import trio.testing

from ledger.errors import BadNonce, InsufficientFunds
from ledger.tab import OpenTab
from ledger.types import tx_hash
from node.serve.billing import PaymentError, TabRefused
from node.chain.tabs import ChainTabs
from node.serve.cashier import Cashier, TabLedger
from node.wire import CLAIM_MARGIN, TAB_REFUSED
from tests.node.serve.test_billing import BID, CHAIN, SERVER, tab, voucher


class FakeChain:
    """A `TabLedger` that refuses the first admissions with ``errors``, then admits."""

    chain_id = CHAIN

    def __init__(self, errors: list[Exception], height: int = 7):
        self.errors, self.admitted, self.vetted, self.height = list(errors), [], [], height

    async def vet(self, tab: OpenTab) -> int:
        if self.errors:
            raise self.errors.pop(0)
        self.vetted.append(tab)
        return self.height

    async def admit(self, tx: OpenTab) -> bytes:
        if self.errors:
            raise self.errors.pop(0)
        self.admitted.append(tx)
        return tx_hash(tx)

    async def lookup(self, tab_id: bytes, txids: list[bytes]):
        return self.height, None, frozenset()  # in no block yet


def open_lane(cashier: Cashier, t: OpenTab):
    """``cashier.open`` of ``t``'s server lane, on a clock that jumps over the waits."""
    return trio.run(cashier.open, t, 1, BID, clock=trio.testing.MockClock(autojump_threshold=0))


def test_the_nodes_chain_and_the_fake_are_tab_ledgers():
    service = SimpleNamespace(chain=SimpleNamespace(chain_id=CHAIN))
    assert isinstance(ChainTabs(service, None), TabLedger)
    assert isinstance(FakeChain([]), TabLedger)
    assert not isinstance(SimpleNamespace(chain_id=CHAIN), TabLedger)  # no admit, no lookup


def test_a_tab_ahead_of_its_predecessors_waits_for_them():
    ahead = BadNonce("nonce 1 is out of order: account expects 0", ahead=True)
    chain = FakeChain([ahead, ahead])
    cashier = Cashier(chain, SERVER, BID, gap_wait_s=5.0)
    bill = open_lane(cashier, tab())
    assert chain.admitted == [tab()] and bill.sessions == 1
    assert cashier.stats.refused == 0 and cashier.stats.admitted == 1


@pytest.mark.parametrize("error, reason", [
    (BadNonce("nonce 0 is replayed: account expects 1"),
     f"{TAB_REFUSED}: nonce 0 is replayed: account expects 1"),
    (InsufficientFunds("balance 3 < 99"), f"{TAB_REFUSED}: InsufficientFunds: balance 3 < 99"),
])
def test_any_other_refusal_is_a_tab_refused_at_once(error, reason):
    chain = FakeChain([error])
    cashier = Cashier(chain, SERVER, BID, gap_wait_s=5.0)
    with pytest.raises(TabRefused) as raised:
        open_lane(cashier, tab())
    assert str(raised.value) == reason and isinstance(raised.value, PaymentError)
    assert cashier.stats.refused == 1 and not chain.admitted


def test_a_tab_still_ahead_when_the_wait_ends_is_refused():
    chain = FakeChain([BadNonce("nonce 2 is out of order: account expects 0", ahead=True)] * 1000)
    cashier = Cashier(chain, SERVER, BID, gap_wait_s=1.0)
    with pytest.raises(TabRefused, match="out of order"):
        open_lane(cashier, tab())
    assert 2 < 1000 - len(chain.errors) < 8  # tried every 0.25 s for the second it waits


def vet(cashier: Cashier, t: OpenTab) -> None:
    trio.run(cashier.vet, t, clock=trio.testing.MockClock(autojump_threshold=0))


def test_vetting_waits_for_predecessors_and_admits_nothing():
    ahead = BadNonce("nonce 1 is out of order: account expects 0", ahead=True)
    chain = FakeChain([ahead, ahead])
    cashier = Cashier(chain, SERVER, BID, gap_wait_s=5.0)
    vet(cashier, tab())
    assert chain.vetted == [tab()] and not chain.admitted and not cashier.lanes


def test_vetting_refuses_an_unfunded_tab_at_once():
    chain = FakeChain([InsufficientFunds("balance 0 < 99")] + [BadNonce("x", ahead=True)] * 9)
    cashier = Cashier(chain, SERVER, BID, gap_wait_s=5.0)
    with pytest.raises(TabRefused, match="InsufficientFunds: balance 0 < 99"):
        vet(cashier, tab())
    assert len(chain.errors) == 9 and cashier.stats.refused == 1


@pytest.mark.parametrize("height, refused", [(100 - CLAIM_MARGIN - 2, False),
                                             (100 - CLAIM_MARGIN - 1, True), (100, True)])
def test_a_tab_too_near_its_expiry_to_claim_is_refused(height, refused):
    # tab() expires at height 100: served until 100 - CLAIM_MARGIN, its claim then lands.
    cashier = Cashier(FakeChain([], height=height), SERVER, BID)
    if refused:
        with pytest.raises(TabRefused, match=f"serves a tab only until {CLAIM_MARGIN} blocks"):
            vet(cashier, tab())
    else:
        vet(cashier, tab())


def test_a_lane_that_expires_unclaimed_is_logged_with_what_it_served():
    # The claim never lands (the fake chain admits it but has no block): at expiry the
    # lane is dropped, and what it served and was vouched is said.
    chain = FakeChain([])
    lines: list[str] = []
    cashier = Cashier(chain, SERVER, BID, report=lines.append, poll_s=0.1)

    async def main():
        bill = await cashier.open(tab(), 1, BID)
        cashier.delivered(bill, bill.take(b"", 3, 10))
        chain.height = 101  # past the tab's expiry (100)
        async with trio.open_nursery() as nursery:
            await nursery.start(cashier.run)
            await trio.sleep(0.3)
            nursery.cancel_scope.cancel()
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert cashier.stats.expired_unclaimed == 1 and cashier.stats.lost == 150
    assert not cashier.lanes
    assert any("expired at height 100 before its lane closed on chain: 150 base units "
               "served, 0 vouched, no claim made" in line for line in lines), lines


def test_a_lane_ended_here_is_never_opened_again():
    # Attack note: a client that ends its session and reopens the tab got a new bill, and
    # a new credit, each time. The lane ended here stays ended until the tab expires.
    chain = FakeChain([])
    cashier = Cashier(chain, SERVER, BID, poll_s=0.1)

    async def main():
        bill = await cashier.open(tab(), 1, BID)
        cashier.delivered(bill, bill.take(b"", 3, 10))  # on credit, then gone unpaid
        await cashier.release(bill)
        async with trio.open_nursery() as nursery:
            await nursery.start(cashier.run)
            await trio.sleep(0.3)  # the done lane is dropped from the lanes
            assert not cashier.lanes
            with pytest.raises(PaymentError, match="ended here already"):
                await cashier.vet(tab())
            with pytest.raises(PaymentError, match="ended here already"):
                await cashier.open(tab(), 1, BID)
            nursery.cancel_scope.cancel()
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_lane_closed_on_chain_is_not_opened():
    from dataclasses import replace

    from ledger.tab import new_tab_record
    t = tab()
    closed = replace(new_tab_record(t, (b"\x00" * 32, b"\x00" * 32)), closed=(False, True))
    chain = FakeChain([])
    chain.lookup = lambda tab_id, txids: _ready((7, closed, frozenset()))
    with pytest.raises(PaymentError, match="closed on chain already"):
        open_lane(Cashier(chain, SERVER, BID), t)


async def _ready(value):
    return value


def test_two_opens_of_one_tab_at_once_share_one_bill():
    class SlowChain(FakeChain):
        async def admit(self, tx):
            await trio.sleep(0.5)  # the second open arrives while the first admits
            return await FakeChain.admit(self, tx)
    cashier = Cashier(SlowChain([]), SERVER, BID)

    async def main():
        bills = []
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(lambda: _append(bills, cashier.open(tab(), 1, BID)))
        return bills
    bills = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert bills[0] is bills[1] and bills[0].sessions == 2 and len(cashier.lanes) == 1


async def _append(out: list, awaitable) -> None:
    out.append(await awaitable)


def test_a_disk_that_cannot_keep_a_voucher_does_not_stop_the_cashier(tmp_path):
    # A full or read-only disk: the write fails, is logged, and is tried again later.
    blocked = tmp_path / "tabs"
    blocked.write_text("a file where the folder should be")
    cashier = Cashier(FakeChain([]), SERVER, BID, folder=blocked, poll_s=0.1)
    t = tab()

    async def main():
        bill = await cashier.open(t, 1, BID)
        cashier.delivered(bill, bill.take(b"", 3, 10))
        bill.take(voucher(t, (0, 150)), 1, 10)
        bill.verify_pending()
        await cashier.release(bill)  # keeps the voucher (and fails to), then claims
        assert cashier.lanes[bill.tab_id].dirty  # to be written again
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
