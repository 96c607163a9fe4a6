"""A serving node's payments: tabs it admits, vouchers it keeps, claims it makes.

Owns `Cashier` (specs/network.md section 9.6), which the inference server
asks at these moments:

- a paid request arrives (`vet`), before it gets a slot or a seat: the pure
  checks (`check_tab`, in `precheck`), the chain's (funds, lanes, expiry, an
  unused nonce: `TabLedger.vet`, the mempool applied) and this server's
  serving window. A tab whose nonce is ahead waits ``gap_wait_s`` for its
  predecessors, holding nothing; an unfunded one is refused at once;
- the session opens (`open`): the node's mempool admits the tab and gossips
  it, before the server accepts; a lane this server ended is never reopened;
- each step (`take`, then `delivered` or `drop`): the tab must still be in a
  block or on its way into one, the height below its last served height
  (`node.wire.serve_until`: `CLAIM_MARGIN` blocks before expiry, room for the
  claim to land), and the voucher must pay what the credit does not
  (`Bill.take`);
- a lane's last session ends (`release`): the server submits
  ``Claim(latest voucher, close)`` at once and again until the lane is
  closed on chain or the tab expires (`run`).

The loop (`run`) ends a lane's sessions (``on_end``) as soon as its tab
cannot pay: dropped by the chain (a double spend that lost), not in a block
``include_within`` blocks after admission, or at its last served height,
where the claim follows at once. A lane that expires unclaimed, or with
positions served beyond its last voucher, is logged with what was lost.

The latest voucher of each lane is kept in ``folder`` (one file per tab,
written at most every ``poll_s`` and when the lane ends): a restarted server
still claims what it was owed.

The chain is reached through ``ledger``, a `TabLedger`: ``chain_id``,
``await vet(tab) -> height``, ``await admit(tx) -> txid`` (the node's
`TxGossip.submit`) and ``await lookup(tab_id, txids) -> (height, TabRecord |
None, queued txids)``; the node's is `node.chain.tabs.ChainTabs` (node.serve
does not import node.chain).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Protocol, runtime_checkable

import trio

from ledger.codec import U32, MaxLen, decode, encode, wire
from ledger.crypto import SigningKey
from ledger.errors import BadNonce, DecodeError, ValidationError
from ledger.tab import Claim, OpenTab, TabRecord, Voucher
from ledger.types import ZERO_SIG, sign, tx_hash
from node.serve.billing import Bill, PaymentError, TabRefused, check_tab
from node.wire import CLAIM_MARGIN, TAB_ENDS, TAB_LANDING, OpenSession, serve_until

log = logging.getLogger(__name__)

#: Blocks a tab may take to reach a block after a server admitted it (D, specs 9.6).
INCLUDE_WITHIN = TAB_LANDING


@runtime_checkable
class TabLedger(Protocol):
    """The chain as a `Cashier` uses it: all it asks of the node's chain."""

    @property
    def chain_id(self) -> str:
        """The chain the node follows (a tab must be for it)."""
        ...

    async def vet(self, tab: OpenTab) -> int:
        """Whether the chain would take ``tab`` now or once its predecessors land: the height
        (funds, lanes, expiry, an unused nonce, the mempool applied; admits nothing).

        Raises:
            ValidationError: it cannot land (a `BadNonce` that is ``ahead``
                may pass later).
        """
        ...

    async def admit(self, tx: OpenTab | Claim) -> bytes:
        """Admit ``tx`` to the node's mempool and gossip it; its id.

        Raises:
            ValidationError: the chain refuses it (a `BadNonce` that is
                ``ahead`` may pass later).
        """
        ...

    async def lookup(self, tab_id: bytes, txids: list[bytes]
                     ) -> tuple[int, TabRecord | None, frozenset[bytes]]:
        """(the height, the tab's record or None, which of ``txids`` are in the mempool)."""
        ...


@wire(84)
@dataclass(frozen=True, slots=True)
class KeptTab:
    """What a server keeps of a lane on disk: the tab, its lane, the latest voucher."""

    tab: OpenTab
    lane: U32
    voucher: Annotated[bytes, MaxLen(1024)]  # encoded `Voucher` (b"": none yet)
    closing: bool


