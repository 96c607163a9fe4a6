"""Chain sync's protocol id, the chain's gossip topics, and the sync messages.

Owns what nodes say to each other to sync the chain (specs/network.md,
"Chain sync"): the request/response protocol id, the block and transaction
gossip topics, and the sync messages. Messages are frozen, slotted
dataclasses registered with the ledger codec (tags in `node.wire`'s table),
so `ledger.codec.decode(data,
ExpectedType)` refuses anything else: a wrong tag, a field out of range, a
block count over the cap, trailing bytes. Limits live here, next to the
shapes they bound, so client and server agree on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from ledger.codec import U64, Hash32, MaxLen, Range, concat_array, encode_from_parts, wire
from ledger.types import MAX_BLOCK_BYTES, Block

#: Request/response protocol of chain sync (one frame each way per stream).
SYNC_PROTOCOL = "/pnode/sync/1.0.0"
#: Gossip topic of new blocks; a message is one ``encode(Block)``.
BLOCKS_TOPIC = "pnode/blocks/1"
#: Gossip topic of transactions for the mempool; a message is one ``encode(tx)``.
TXS_TOPIC = "pnode/txs/1"

#: Most blocks one `BlocksRequest` may ask for (a larger count is refused).
MAX_BLOCKS_PER_REQUEST = 128
#: A server stops adding blocks to a `BlocksResponse` before it passes this
#: many encoded bytes (it always sends at least one block, however large).
MAX_BLOCKS_RESPONSE_BYTES = 8 * 1024 * 1024
#: Largest response frame a sync client reads: one maximal block alone
#: (``MAX_BLOCK_BYTES`` of transactions plus header and framing) fits.
MAX_SYNC_RESPONSE_FRAME = MAX_BLOCK_BYTES + (1 << 20)
#: Largest request frame a sync server reads (requests are a few bytes).
MAX_SYNC_REQUEST_FRAME = 1024

Weight = Annotated[bytes, MaxLen(32)]  # big-endian total chain weight, as BlockMeta


@wire(50)
@dataclass(frozen=True, slots=True)
class TipRequest:
    """Ask a peer for its main-chain tip."""


@wire(51)
@dataclass(frozen=True, slots=True)
class TipResponse:
    """A peer's main-chain tip and the total fork-choice weight up to it.

    ``genesis_hash`` (the hash of block 0) lets a client drop a peer of
    another chain before fetching anything.
    """

    height: U64
    tip_hash: Hash32
    total_weight: Weight
    genesis_hash: Hash32

    @property
    def weight(self) -> int:
        return int.from_bytes(self.total_weight, "big")


@wire(52)
@dataclass(frozen=True, slots=True)
class BlocksRequest:
    """Ask for main-chain blocks ``start_height, start_height + 1, ...``."""

    start_height: U64
    count: Annotated[int, Range(1, MAX_BLOCKS_PER_REQUEST)]


@wire(53)
@dataclass(frozen=True, slots=True)
class BlocksResponse:
    """Consecutive main-chain blocks from the requested height, lowest first.

    Fewer than asked (possibly none) when the chain ends or the size cap
    (`MAX_BLOCKS_RESPONSE_BYTES`) is reached.
    """

    blocks: Annotated[tuple[Block, ...], MaxLen(MAX_BLOCKS_PER_REQUEST)]


SyncRequest = (TipRequest, BlocksRequest)


def encode_blocks_response(encoded_blocks: list[bytes]) -> bytes:
    """``encode(BlocksResponse(blocks))`` from blocks already encoded (as stored).

    Saves decoding and re-encoding every block a server sends; the result is
    byte-identical to ``encode``.
    """
    return encode_from_parts(BlocksResponse, [concat_array(encoded_blocks)])
