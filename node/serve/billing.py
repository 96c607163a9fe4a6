"""What a paid session's server is owed, and whether its client keeps paying.

Owns the pure half of a server's payments (specs/network.md section 9.6):
`check_tab`, the checks a server makes of the `OpenTab` a session opens
with before it asks the chain, and `Bill`, one lane of one tab as its
server counts it: positions delivered x layers x bid (`node.wire.charge`,
the rule the client counts by too), against the client's latest `Voucher`.

Pay after delivery, with a bounded credit: the voucher a step carries must
cover every position delivered before it, running the step must not pass
the lane's cap, and what the lane's steps (delivered and running, every
session of the tab together) bring beyond what checked vouchers pay must
stay within `node.wire.credit` (`CREDIT_POSITIONS` x layers x bid). A
longer step comes with a voucher that pays its rest ahead. A voucher's
amounts only grow. Its signature is checked apart (`Bill.verify_pending`),
after the step's outputs left, so an Ed25519 check never sits on a decode
step's critical path; a bad one ends the session at its next step. A
voucher that must pay beyond the credit is checked before its step runs.

Attack note: whatever a client does (stops paying, forges signatures, opens
many sessions on one tab, sends a 2048-position step first), the positions
a lane serves unpaid are at most the credit: a step is counted as running
before its forward call, so two sessions cannot both spend one credit.

Pure: no clock, no I/O; the chain's own checks (funds, nonce, registration,
expiry) are `node.serve.cashier`'s, through the node's mempool.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger.codec import decode
from ledger.errors import DecodeError
from ledger.tab import OpenTab, Voucher, voucher_ok
from ledger.types import signature_ok, tx_hash
from node.errors import NodeError
from node.wire import TAB_REFUSED, charge, credit

__all__ = ["Bill", "PaymentError", "TabRefused", "check_tab"]


class PaymentError(NodeError):
    """A paid session the server will not go on with; the message is the client's reason."""


class TabRefused(PaymentError):
    """The node's chain refuses a session's tab (funds, nonce, lanes, expiry).

    Its text starts with `node.wire.TAB_REFUSED`: the wire carries only the
    text, and a client reads that prefix as "no server's chain would take it".
    """

    def __init__(self, why: str):
        super().__init__(f"{TAB_REFUSED}: {why}")


def check_tab(raw: bytes, *, chain_id: str, node_key: bytes, bid: int, ask: int,
              layers: int) -> tuple[OpenTab, int]:
    """The tab ``raw`` decodes to and this server's lane in it, or why not.

    Args:
        raw: the encoded `OpenTab` of the `OpenSession`.
        chain_id: the chain this server's node follows.
        node_key: this server's node key (its lane's key).
        bid: the session's bid per position per layer; ask: this server's price.
        layers: the session's layer count (its lane must pay one position of them).

    Raises:
        PaymentError: not a tab, another chain's, not signed by its client,
            no lane for this server, a bid below the ask, or a lane too
            small to pay a single position.
    """
    try:
        tab = decode(raw, OpenTab)
    except DecodeError as exc:
        raise PaymentError(f"the session's tab does not decode: {exc}") from None
    if tab.chain_id != chain_id:
        raise PaymentError(f"the tab is for chain {tab.chain_id!r}, this server's is {chain_id!r}")
    if bid < ask:
        raise PaymentError(f"a bid of {bid} is below this server's ask of {ask} base units per "
                           "position per layer")
    lane = next((i for i, x in enumerate(tab.lanes) if x.node_key == node_key), None)
    if lane is None:
        raise PaymentError(f"the tab has no lane for this server's node key "
                           f"{node_key.hex()[:16]}..")
    if tab.lanes[lane].cap < charge(1, layers, bid):
        raise PaymentError(f"this server's lane caps {tab.lanes[lane].cap}, less than one "
                           f"position ({charge(1, layers, bid)} base units)")
    if not signature_ok(tab):
        raise PaymentError("the tab is not signed by its client")
    return tab, lane