@dataclass(slots=True)
class _Lane:
    """A lane this server took: its bill and where its tab and claim stand."""

    bill: Bill
    since: int  # the height when this server admitted the tab
    included: bool = False
    dead: str | None = None  # why the tab will never pay (its sessions end)
    closing: bool = False  # the lane's sessions ended: claim it
    claim_id: bytes | None = None
    dirty: bool = True  # the kept file is behind
    done: bool = False


@dataclass
class CashierStats:
    admitted: int = 0
    refused: int = 0
    claims: int = 0
    settled: int = 0
    expired_unclaimed: int = 0  # lanes whose tab expired before their claim landed
    lost: int = 0  # base units those lanes had served
    claim_ids: list[str] = field(default_factory=list)


class Cashier:
    """Admits a serving node's tabs, keeps its vouchers and claims them.

    Args:
        ledger: the node's chain.
        node_key: the node key its lanes pay and its claims are signed with.
        ask: its price, base units per position per layer.
        folder: where the latest vouchers are kept (None: memory only).
        include_within: blocks a tab may take to reach a block.
        gap_wait_s: seconds a tab whose nonce is ahead waits for its predecessors.
        poll_s: seconds between looks at the chain.
    """

    def __init__(self, ledger: TabLedger, node_key: SigningKey, ask: int,
                 folder: Path | None = None, *, include_within: int = INCLUDE_WITHIN,
                 gap_wait_s: float = 5.0, poll_s: float = 0.5,
                 report: Callable[[str], None] = lambda line: None):
        self.ledger, self.node_key, self.ask, self.folder = ledger, node_key, ask, folder
        self.include_within, self.gap_wait_s, self.poll_s = include_within, gap_wait_s, poll_s
        self.report = report
        self.lanes: dict[bytes, _Lane] = {}
        # Lanes this server served and ended, by tab id: their expiry. A tab is never
        # served again here (attack note: reopening an ended lane would start a new
        # bill, and a new credit, each time).
        self.ended: dict[bytes, int] = {}
        self._opening: dict[bytes, trio.Lock] = {}  # one open at a time per tab
        self.stats = CashierStats()
        self.height = 0
        #: Ends the open sessions of a tab, with the reason (the inference server sets it).
        self.on_end: Callable[[bytes, str], None] = lambda tab_id, why: None

    # -- sessions ------------------------------------------------------------------------

    def precheck(self, request: OpenSession, layers: int) -> tuple[OpenTab, int] | None:
        """The tab and lane of ``request`` (None: a free session), checked without the chain.

        Raises:
            PaymentError: a free session where this server asks a price, or a bad tab.
        """
        if not request.tab:
            if self.ask > 0:
                raise PaymentError(f"this server asks {self.ask} base units per position per "
                                   "layer: open a tab (pwallet infer --max-price)")
            return None
        return check_tab(request.tab, chain_id=self.ledger.chain_id,
                         node_key=self.node_key.public, bid=request.bid, ask=self.ask,
                         layers=layers)

    async def vet(self, tab: OpenTab) -> None:
        """Before a paid request gets a slot or a seat: would the chain take ``tab``?

        A known lane's tab passes (its `open` decides). A tab whose nonce is
        ahead (`BadNonce.ahead`) is asked again for ``gap_wait_s``: a
        client's failover tab may arrive before its first. Nothing is held
        meanwhile.

        Raises:
            TabRefused: the chain refuses it (funds, lanes, expiry, a used
                nonce), or it is too near its expiry for this server to serve
                and claim (a `PaymentError`).
        """
        if _tab_id(tab) in self.lanes:
            return
        self._not_ended(tab)
        height = await self._chain_takes(self.ledger.vet, tab)
        if height + 1 >= serve_until(tab.expiry_height):
            self.stats.refused += 1
            raise TabRefused(f"it expires at height {tab.expiry_height}, and this server serves "
                             f"a tab only until {CLAIM_MARGIN} blocks before (room for its "
                             f"claim); the chain is at {height}")

    async def open(self, tab: OpenTab, lane: int, bid: int) -> Bill:
        """The bill of a session on ``tab``'s ``lane``, once the node's mempool admitted the tab.

        Raises:
            PaymentError: the chain refuses the tab (`TabRefused`), its lane
                was settled or its tab dropped, or the bid differs from the
                lane's earlier one.
        """
        tab_id = _tab_id(tab)
        try:
            async with self._opening.setdefault(tab_id, trio.Lock()):  # two opens: one bill
                known = self.lanes.get(tab_id) or await self._new_lane(tab, lane, bid)
        finally:
            self._opening.pop(tab_id, None)
        if known.closing or known.dead:
            raise PaymentError(known.dead or "this tab's lane was settled already")
        if known.bill.bid != bid:
            raise PaymentError(f"this lane was opened at a bid of {known.bill.bid}, not {bid}")
        known.bill.sessions += 1
        return known.bill

    async def _new_lane(self, tab: OpenTab, lane: int, bid: int) -> _Lane:
        self._not_ended(tab)
        height, record = await self._admit(tab)
        if record is not None and record.closed[lane]:
            self.ended[_tab_id(tab)] = tab.expiry_height
            raise PaymentError("this tab's lane was closed on chain already")
        self.stats.admitted += 1
        new = self.lanes[_tab_id(tab)] = _Lane(Bill.of(tab, lane, bid), height)
        return new

    def take(self, bill: Bill, voucher: bytes, positions: int, layers: int) -> int:
        """Check a step's voucher (`Bill.take`), that its tab is still in a block or on its
        way into one, and that the chain is below the tab's last served height, before the
        step runs.

        Returns:
            The step's charge (for `delivered` or `drop`).

        Raises:
            PaymentError: the tab will not pay (see the module docstring), or
                the voucher does not (`Bill.take`).
        """
        lane = self.lanes.get(bill.tab_id)
        if lane is not None and lane.dead:
            raise PaymentError(lane.dead)
        if self.height >= serve_until(bill.tab.expiry_height):
            raise PaymentError(_ends(bill, self.height))
        return bill.take(voucher, positions, layers)

    def delivered(self, bill: Bill, step: int) -> None:
        """A step's outputs left: count it owed, then check the voucher's signature.

        After the write, so the check is off the decode's critical path; a
        forged voucher ends the session at its next step (`Bill.take`). A
        good one is kept (written at the next poll).
        """
        bill.deliver(step)
        if bill.pending is not None and bill.verify_pending():
            lane = self.lanes.get(bill.tab_id)
            if lane is not None:
                lane.dirty = True

    def drop(self, bill: Bill, step: int) -> None:
        """A step taken never delivered (it failed, or its session ended): not owed."""
        bill.drop(step)

    async def release(self, bill: Bill) -> bytes | None:
        """A session of the bill's lane ended; the last one's claim is submitted now.

        Returns:
            The claim's id when submitted, else None (none to make, or the
            chain refused it for now: `run` retries).
        """
        lane = self.lanes.get(bill.tab_id)
        bill.sessions -= 1
        if lane is None or bill.sessions > 0 or lane.closing:
            return None
        lane.closing, lane.dirty = True, True
        bill.verify_pending()  # the last step's voucher, if its check had not run yet
        if bill.voucher is None:  # nothing was paid: the lane's cap goes back at expiry
            if bill.owed:
                self.stats.lost += bill.owed
                log.warning("tab %s: %d base units served on credit, no voucher came",
                            bill.tab_id.hex()[:16], bill.owed)
            lane.done = True
            self._forget(bill.tab_id)
            return None
        self._keep(lane)
        return await self._claim(lane)

    # -- the loop ------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Cashier] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Load the kept lanes, then watch tabs and claim, every ``poll_s``, until cancelled."""
        self._load()
        task_status.started(self)
        while True:
            for tab_id, lane in list(self.lanes.items()):
                try:
                    if not lane.done:
                        await self._watch(lane)
                except ValidationError as exc:  # refused for now: try again
                    log.info("claim of tab %s refused for now: %s", tab_id.hex()[:16], exc)
                if lane.dirty and not lane.done:
                    self._keep(lane)
                if lane.done:
                    self.lanes.pop(tab_id, None)
                    self.ended[tab_id] = lane.bill.tab.expiry_height
                    self._forget(tab_id)
            for tab_id, expiry in list(self.ended.items()):
                if expiry < self.height:  # expired: the chain refuses it anyway
                    del self.ended[tab_id]
            await trio.sleep(self.poll_s)

    def _not_ended(self, tab: OpenTab) -> None:
        """Raises `PaymentError` if this server served ``tab``'s lane and ended it already."""
        if _tab_id(tab) in self.ended:
            raise PaymentError("this tab's lane was served and ended here already: "
                               "open a new tab")

    def status(self) -> dict:
        """What `pnode status` shows of the payments."""
        lanes = list(self.lanes.values())
        return {"ask": self.ask, "tabs_admitted": self.stats.admitted,
                "tabs_refused": self.stats.refused, "open_lanes": len(lanes),
                "owed": sum(x.bill.owed for x in lanes),
                "vouched": sum(x.bill.paid for x in lanes),
                "claims": self.stats.claims, "settled": self.stats.settled,
                "expired_unclaimed": self.stats.expired_unclaimed, "lost": self.stats.lost,
                "claim_ids": self.stats.claim_ids[-8:]}

    async def _watch(self, lane: _Lane) -> None:
        bill = lane.bill
        ids = [bill.tab_id] + ([lane.claim_id] if lane.claim_id else [])
        height, record, queued = await self.ledger.lookup(bill.tab_id, ids)
        self.height = height
        lane.since = lane.since or height  # a lane kept from an earlier run
        if height > bill.tab.expiry_height:
            lane.done = True  # expired: what was not claimed went back to the client
            self._expired(lane)
            return
        if record is not None:
            lane.included = True
        elif not lane.included and not lane.dead:
            if bill.tab_id not in queued:
                lane.dead = "the chain dropped the session's tab (a conflicting transaction won)"
            elif height - lane.since > self.include_within:
                lane.dead = (f"the session's tab is not in a block {self.include_within} blocks "
                             "after it was admitted")
        if not lane.dead and height >= serve_until(bill.tab.expiry_height):
            lane.dead = _ends(bill, height)
        if lane.dead and bill.sessions > 0:
            self.on_end(bill.tab_id, lane.dead)  # at once: their release claims the lane
        if lane.dead and not lane.included:
            lane.done = bill.sessions == 0
            return
        if not lane.closing:
            return
        if (record is None and lane.included) or (record and record.closed[bill.lane]):
            lane.done = True  # closed (the whole tab, once every lane is)
            self.stats.settled += 1
            self.report(f"tab {bill.tab_id.hex()[:16]}.. settled: {bill.paid} base units "
                        "vouched for this lane")
        elif record is not None and lane.claim_id not in queued:
            await self._claim(lane)

    def _expired(self, lane: _Lane) -> None:
        """A lane's tab expired before its lane closed on chain: say what was lost."""
        bill = lane.bill
        if not bill.paid and not bill.owed:
            return  # nothing served: nothing lost
        self.stats.expired_unclaimed += 1
        self.stats.lost += bill.owed
        claim = f"claim {lane.claim_id.hex()[:16]}.." if lane.claim_id else "no claim made"
        line = (f"tab {bill.tab_id.hex()[:16]}.. expired at height {bill.tab.expiry_height} "
                f"before its lane closed on chain: {bill.owed} base units served, "
                f"{bill.paid} vouched, {claim} (what did not land went back to the client)")
        log.warning(line)
        self.report(line)

    async def _claim(self, lane: _Lane) -> bytes | None:
        bill = lane.bill
        if bill.voucher is None:  # nothing vouched: nothing to claim (the cap comes back later)
            return None
        claim = sign(Claim(bill.tab.chain_id, self.node_key.public, bill.voucher, True,
                           ZERO_SIG), self.node_key)
        try:
            lane.claim_id = await self.ledger.admit(claim)
        except ValidationError as exc:  # e.g. the tab is not in a block yet: `run` retries
            log.info("claim of tab %s waits: %s", bill.tab_id.hex()[:16], exc)
            return None
        self.stats.claims += 1
        self.stats.claim_ids.append(lane.claim_id.hex())
        return lane.claim_id

    async def _admit(self, tab: OpenTab) -> tuple[int, TabRecord | None]:
        """Admit the tab to the node's mempool; the height then, and its record if it is
        in a block.

        Raises:
            TabRefused: the chain refuses it (a `PaymentError`), unless it is
                in a block already (another lane's server admitted it).
        """
        try:
            await self._chain_takes(self.ledger.admit, tab)
        except TabRefused:
            height, record, _ = await self.ledger.lookup(_tab_id(tab), [])
            if record is None:
                raise
            self.stats.refused -= 1  # in a block already: taken after all
            return height, record
        height, record, _ = await self.ledger.lookup(_tab_id(tab), [])
        return height, record

    async def _chain_takes(self, ask, tab: OpenTab):
        """``await ask(tab)`` (`TabLedger.vet` or ``admit``), asked again for ``gap_wait_s``
        while the tab's nonce is ahead (`BadNonce.ahead`): a client's failover tab may
        arrive before its first.

        Raises:
            TabRefused: the chain refuses it, or its nonce is still ahead at the end.
        """
        give_up = trio.current_time() + self.gap_wait_s
        while True:
            try:
                return await ask(tab)
            except BadNonce as exc:
                if exc.ahead and trio.current_time() < give_up:
                    await trio.sleep(0.25)  # its predecessors may still be on their way
                    continue
                self.stats.refused += 1
                raise TabRefused(str(exc)) from None
            except ValidationError as exc:
                self.stats.refused += 1
                raise TabRefused(f"{type(exc).__name__}: {exc}") from None

    # -- the kept files ------------------------------------------------------------------

    def _path(self, tab_id: bytes) -> Path | None:
        return None if self.folder is None else self.folder / f"{tab_id.hex()}.tab"

    def _keep(self, lane: _Lane) -> None:
        lane.dirty = False
        path = self._path(lane.bill.tab_id)
        if path is None or lane.bill.voucher is None:
            return
        bill = lane.bill
        data = encode(KeptTab(bill.tab, bill.lane, encode(bill.voucher), lane.closing))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            with open(tmp, "wb") as f:
                f.write(data)
                if lane.closing:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:  # a full or read-only disk: try again at the next poll
            lane.dirty = True
            log.warning("tab %s: its voucher could not be kept: %s", bill.tab_id.hex()[:16],
                        exc)

    def _forget(self, tab_id: bytes) -> None:
        path = self._path(tab_id)
        if path is not None:
            path.unlink(missing_ok=True)

    def _load(self) -> None:
        """Lanes kept by an earlier run of this node: all to claim (their sessions are gone)."""
        if self.folder is None or not self.folder.is_dir():
            return
        for path in sorted(self.folder.glob("*.tab")):
            try:
                kept = decode(path.read_bytes(), KeptTab)
                bill = Bill.of(kept.tab, kept.lane, 0)
                bill.voucher = decode(kept.voucher, Voucher)
            except (DecodeError, OSError, IndexError) as exc:
                log.warning("kept tab %s unreadable, skipped: %s", path.name, exc)
                continue
            self.lanes[bill.tab_id] = _Lane(bill, 0, closing=True, dirty=False)
        if self.lanes:
            self.report(f"claiming {len(self.lanes)} tab(s) kept from an earlier run")


def _tab_id(tab: OpenTab) -> bytes:
    return tx_hash(tab)


def _ends(bill: Bill, height: int) -> str:
    """Why a tab at its last served height serves no more steps (a `TAB_ENDS` reason)."""
    return (f"{TAB_ENDS}: tab {bill.tab_id.hex()[:16]}.. expires at height "
            f"{bill.tab.expiry_height} and is served until {serve_until(bill.tab.expiry_height)} "
            f"(room for its claim); the chain is at {height}: go on with a new tab")
