"""Every key the node writes to its key-value store, and the store-only records.

One module builds all keys so that no two parts of the code can disagree on
the layout, and so that a version bump is one edit. Integers in keys are
8-byte big-endian, so keys sort in numeric order.

    v1/genesis               -> Genesis
    v1/tip                   -> hash of the head of the best chain
    v1/block/<hash>          -> Block (main chain and side branches)
    v1/meta/<hash>           -> BlockMeta (height, parent, total weight)
    v1/undo/<hash>           -> Undo (main-chain blocks only)
    v1/height/<n>            -> hash of the main-chain block at height n
    v1/state/<state key>     -> state record (see ledger.state)
    v1/log/<n>               -> encoded receipt, the n-th log leaf
    v1/receipt/<hash>        -> log index (8 bytes) of a receipt
    v1/mempool/<hash>        -> a transaction waiting for a block
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from ledger.codec import U64, Hash32, MaxLen, wire

VERSION = b"v1/"
GENESIS = VERSION + b"genesis"
TIP = VERSION + b"tip"
BLOCK = VERSION + b"block/"
META = VERSION + b"meta/"
UNDO = VERSION + b"undo/"
HEIGHT = VERSION + b"height/"
STATE = VERSION + b"state/"
LOG = VERSION + b"log/"
RECEIPT = VERSION + b"receipt/"
MEMPOOL = VERSION + b"mempool/"


def u64(n: int) -> bytes:
    return n.to_bytes(8, "big")


def block_key(block_hash: bytes) -> bytes:
    return BLOCK + block_hash


def meta_key(block_hash: bytes) -> bytes:
    return META + block_hash


def undo_key(block_hash: bytes) -> bytes:
    return UNDO + block_hash


def height_key(height: int) -> bytes:
    return HEIGHT + u64(height)


def state_key(key: bytes) -> bytes:
    return STATE + key


def log_key(index: int) -> bytes:
    return LOG + u64(index)


def receipt_key(receipt_hash: bytes) -> bytes:
    return RECEIPT + receipt_hash


def mempool_key(tx_hash: bytes) -> bytes:
    return MEMPOOL + tx_hash


@wire(30)
@dataclass(frozen=True, slots=True)
class BlockMeta:
    """Where a stored block sits: its height, parent and chain weight."""

    height: U64
    parent: Hash32
    total_weight: Annotated[bytes, MaxLen(32)]  # big-endian; can outgrow 64 bits
    rank: U64

    @property
    def weight(self) -> int:
        return int.from_bytes(self.total_weight, "big")


@wire(31)
@dataclass(frozen=True, slots=True)
class UndoEntry:
    """One state key's value before a block; empty bytes means absent."""

    key: Annotated[bytes, MaxLen(256)]
    value: bytes


@wire(32)
@dataclass(frozen=True, slots=True)
class Undo:
    entries: tuple[UndoEntry, ...]


def weight_bytes(weight: int) -> bytes:
    return weight.to_bytes(max(1, (weight.bit_length() + 7) // 8), "big")