@dataclass(slots=True)
class Bill:
    """One lane of one tab, as its server counts it (sessions on the lane share it).

    tab, tab_id, lane: the tab, its id and this server's lane index.
    bid: base units per position per layer (the first session's; a later
        session on the lane must bid the same).
    owed: base units for the positions delivered so far.
    voucher: the latest voucher whose signature checked (None: none yet).
    pending: the latest voucher taken, its signature not checked yet.
    forged: a voucher's signature was not the client's (the lane is done).
    sessions: the lane's sessions still open.
    running: base units of the steps taken and not delivered yet (every session's).
    """

    tab: OpenTab
    tab_id: bytes
    lane: int
    bid: int
    owed: int = 0
    running: int = 0
    voucher: Voucher | None = None
    pending: Voucher | None = None
    forged: bool = False
    sessions: int = 0

    @classmethod
    def of(cls, tab: OpenTab, lane: int, bid: int) -> Bill:
        return cls(tab, tx_hash(tab), lane, bid)

    @property
    def cap(self) -> int:
        return self.tab.lanes[self.lane].cap

    @property
    def paid(self) -> int:
        """What the latest checked voucher pays this lane (at most its cap)."""
        return 0 if self.voucher is None else min(self.voucher.amounts[self.lane], self.cap)

    def take(self, raw: bytes, positions: int, layers: int) -> int:
        """Check the voucher a step of ``positions`` through ``layers`` carries; count the
        step as running.

        Returns:
            The step's charge: `deliver` or `drop` it once the step is over.

        Raises:
            PaymentError: "payment behind" (the voucher pays less than the
                positions delivered), "tab exhausted" (the step would pass the
                cap), "beyond the credit" (the step would leave more than the
                lane's credit unpaid), a malformed, shrinking or (when it must
                pay ahead) forged voucher, or a forged one earlier.
        """
        if self.forged:
            raise PaymentError("an earlier voucher is not signed by the tab's client")
        step = charge(positions, layers, self.bid)
        if self.owed + self.running + step > self.cap:
            raise PaymentError(f"tab exhausted: {self.owed + self.running} owed or running, a "
                               f"step of {step} more passes this lane's cap of {self.cap}")
        need = self.owed + self.running + step - credit(layers, self.bid)
        voucher = self._voucher(raw) if raw else None
        amount = 0 if voucher is None else voucher.amounts[self.lane]
        if amount < self.owed:
            raise PaymentError(f"payment behind: the voucher pays {amount}, {self.owed} are owed "
                               "for the positions delivered")
        if need > self.paid:  # beyond the credit: the voucher pays ahead, checked now
            if min(amount, self.cap) < need:
                raise PaymentError(f"beyond the credit: a step of {step} would leave "
                                   f"{self.owed + self.running + step - self.paid} unpaid, the "
                                   f"lane's credit is {credit(layers, self.bid)}: its voucher "
                                   f"must pay {need}, it pays {amount}")
            self.pending = voucher
            if not self.verify_pending():
                raise PaymentError("the voucher is not signed by the tab's client")
        elif voucher is not None:
            self.pending = voucher  # its signature is checked after the step (`verify_pending`)
        self.running += step
        return step

    def drop(self, step: int) -> None:
        """A step taken did not run or its outputs never left: it is not owed."""
        self.running = max(0, self.running - step)

    def settle(self, raw: bytes) -> None:
        """Take the final voucher of a `Settle` (its signature checked now: nothing runs after).

        Raises:
            PaymentError: as `take`, or a voucher not signed by the client.
        """
        voucher = self._voucher(raw)
        self.pending = voucher
        if not self.verify_pending():
            raise PaymentError("the final voucher is not signed by the tab's client")

    def verify_pending(self) -> bool:
        """Check the pending voucher's signature; False (and ``forged``) if it is not the client's."""
        voucher, self.pending = self.pending, None
        if voucher is None:
            return not self.forged
        if voucher_ok(voucher, self.tab.client):
            self.voucher = voucher
        else:
            self.forged = True
        return not self.forged

    def deliver(self, step: int) -> None:
        """Count a step taken (its charge, from `take`) as delivered: its outputs left for
        the next hop or the client."""
        self.running = max(0, self.running - step)
        self.owed += step

    def _voucher(self, raw: bytes) -> Voucher:
        try:
            voucher = decode(raw, Voucher)
        except DecodeError as exc:
            raise PaymentError(f"the voucher does not decode: {exc}") from None
        if voucher.tab_id != self.tab_id or voucher.chain_id != self.tab.chain_id:
            raise PaymentError("the voucher is for another tab")
        if len(voucher.amounts) != len(self.tab.lanes):
            raise PaymentError(f"the voucher has {len(voucher.amounts)} amounts for "
                               f"{len(self.tab.lanes)} lanes")
        latest = self.pending or self.voucher
        if latest is not None and any(a < b for a, b in zip(voucher.amounts, latest.amounts)):
            raise PaymentError("the voucher's amounts went down")
        return voucher
