"""An account's history, as `pwallet history` shows it, read from a chain store.

Owns `history_rows` (`node.chain.views.history_view` is its form for the
CLIs and the control socket): every change to the account's balance, in chain order,
then the queued transactions.

- Transactions, replayed: transfers, registrations (the bond), jobs (the
  deposit), verdicts (the verifier's fee), tabs and claims. For tabs it
  follows the ledger's own arithmetic (`ledger.tabrules.claim_outcome`): a
  claim's row says what it paid the account's lanes or refunded the
  account as a tab's client. To the client, a claim that paid no lane
  anything and gave it coins back (an unused tab closed) is a ``TabRefund``,
  not a ``Claim``: nothing was bought.
- What a block's rules paid without a transaction, read from the block's
  undo record: ``Reward`` (a receipt of the account's node whose window
  closed: minted, or out of its job's deposit), ``TabExpired`` (an expired
  tab's rest back to its client), ``JobRefund`` (a finished job's unspent
  deposit back to its creator).

Each block's rows are checked against the balance change the block really
made (its undo record against the state after it); a difference the rows
do not explain becomes an ``Other`` row, so the rows always add up to the
balance.
"""

from __future__ import annotations

from typing import Any

from ledger.codec import to_json
from ledger.state import ACCOUNT, JOB, PENDING, Overlay
from ledger.tab import Claim, OpenTab, TabRecord, locked, new_tab_record
from ledger.tabrules import claim_outcome
from ledger.types import (
    UNAVAILABLE, Job, Register, Transfer, Verdict, format_coins, tx_hash,
)

__all__ = ["balance_of", "history_rows"]


def history_rows(db: Any, account: bytes) -> list[dict]:
    """The rows of ``account``'s history in ``db`` (a `ledger.chaindb.ChainDB`).

    Returns:
        Dicts of ``height`` (None: queued), ``confirmations`` (blocks from
        its block to the tip, itself included; 0 when queued), ``type``,
        ``txid`` (a Reward's: its receipt's id; a TabExpired's: the tab's;
        a JobRefund's: the job's), ``amount_units`` (the change to the account's
        balance in base units; None for a queued claim, whose effect
        depends on the claims before it), ``amount`` (``amount_units`` in coins),
        ``counterparty`` (the other side, when there is one: an address,
        or "minted") and ``tx`` (a transaction's JSON form).
    """
    book = _Book(account, Overlay(db.state).params())
    rows = book.genesis(db.genesis)
    after = balance_of(db, account)
    per_block = []
    for block in db.iter_blocks():
        height = block.header.height
        if height == 0:
            continue
        block_rows = book.prelude(height, db.undo_at(height))
        block_rows += [row for tx in block.txs if (row := book.apply(tx)) is not None]
        per_block.append((height, block_rows))
    for height, block_rows in reversed(per_block):  # the true change, from the undo records
        before = _balance_before(db, account, height, after)
        rest = (after - before) - sum(r["amount_units"] for r in block_rows)
        if rest:
            block_rows.append(_other(book, height, rest))
        after = before
    for height, block_rows in per_block:
        rows += [dict(height=height, **row) for row in block_rows]
    rows += [dict(height=None, **row) for tx in db.mempool()
             if (row := book.queued(tx)) is not None]
    for row in rows:
        row["confirmations"] = 0 if row["height"] is None else db.height - row["height"] + 1
        row["amount"] = None if row["amount_units"] is None else _signed(row["amount_units"])
    return rows


def balance_of(db: Any, account: bytes) -> int:
    record = db.state.get(ACCOUNT + account)
    return record.balance if record else 0


def _balance_before(db: Any, account: bytes, height: int, after: int) -> int:
    undo = db.undo_at(height)
    if ACCOUNT + account not in undo:
        return after
    record = undo[ACCOUNT + account]
    return record.balance if record else 0


def _signed(units: int) -> str:
    return ("-" if units < 0 else "") + format_coins(abs(units))


def _other(book: _Book, height: int, rest: int) -> dict:
    """A block's balance change no row explains: a finished job's refund, or else "Other"."""
    refunded = book.refunds.pop(height, None)
    if refunded is not None:
        return {"type": "JobRefund", "txid": refunded.hex(), "amount_units": rest,
                "counterparty": None, "tx": {"job": refunded.hex()}}
    return {"type": "Other", "txid": "", "amount_units": rest, "counterparty": None, "tx": {}}


