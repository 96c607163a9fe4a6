"""Tabs: the objects of a client's payment channel to the servers of one session.

Owns `Lane`, `OpenTab`, `Voucher`, `Claim` and the state record
`TabRecord` (specs/ledger.md §4.5): a unidirectional payment channel, as
Filecoin's payment-channel actor and Spilman channels do, with one lane
per server. A client opens a tab, which locks the sum of its lanes' caps;
as the servers deliver, it signs `Voucher`s of the cumulative amount owed
to every lane (never stored, never on chain but inside a `Claim`); any
lane's server settles every lane with the latest voucher it holds (a
`Claim`, signed by its node key), and may close its own lane, which
refunds that lane's rest at once. Whatever is still locked when the tab
expires goes back to the client (`ledger.tabrules.refund_expired`).

Pure: objects, their hashes and signatures. The rules are
`ledger/tabrules.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated

from ledger import crypto
from ledger.codec import U64, ChainId, Hash32, Key32, MaxLen, Sig64, encode_unsigned, wire

__all__ = ["MAX_LANES", "MAX_TAB", "MIN_TAB", "Claim", "Lane", "OpenTab", "TabRecord", "Voucher",
           "locked", "new_tab_record", "sign_voucher", "voucher_ok"]

#: Most lanes (servers) of one tab: a route over every layer of a 64-layer model, one each.
MAX_LANES = 64
#: A tab's life, in blocks after the one that opens it: long enough for a session and
#: its claims to land (MIN_TAB), short enough that an abandoned tab's funds come back
#: soon (MAX_TAB: about a day at 1 block/s).
MIN_TAB, MAX_TAB = 16, 86_400


@wire(28)
@dataclass(frozen=True, slots=True)
class Lane:
    """One server's share of a tab: its node key and the most it can be paid."""

    node_key: Key32
    cap: U64


@wire(17)
@dataclass(frozen=True, slots=True)
class OpenTab:
    """A client locks ``sum(cap)`` for the servers of session ``session_id`` until
    ``expiry_height``. Its id is its `tx_hash`."""

    chain_id: ChainId
    client: Key32
    session_id: Hash32
    lanes: Annotated[tuple[Lane, ...], MaxLen(MAX_LANES)]
    expiry_height: U64
    nonce: U64
    signature: Sig64


@wire(18)
@dataclass(frozen=True, slots=True)
class Voucher:
    """What the client owes each lane of ``tab_id`` so far (cumulative, in lane order).

    Signed by the tab's client under ``S_VOUCHER``; a later voucher has every
    amount at least as large (a server keeps the latest it was given).
    """

    chain_id: ChainId
    tab_id: Hash32
    amounts: Annotated[tuple[U64, ...], MaxLen(MAX_LANES)]
    signature: Sig64


@wire(19)
@dataclass(frozen=True, slots=True)
class Claim:
    """A lane's server settles ``voucher`` for every open lane of its tab; with
    ``close``, it also ends its own lane (its rest goes back to the client)."""

    chain_id: ChainId
    node_key: Key32
    voucher: Voucher
    close: bool
    signature: Sig64


@wire(29)
@dataclass(frozen=True, slots=True)
class TabRecord:
    """An open tab in the state, keyed by its id.

    ``payees``: each lane's server's account when the tab opened (a server
    that re-registers is still paid where it was); ``paid``: what each lane
    was paid so far; ``closed``: which lanes are ended.
    """

    client: Key32
    session_id: Hash32
    expiry_height: U64
    lanes: Annotated[tuple[Lane, ...], MaxLen(MAX_LANES)]
    payees: Annotated[tuple[Key32, ...], MaxLen(MAX_LANES)]
    paid: Annotated[tuple[U64, ...], MaxLen(MAX_LANES)]
    closed: Annotated[tuple[bool, ...], MaxLen(MAX_LANES)]


def new_tab_record(tx: OpenTab, payees: tuple[bytes, ...]) -> TabRecord:
    """The state's record of the tab ``tx`` opens: nothing paid, no lane closed."""
    n = len(tx.lanes)
    return TabRecord(tx.client, tx.session_id, tx.expiry_height, tx.lanes, payees, (0,) * n,
                     (False,) * n)


def locked(record: TabRecord) -> int:
    """What the tab still holds: every open lane's cap less what it was paid."""
    return sum(lane.cap - paid for lane, paid, shut in
               zip(record.lanes, record.paid, record.closed) if not shut)


def sign_voucher(key: crypto.SigningKey, voucher: Voucher) -> Voucher:
    """``voucher`` signed by the tab's client."""
    return replace(voucher, signature=key.sign(crypto.S_VOUCHER, encode_unsigned(voucher)))


def voucher_ok(voucher: Voucher, client: bytes) -> bool:
    """Whether ``voucher`` carries ``client``'s signature."""
    return crypto.verify(client, crypto.S_VOUCHER, encode_unsigned(voucher), voucher.signature)
