"""The client's side of paid sessions: tabs it opens, vouchers it signs, what it owes.

Owns `Payer` (one per generation) and `ClientTab` (one tab: the route's, or
a failover's or a spot check's), specs/network.md section 9.6:

- `Payer.open_tab` locks, for each server of the hops given, its ask x
  layers x the session's positions (`node.wire.charge`, the servers' rule
  too) x ``margin`` (the room a replay after a failover needs), in one
  `OpenTab` signed by the wallet key, with the next nonce; the servers
  admit it to their mempools, no local node needed;
- a step sent to a hop carries the tab's latest `Voucher`: the cumulative
  amount owed to every lane for the positions delivered before it (pay
  after delivery: a server gives one step of credit);
- `ClientTab.deliver` counts a step's positions once its outputs came back
  (the last hop's answer delivers every hop of a pushed chain), exactly as
  the server counts them (replays too), so the voucher is never behind;
- `need` is the preflight: what a route would lock, before anything opens.

No rule lives here: the chain checks the tab, the servers the vouchers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ledger.codec import encode
from ledger.crypto import SigningKey
from ledger.tab import MAX_LANES, Lane, OpenTab, Voucher, sign_voucher
from ledger.types import ZERO_SIG, sign, tx_hash
from node.wire import ServerInfo, charge
from wallet.errors import WalletError
from wallet.client.route import Hop

__all__ = ["ClientTab", "InsufficientFunds", "PaymentRefused", "Payer", "need"]

#: What a lane's cap holds beyond the session's own positions: a failover's replay.
MARGIN = 2.0


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
    amounts: list[int] = field(default_factory=list)
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

    def voucher(self) -> bytes:
        """The encoded, signed voucher of the amounts now (signed again only when they grew)."""
        amounts = tuple(self.amounts)
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
        blocks: a tab's life: it expires ``blocks`` after the height last seen.
        max_price: the most paid per position per layer (servers asking more
            are not routed through).
        balance: the wallet's balance (base units), for the preflight.
        floor: bid at least this (at most ``max_price``), to free servers too:
            a higher bid goes first in a server's queue and waiting room.
        margin: the room each lane's cap leaves for replays (`MARGIN`).
    """

    def __init__(self, key: SigningKey, chain_id: str, nonce: int, height: int, max_price: int,
                 *, blocks: int = 120, balance: int = 0, margin: float = MARGIN,
                 floor: int = 0):
        self.key, self.chain_id, self.nonce, self.balance = key, chain_id, nonce, balance
        self.height, self.blocks, self.max_price, self.margin = height, blocks, max_price, margin
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
        """The expiry of the next tab: ``blocks`` after the latest height seen."""
        return self.height + self.blocks

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