class _Book:
    """Replays the chain for one account: its tabs, its nodes' lanes, the jobs it posted."""

    def __init__(self, account: bytes, params: Any):
        self.account, self.params = account, params
        self.owner: dict[bytes, bytes] = {}  # node key -> its account, as registered so far
        self.tabs: dict[bytes, TabRecord] = {}  # every open tab (its claims may pay us)
        self.creators: dict[bytes, bytes] = {}  # job id -> its creator
        self.refunds: dict[int, bytes] = {}  # height -> a job of ours its record changed at

    def genesis(self, genesis) -> list[dict]:
        rows = [{"height": 0, "type": "Allocation", "txid": "genesis", "amount_units": a.amount,
                 "counterparty": None, "tx": to_json(a)}
                for a in genesis.allocations if a.account == self.account]
        for tx in (*genesis.registrations, *genesis.jobs):
            if (row := self.apply(tx)) is not None:
                rows.append(dict(height=0, **row))
        return rows

    def prelude(self, height: int, undo: dict[bytes, Any]) -> list[dict]:
        """What block ``height``'s rules paid the account before its transactions."""
        rows = []
        for tab_id, record in list(self.tabs.items()):
            if record.expiry_height < height:
                del self.tabs[tab_id]
                if record.client == self.account and locked(record):
                    rows.append({"type": "TabExpired", "txid": tab_id.hex(),
                                 "amount_units": locked(record), "counterparty": None,
                                 "tx": {"tab": tab_id.hex()}})
        for key, old in undo.items():
            # Written by this block while its window had closed: finalized, so paid.
            if key[:1] == PENDING and old is not None and old.account == self.account \
                    and old.final_height <= height:
                payer = self.creators.get(old.job_id)
                rows.append({"type": "Reward", "txid": key[1:].hex(),
                             "amount_units": self.params.reward,
                             "counterparty": payer.hex() if payer else "minted",
                             "tx": {"receipt": key[1:].hex(), "job": old.job_id.hex()}})
            elif key[:1] == JOB and old is not None and old.job.creator == self.account \
                    and old.escrow and old.step >= old.job.steps:
                self.refunds[height] = key[1:]
        return rows

    def apply(self, tx) -> dict | None:
        """Follow ``tx`` (in a block); its row when it moved the account's coins."""
        if isinstance(tx, Register):
            self.owner[tx.node_key] = tx.account
            return _row(tx, -tx.bond, None) if tx.account == self.account else None
        if isinstance(tx, Transfer):
            if self.account not in (tx.sender, tx.recipient):
                return None
            other = tx.sender if tx.recipient == self.account else tx.recipient
            return _row(tx, (tx.amount if tx.recipient == self.account else 0)
                        - (tx.amount if tx.sender == self.account else 0), other.hex())
        if isinstance(tx, Job):
            self.creators[tx_hash(tx)] = tx.creator if tx.deposit else None
            return _row(tx, -tx.deposit, None) if tx.creator == self.account else None
        if isinstance(tx, Verdict):
            if self.owner.get(tx.verifier) != self.account or tx.reason == UNAVAILABLE:
                return None
            return _row(tx, self.params.verify_fee, None)
        if isinstance(tx, OpenTab):
            payees = tuple(self.owner.get(lane.node_key, b"") for lane in tx.lanes)
            self.tabs[tx_hash(tx)] = new_tab_record(tx, payees)
            return _row(tx, -sum(lane.cap for lane in tx.lanes), None) \
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
        row = _row(tx, earned + (refund if mine else 0),
                   (self.owner.get(tx.node_key, b"") if mine else record.client).hex())
        if mine and refund and not any(pay):
            row["type"] = "TabRefund"
        return row

    def queued(self, tx) -> dict | None:
        """A mempool transaction's row (a claim's effect is not known until it lands)."""
        if isinstance(tx, Claim):
            record = self.tabs.get(tx.voucher.tab_id)
            ours = (record is not None and (record.client == self.account
                                            or self.account in record.payees))
            return _row(tx, None, None) if ours or self.owner.get(tx.node_key) == self.account \
                else None
        if isinstance(tx, Verdict):
            return None  # its fee depends on the verdict being accepted in time
        saved = dict(self.owner), dict(self.tabs), dict(self.creators)
        try:
            return self.apply(tx)
        finally:
            self.owner, self.tabs, self.creators = saved


def _row(tx, delta: int | None, counterparty: str | None) -> dict:
    return {"type": type(tx).__name__, "txid": tx_hash(tx).hex(), "amount_units": delta,
            "counterparty": counterparty, "tx": to_json(tx)}

