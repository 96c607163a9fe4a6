"""An account's history, as `pwallet history` shows it, read from a chain store.

Owns `history_rows`: every transaction that moved the account's coins, in
chain order, then the queued ones. For tabs it follows the ledger's own
arithmetic (`ledger.tabrules.claim_outcome`): a claim's row says what it
paid the account's lanes or refunded the account as a tab's client, and a
``TabExpired`` row, at the block whose prelude gave an expired tab's rest
back, says how much came back. So the deltas of a client's rows add up to
its balance (mining rewards aside: they are not transactions).
"""

from __future__ import annotations

from typing import Any

from ledger.codec import to_json
from ledger.tab import Claim, OpenTab, TabRecord, locked, new_tab_record
from ledger.tabrules import claim_outcome
from ledger.types import Register, Transfer, tx_hash


def history_rows(db: Any, account: bytes) -> list[dict]:
    """The rows of ``account``'s history in ``db`` (a `ledger.chaindb.ChainDB`).

    Returns:
        Dicts of ``height`` (None: queued), ``type``, ``txid``, ``delta`` (the
        change to the account's balance in base units; None for a queued
        claim, whose effect depends on the claims before it) and ``tx`` (its
        JSON form; for ``TabExpired``, the tab's id).
    """
    book = _Book(account)
    rows = book.genesis(db.genesis)
    for block in db.iter_blocks():
        height = block.header.height
        rows += [dict(height=height, **row) for row in book.expire(height)]
        rows += [dict(height=height, **row) for tx in block.txs
                 if (row := book.apply(tx)) is not None]
    rows += [dict(height=None, **row) for tx in db.mempool()
             if (row := book.queued(tx)) is not None]
    return rows


class _Book:
    """Replays the chain's transactions for one account: its tabs and its nodes' lanes."""

    def __init__(self, account: bytes):
        self.account = account
        self.owner: dict[bytes, bytes] = {}  # node key -> its account, as registered so far
        self.tabs: dict[bytes, TabRecord] = {}  # every open tab (its claims may pay us)

    def genesis(self, genesis) -> list[dict]:
        rows = [{"height": 0, "type": "Allocation", "txid": "genesis", "delta": a.amount,
                 "tx": to_json(a)} for a in genesis.allocations if a.account == self.account]
        for reg in genesis.registrations:
            if (row := self.apply(reg)) is not None:
                rows.append(dict(height=0, **row))
        return rows

    def expire(self, height: int) -> list[dict]:
        """The block prelude at ``height``: tabs that expired before it give their rest back."""
        rows = []
        for tab_id, record in list(self.tabs.items()):
            if record.expiry_height < height:
                del self.tabs[tab_id]
                if record.client == self.account and locked(record):
                    rows.append({"type": "TabExpired", "txid": tab_id.hex(),
                                 "delta": locked(record), "tx": {"tab": tab_id.hex()}})
        return rows

    def apply(self, tx) -> dict | None:
        """Follow ``tx`` (in a block); its row when it moved the account's coins."""
        if isinstance(tx, Register):
            self.owner[tx.node_key] = tx.account
            return _row(tx, -tx.bond) if tx.account == self.account else None
        if isinstance(tx, Transfer):
            if self.account not in (tx.sender, tx.recipient):
                return None
            return _row(tx, (tx.amount if tx.recipient == self.account else 0)
                        - (tx.amount if tx.sender == self.account else 0))
        if isinstance(tx, OpenTab):
            payees = tuple(self.owner.get(lane.node_key, b"") for lane in tx.lanes)
            self.tabs[tx_hash(tx)] = new_tab_record(tx, payees)
            return _row(tx, -sum(lane.cap for lane in tx.lanes)) \
                if tx.client == self.account else None
        if isinstance(tx, Claim):
            return self._claim(tx)
        return None

    def _claim(self, tx: Claim) -> dict | None:
        tab_id = tx.voucher.tab_id
        record = self.tabs.get(tab_id)
        if record is None:  # a tab opened before what this replay saw: cannot happen
            return None
        pay, refund, after = claim_outcome(record, tx)
        if all(after.closed):
            del self.tabs[tab_id]
        else:
            self.tabs[tab_id] = after
        mine = record.client == self.account
        earned = sum(p for p, payee in zip(pay, record.payees) if payee == self.account)
        if not mine and not earned and self.owner.get(tx.node_key) != self.account:
            return None
        return _row(tx, earned + (refund if mine else 0))

    def queued(self, tx) -> dict | None:
        """A mempool transaction's row (a claim's effect is not known until it lands)."""
        if isinstance(tx, Claim):
            record = self.tabs.get(tx.voucher.tab_id)
            ours = (record is not None and (record.client == self.account
                                            or self.account in record.payees))
            return _row(tx, None) if ours or self.owner.get(tx.node_key) == self.account \
                else None
        owner, tabs = dict(self.owner), dict(self.tabs)  # queued txs change nothing here
        try:
            return self.apply(tx)
        finally:
            self.owner, self.tabs = owner, tabs


def _row(tx, delta: int | None) -> dict:
    return {"type": type(tx).__name__, "txid": tx_hash(tx).hex(), "delta": delta,
            "tx": to_json(tx)}
