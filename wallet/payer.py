"""The client's side of paid sessions: tabs it opens, vouchers it signs, what it owes.

Owns `Payer` (one per generation) and `ClientTab` (one tab: the route's, or
a failover's or a spot check's), specs/network.md section 9.6:

- `Payer.open_tab` locks, for each server of the hops given, its ask x
  layers x the session's positions (`node.wire.charge`, the servers' rule
  too) x ``margin`` (the room a replay after a failover needs), in one
  `OpenTab` signed by the wallet key, with the next nonce; the servers
  admit it to their mempools, no local node needed;
- a tab expires ``blocks`` + `node.wire.TAB_LANDING` after the chain's
  height when it is opened (asked of ``height_now`` then, not at start-up);
- a step sent to a hop carries the tab's latest `Voucher`: the cumulative
  amount owed to every lane for the positions delivered before it, and,
  for a lane the step runs through, what the step brings beyond the lane's
  credit (`node.wire.credit`) paid ahead;
- `ClientTab.deliver` counts a step's positions once its outputs came back
  (the last hop's answer delivers every hop of a pushed chain), exactly as
  the server counts them (replays too), so the voucher is never behind;
- `need` is the preflight: what a route would lock, before anything opens.

No rule lives here: the chain checks the tab, the servers the vouchers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import trio

from ledger.codec import encode
from ledger.crypto import SigningKey
from ledger.tab import MAX_LANES, MAX_TAB, Lane, OpenTab, Voucher, sign_voucher
from ledger.types import ZERO_SIG, sign, tx_hash
from node.wire import TAB_LANDING, ServerInfo, charge, credit, serve_until
from wallet.errors import WalletError
from wallet.client.route import Hop

__all__ = ["ClientTab", "InsufficientFunds", "PaymentRefused", "Payer", "need"]

#: What a lane's cap holds beyond the session's own positions: a failover's replay.
MARGIN = 2.0
#: Blocks before its tab's last served height (`node.wire.serve_until`) at which a hop
#: moves to a new tab: its old session is settled, so its server is paid for all of it.
RENEW_AHEAD = 4


class InsufficientFunds(WalletError):
    """The wallet cannot lock what the route would need (exit 2 before any step)."""


class PaymentRefused(WalletError):
    """A paid route cannot be paid as asked (no node key announced, too many lanes)."""


def need(hops: Sequence[Hop], servers: Mapping[str, ServerInfo], positions: int,
         margin: float = MARGIN, floor: int = 0) -> int:
    """What a tab for ``hops`` locks: every hop's cost at its ask (at least ``floor``),
    times ``margin``."""
    return sum(math.ceil(charge(positions, h.end - h.start, max(servers[h.peer_id].price, floor))
                         * margin) for h in hops)


@dataclass(slots=True)
class ClientTab:
    """One tab the client opened: its lanes, and what it owes each so far."""

    tab: OpenTab
    key: SigningKey
    lane_of: dict[str, int]  # peer id -> lane index
    bids: dict[str, int]  # peer id -> its bid (its ask)
    amounts: list[int] = field(default_factory=list)  # delivered, per lane
    accepted: bool = False  # a server took a session on it (so admitted it to a mempool)
    _signed: bytes = b""
    _signed_for: tuple[int, ...] = ()

    @property
    def tab_id(self) -> bytes:
        return tx_hash(self.tab)

    def deliver(self, hop: Hop, positions: int) -> None:
        """Count ``positions`` delivered by ``hop``'s server (its outputs came back)."""
        lane = self.lane_of[hop.peer_id]
        self.amounts[lane] += charge(positions, hop.end - hop.start, self.bids[hop.peer_id])

    def owed(self, peer_id: str) -> int:
        return self.amounts[self.lane_of[peer_id]]

    def voucher(self, through: Iterable[tuple[Hop, int]] = ()) -> bytes:
        """The encoded, signed voucher for a step (signed again only when the amounts grew).

        Args:
            through: (hop, positions) of each hop of this tab the step will
                run on: the voucher pays ahead what the step brings beyond
                each lane's credit (the servers' rule, `node.serve.billing`).
                Empty: what was delivered (a `Settle`'s).

        The amounts never go below an earlier voucher's (a step paid ahead
        that never ran stays paid: a server refuses shrinking amounts).
        """
        ahead = list(self.amounts)
        running: dict[int, int] = {}
        for hop, positions in through:
            if hop.peer_id not in self.lane_of:
                continue  # a free hop of a route that pays others
            lane, bid = self.lane_of[hop.peer_id], self.bids[hop.peer_id]
            layers = hop.end - hop.start
            running[lane] = running.get(lane, 0) + charge(positions, layers, bid)
            ahead[lane] = max(ahead[lane],
                              self.amounts[lane] + running[lane] - credit(layers, bid))
        amounts = tuple(max(a, b) for a, b in zip(ahead, self._signed_for or ahead))
        if amounts != self._signed_for or not self._signed:
            v = Voucher(self.tab.chain_id, self.tab_id, amounts, ZERO_SIG)
            self._signed = encode(sign_voucher(self.key, v))
            self._signed_for = amounts
        return self._signed


