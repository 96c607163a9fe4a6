"""Protocol and messages of the wallet desk: a client without a node of its own asks the
peer it dials for its account, the registry, and to submit a transaction.

Owns ``/pnode/wallet/1.0.0`` (specs/network.md section 9.7): one request
frame, one answer frame. `AccountQuery` -> `AccountInfo`, `SubmitTx` ->
`TxResult`, `RegistryQuery` -> `RegistryInfo`. The client trusts the peer it
dials for what it reads (its balance, the registry), as a light wallet
trusts its server; a transaction it submits is signed, so the peer cannot
alter it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from ledger.codec import U32, U64, ChainId, Key32, MaxLen, wire

WALLET_PROTOCOL = "/pnode/wallet/1.0.0"
#: Largest transaction a `SubmitTx` carries (an `OpenTab` of 64 lanes is about 3 KiB).
MAX_TX_BYTES = 64 * 1024
#: Largest request frame: a `SubmitTx` with a maximal transaction.
MAX_WALLET_REQUEST = MAX_TX_BYTES + 64
#: Most nodes in one `RegistryInfo`.
MAX_REGISTRY = 4096

Reason = Annotated[str, MaxLen(256)]


@wire(85)
@dataclass(frozen=True, slots=True)
class AccountQuery:
    """What does the chain hold for ``account``?"""

    account: Key32


@wire(86)
@dataclass(frozen=True, slots=True)
class AccountInfo:
    """An account at the peer's tip: ``nonce`` the chain's next, ``next_nonce`` counting
    the peer's queued transactions of the account too (what a new one should take)."""

    chain_id: ChainId
    height: U64
    balance: U64
    bond: U64
    nonce: U64
    next_nonce: U64


@wire(87)
@dataclass(frozen=True, slots=True)
class SubmitTx:
    """Admit this encoded, signed transaction to your mempool and gossip it."""

    tx: Annotated[bytes, MaxLen(MAX_TX_BYTES)]


@wire(88)
@dataclass(frozen=True, slots=True)
class TxResult:
    """``ok``: admitted (``txid`` its id), else ``reason`` (the rule it breaks)."""

    ok: bool
    txid: Key32
    reason: Reason


@wire(89)
@dataclass(frozen=True, slots=True)
class RegistryQuery:
    """Which nodes are registered and bonded?"""


@wire(90)
@dataclass(frozen=True, slots=True)
class RegisteredEntry:
    """One registered, bonded node (`node.chain.registry_view`'s entry)."""

    peer_id: Annotated[str, MaxLen(128)]
    node_key: Key32
    account: Key32
    bond: U64
    layer_start: U32
    layer_end: U32


@wire(91)
@dataclass(frozen=True, slots=True)
class RegistryInfo:
    chain_id: ChainId
    height: U64
    nodes: Annotated[tuple[RegisteredEntry, ...], MaxLen(MAX_REGISTRY)]
