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
from node.wire import TAB_REFUSED
from tests.node.serve.test_billing import BID, CHAIN, SERVER, tab


class FakeChain:
    """A `TabLedger` that refuses the first admissions with ``errors``, then admits."""

    chain_id = CHAIN

    def __init__(self, errors: list[Exception]):
        self.errors, self.admitted = list(errors), []

    async def admit(self, tx: OpenTab) -> bytes:
        if self.errors:
            raise self.errors.pop(0)
        self.admitted.append(tx)
        return tx_hash(tx)

    async def lookup(self, tab_id: bytes, txids: list[bytes]):
        return 7, None, frozenset()  # in no block yet


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
    assert 5 < 1000 - len(chain.errors) < 20  # tried every 0.1 s for the second it waits