class Payer:
    """The tabs of one generation, from one wallet key.

    Args:
        key: the wallet key the tabs lock coins of.
        chain_id: the chain the servers follow.
        nonce: the wallet's next nonce (each tab takes one).
        height: the chain's height now (a later one comes with each session).
        blocks: a tab's life: it expires ``blocks`` (+ `TAB_LANDING`, the room
            to land) after the chain's height when it is opened.
        max_price: the most paid per position per layer (servers asking more
            are not routed through).
        balance: the wallet's balance (base units), for the preflight.
        floor: bid at least this (at most ``max_price``), to free servers too:
            a higher bid goes first in a server's queue and waiting room.
        margin: the room each lane's cap leaves for replays (`MARGIN`).
        height_now: asks the chain's height (blocking: it runs in a worker
            thread), before each tab is opened (`date`); None: the greatest
            height seen (``height``, then `saw_height`).
    """

    def __init__(self, key: SigningKey, chain_id: str, nonce: int, height: int, max_price: int,
                 *, blocks: int = 120, balance: int = 0, margin: float = MARGIN,
                 floor: int = 0, height_now: Callable[[], int] | None = None):
        self.key, self.chain_id, self.nonce, self.balance = key, chain_id, nonce, balance
        self.height, self.blocks, self.max_price, self.margin = height, blocks, max_price, margin
        self.height_now = height_now
        self.floor = min(floor, max_price)
        self.tabs: list[ClientTab] = []
        self.raised: dict[str, int] = {}  # peer id -> the bid a full server asked for

    def outbid(self, peer_id: str, min_bid: int) -> bool:
        """A full server admits ``min_bid`` or more: bid that from now on, if within
        ``max_price`` and above the bid already raised to. False: the client cannot."""
        if min_bid <= self.raised.get(peer_id, 0) or min_bid > self.max_price:
            return False
        self.raised[peer_id] = min_bid
        return True

    @property
    def expiry_height(self) -> int:
        """The expiry of the next tab: ``blocks`` + `TAB_LANDING` after the latest height
        seen (at most what the chain takes of a tab landing in the next block)."""
        return self.height + min(self.blocks + TAB_LANDING, MAX_TAB + 1)

    async def date(self) -> None:
        """Learn the chain's height now, before a tab is opened (``height_now``).

        A failure to ask keeps the height last seen (the server's chain then
        refuses a tab dated too early, and says so).
        """
        if self.height_now is None:
            return
        try:
            self.saw_height(await trio.to_thread.run_sync(self.height_now))
        except Exception:  # e.g. the node stopped: the height seen stands
            pass

    def due(self, tab: ClientTab) -> bool:
        """Whether ``tab`` is `RENEW_AHEAD` blocks or less from its last served height."""
        return self.height >= serve_until(tab.tab.expiry_height) - RENEW_AHEAD

    def saw_height(self, height: int) -> None:
        """A server said its chain is at ``height`` (`SessionAccepted`): date tabs from it."""
        self.height = max(self.height, height)

    def open_tab(self, hops: Sequence[Hop], servers: Mapping[str, ServerInfo],
                 positions: int) -> ClientTab | None:
        """A signed tab with one lane per paid server of ``hops``, capped for ``positions``
        each (None: every one of them is free).

        Raises:
            PaymentRefused: a server announced no node key, or more than
                `MAX_LANES` servers.
        """
        caps: dict[bytes, int] = {}
        lane_of, bids = {}, {}
        for hop in hops:
            info = servers[hop.peer_id]
            bid = max(info.price, self.raised.get(hop.peer_id, 0), self.floor)
            if bid == 0:
                continue  # a free server, and no tip: its session is free
            if info.node_key == bytes(32):
                raise PaymentRefused(f"{hop.peer_id} announces no node key: it cannot be paid")
            if info.node_key not in caps and len(caps) == MAX_LANES:
                raise PaymentRefused(f"a route of more than {MAX_LANES} servers cannot be paid")
            caps[info.node_key] = caps.get(info.node_key, 0) + math.ceil(
                charge(positions, hop.end - hop.start, bid) * self.margin)
            lane_of[hop.peer_id] = list(caps).index(info.node_key)
            bids[hop.peer_id] = bid
        if not caps:
            return None
        lanes = tuple(Lane(k, cap) for k, cap in caps.items())
        tab = sign(OpenTab(self.chain_id, self.key.public, os.urandom(32), lanes,
                           self.expiry_height, self.nonce, ZERO_SIG), self.key)
        self.nonce += 1
        out = ClientTab(tab, self.key, lane_of, bids, [0] * len(lanes))
        self.tabs.append(out)
        return out

    def retract(self, tab: ClientTab | None) -> None:
        """Forget the latest tab if no server accepted a session on it (a `Busy` comes
        before a server admits the tab): its nonce is the next tab's."""
        if tab is not None and not tab.accepted and self.tabs and self.tabs[-1] is tab:
            self.tabs.pop()
            self.nonce -= 1
