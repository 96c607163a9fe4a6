"""The rules of tabs: opening one, claiming from it, refunding it at expiry.

Pure functions over an `Overlay` (specs/ledger.md §5.2 and §5.1 step 2b),
each checking everything before it writes, as `ledger.rules` does. Attack
notes inline where a rule is subtle.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ledger.accounts import check_credits, check_nonce, credit
from ledger.errors import (
    BadSignature, BadTab, BadVoucher, InsufficientFunds, LaneClosed, NotALane, NotRegistered,
    StaleVoucher, UnknownTab, WrongChainId,
)
from ledger.state import NODE, TAB, Overlay
from ledger.tab import (
    MAX_TAB, MIN_TAB, Claim, OpenTab, TabRecord, locked, new_tab_record, voucher_ok,
)
from ledger.types import tx_hash

__all__ = ["apply_claim", "apply_open_tab", "check_open_tab", "claim_outcome", "lane_of",
           "refund_expired"]


def apply_open_tab(st: Overlay, ctx: Any, tx: OpenTab, raw: bytes) -> None:
    """Lock the sum of the lanes' caps from the client for the tab ``tx_hash(tx)``.

    Raises:
        BadNonce, BadTab, NotRegistered, InsufficientFunds: nothing written.
    """
    check_nonce(st, tx.client, tx.nonce)
    payees, total = check_open_tab(st, ctx, tx)
    client = st.account(tx.client)
    tab_id = tx_hash(tx, raw)  # unique: the nonce is the client's next, used once
    st.put_account(tx.client, replace(client, balance=client.balance - total,
                                      nonce=client.nonce + 1))
    st.put(TAB + tab_id, new_tab_record(tx, payees))


def check_open_tab(st: Overlay, ctx: Any, tx: OpenTab) -> tuple[tuple[bytes, ...], int]:
    """Every rule of an `OpenTab` but its nonce: (each lane's payee account, the caps' sum).

    A server asks this before it gives a tab's session a slot (specs/network.md
    9.6, admission order): a tab whose nonce is ahead of its account may
    still land once its predecessors do, but one that cannot pay never will.

    Raises:
        BadTab, NotRegistered, InsufficientFunds: what fails first.
    """
    if not tx.lanes:
        raise BadTab("a tab needs at least one lane")
    keys = [lane.node_key for lane in tx.lanes]
    if len(set(keys)) != len(keys):
        raise BadTab("a tab names a server's lane twice")
    if any(lane.cap == 0 for lane in tx.lanes):
        raise BadTab("a lane's cap must be above 0")
    life = tx.expiry_height - ctx.height
    if not MIN_TAB <= life <= MAX_TAB:
        raise BadTab(f"a tab must expire {MIN_TAB}..{MAX_TAB} blocks after it opens, "
                     f"this one {life}")
    payees = []
    for key in keys:
        node = st.get(NODE + key)
        if node is None:
            raise NotRegistered(f"lane {key.hex()[:16]}.. is not a registered node")
        payees.append(node.account)
    total = sum(lane.cap for lane in tx.lanes)
    balance = st.account(tx.client).balance
    if balance < total:
        raise InsufficientFunds(f"balance {balance} < the tab's caps, {total} (base units)")
    return tuple(payees), total


def apply_claim(st: Overlay, ctx: Any, tx: Claim, raw: bytes) -> None:
    """Pay every open lane of the voucher's tab what the voucher owes it beyond what it
    was paid (at most its cap); with ``close``, end the claimant's lane and refund its rest.

    Attack notes: the voucher's amounts are cumulative, so a server that
    re-claims an old voucher or a forged amount gains nothing (paid is
    subtracted, the client's signature covers the amounts); any lane can
    settle all, so a client that vanishes still pays every server; a claim
    carries no nonce, since one that pays nothing new is refused
    (`StaleVoucher`) and a closing one can close its lane once.

    Raises:
        UnknownTab, BadVoucher, NotALane, LaneClosed, StaleVoucher, BadAmount:
            nothing written.
    """
    v = tx.voucher
    record = st.get(TAB + v.tab_id)
    if record is None or record.expiry_height < ctx.height:
        raise UnknownTab(f"no open tab {v.tab_id.hex()[:16]}.. (never opened, expired or closed)")
    if v.chain_id != ctx.chain_id:
        raise WrongChainId(f"voucher signed for chain {v.chain_id!r}, this is {ctx.chain_id!r}")
    if len(v.amounts) != len(record.lanes):
        raise BadVoucher(f"a voucher of {len(v.amounts)} amounts for {len(record.lanes)} lanes")
    if not voucher_ok(v, record.client):
        raise BadSignature("the voucher is not signed by its tab's client")
    me = lane_of(record, tx.node_key)
    if me is None:
        raise NotALane(f"{tx.node_key.hex()[:16]}.. is not a lane of this tab")
    if record.closed[me]:
        raise LaneClosed("this lane was closed already")
    pay, refund, after = claim_outcome(record, tx)
    if not any(pay) and not tx.close:
        raise StaleVoucher("the voucher pays no lane more than it was paid")
    credits: dict[bytes, int] = {}
    for payee, amount in zip(record.payees, pay):
        credits[payee] = credits.get(payee, 0) + amount
    credits[record.client] = credits.get(record.client, 0) + refund
    check_credits(st, credits)
    for account_id, amount in credits.items():
        if amount:
            credit(st, account_id, amount)
    if all(after.closed):
        st.delete(TAB + v.tab_id)
    else:
        st.put(TAB + v.tab_id, after)


def lane_of(record: TabRecord, node_key: bytes) -> int | None:
    """The index of ``node_key``'s lane in the tab, or None."""
    return next((i for i, lane in enumerate(record.lanes) if lane.node_key == node_key), None)


def claim_outcome(record: TabRecord, tx: Claim) -> tuple[tuple[int, ...], int, TabRecord]:
    """What a claim `apply_claim` accepts does to its tab (pure; no check here).

    Returns:
        Each lane's payment (what the voucher owes it beyond what it was paid,
        at most its cap; 0 for a closed lane), the client's refund (with
        ``close``: the claimant lane's rest) and the tab's record after.
    """
    me = lane_of(record, tx.node_key)
    pay = tuple(0 if shut else max(0, min(amount, lane.cap) - paid) for amount, lane, paid, shut
                in zip(tx.voucher.amounts, record.lanes, record.paid, record.closed))
    paid = tuple(p + a for p, a in zip(record.paid, pay))
    refund = record.lanes[me].cap - paid[me] if tx.close else 0
    closed = tuple(shut or (tx.close and i == me) for i, shut in enumerate(record.closed))
    return pay, refund, replace(record, paid=paid, closed=closed)


def refund_expired(st: Overlay, ctx: Any) -> None:
    """Give each tab that expired before this block its locked rest back (block prelude)."""
    for tab_id in st.ids(TAB):
        record = st.get(TAB + tab_id)
        if record.expiry_height < ctx.height:
            credit(st, record.client, locked(record))
            st.delete(TAB + tab_id)
