"""`ServerInfo`: one server's span as servers and clients reason about it (after Petals' own).

A signed `node.wire.serve.Announce` is what travels; `ServerInfo` is what
layer placement (`node.serve.placement`) and route planning (`wallet.client.route`)
read from it: the peer, the layers [start, end) it holds, its measured
throughput, its load, its price and its position caps. One record for both sides, so a field
added to the announcement reaches both the same way. `charge` is what a price comes to,
one rule for both sides too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from node.errors import NodeError
from node.wire.serve import Announce


class SpanError(NodeError, ValueError):
    """A server span that makes no sense: empty or negative, or a throughput or load out of range."""


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """One server's announcement, as placement and routing see it.

    peer_id: the server's peer id; start, end: it holds layers [start, end);
    throughput: tokens/s for one decode token through all its layers (> 0);
    load: its active sessions; max_sessions: sessions it accepts at most;
    price: what it asks per position per layer (the route keeps to servers
        asking at most the client's ``--max-price``).
    max_chunk_positions: the most positions of one forward call it runs.
    max_session_positions: the most positions one session may hold there.

    Raises:
        SpanError: an empty or negative span, a throughput that is not a
            positive finite number, a negative load, or max_sessions or a
            position cap < 1.
    """

    peer_id: str
    start: int
    end: int
    throughput: float
    load: int = 0
    max_sessions: int = 8
    price: int = 0
    max_chunk_positions: int = 128  # (defaults: a default server's)
    max_session_positions: int = 2048
    node_key: bytes = bytes(32)  # the node key its tab lane pays (zeros: none)

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise SpanError(f"server {self.peer_id}: bad span [{self.start}, {self.end})")
        if not (math.isfinite(self.throughput) and self.throughput > 0):
            raise SpanError(f"server {self.peer_id}: throughput {self.throughput} is not > 0")
        if self.load < 0 or self.max_sessions < 1:
            raise SpanError(f"server {self.peer_id}: load {self.load} / {self.max_sessions}")
        if self.max_chunk_positions < 1 or self.max_session_positions < 1:
            raise SpanError(f"server {self.peer_id}: position caps {self.max_chunk_positions}"
                            f" per call, {self.max_session_positions} per session")

    @classmethod
    def from_announce(cls, announce: Announce, peer_id: str, *,
                      min_throughput: float = 1e-3) -> ServerInfo:
        """The span ``announce`` describes, for the peer whose id is ``peer_id``.

        Args:
            announce: a verified announcement.
            peer_id: its peer id (derived from its key by the caller).
            min_throughput: the floor for a server that announced 0 tokens/s
                (it still serves, only slowly).

        Raises:
            SpanError: the announced span is empty.
        """
        return cls(peer_id, announce.layer_start, announce.layer_end,
                   max(announce.throughput, min_throughput), announce.load,
                   announce.max_sessions, announce.price, announce.max_chunk_positions,
                   announce.max_session_positions, announce.node_key)

    @property
    def busy(self) -> bool:
        """True when the server takes no more sessions (it would answer busy)."""
        return self.load >= self.max_sessions


def charge(positions: int, layers: int, price: int) -> int:
    """Base units owed for ``positions`` run through ``layers`` layers at ``price``.

    The one rule a paid session is counted by, at both ends: the server's
    `node.serve.billing.Bill` and the client's vouchers and locks
    (`wallet.payer`) must agree to the unit, or the client's vouchers fall
    behind and its sessions are stopped. It lives here, beside the price
    it applies (`ServerInfo.price`), in the protocol both ends may import
    (the wallet may not import node.serve), not in the ledger: the chain
    never prices a position, it checks a claim against its tab's caps and
    vouchers only.

    Args:
        positions: positions run (a replay's count again: they cost again).
        layers: the layers each ran through.
        price: base units per position per layer (an `Announce.price`, an
            `OpenSession.bid`).

    Returns:
        positions x layers x price.
    """
    return positions * layers * price


#: Positions of credit a paid server gives one tab's lane, all its sessions together:
#: what a step may run beyond what the client's checked vouchers pay. A longer step
#: (a prompt, a replay) comes with a voucher that pays its rest before it runs.
CREDIT_POSITIONS = 32
#: Blocks before a tab's expiry at which its servers stop serving it and claim it: the
#: room a claim has to land (a claim after expiry is refused, specs/ledger.md 5.2).
CLAIM_MARGIN = 8
#: Blocks a client dates a new tab beyond its ``--tab-blocks``: the room the tab has to
#: land (a server ends a tab not in a block this many blocks after it admitted it).
TAB_LANDING = 8


def credit(layers: int, bid: int) -> int:
    """The credit of one lane: `CREDIT_POSITIONS` x ``layers`` x ``bid`` base units.

    Both ends count by it: the server refuses a step whose positions would
    leave more than this unpaid by checked vouchers, and the client's
    voucher pays ahead whatever a step brings beyond it (specs/network.md 9.6).
    """
    return charge(CREDIT_POSITIONS, layers, bid)


def serve_until(expiry_height: int) -> int:
    """The first height at which a tab expiring at ``expiry_height`` is no longer served."""
    return expiry_height - CLAIM_MARGIN
