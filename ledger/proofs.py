"""Light-client proofs: a receipt or a transaction, its Merkle path, the header that commits it.

A ``ReceiptProof`` lets anyone holding a block header (or just trusting one
block hash) check that a receipt is in the chain's append-only log, without
the chain: the path proves the receipt is leaf ``index`` of the log of
``header.log_size`` leaves whose root the header commits, and the two
signatures prove who did the work and who sealed the block.

A ``TxProof`` does the same for any transaction of a block (a claim that
paid a server, a tab): leaf ``index`` of the block's ``count`` encoded
transactions, whose RFC 6962 root the header commits as ``txs_root``.
Attack note: the count is not in the header, and some wrong counts give the
same path shape (index 2 of 5 or of 6 leaves), so a proof does not vouch for
the block's size; it does bind the transaction to the root (leaf and node
hashes are domain-separated), so no count makes it prove a transaction the
block does not hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from ledger import merkle
from ledger.codec import U64, Hash32, MaxLen, encode, wire
from ledger.errors import ValidationError
from ledger.types import Header, Receipt, Tx, block_hash, signature_ok


class BadProof(ValidationError):
    """A receipt proof that does not check out."""


@wire(40)
@dataclass(frozen=True, slots=True)
class ReceiptProof:
    receipt: Receipt
    index: U64
    path: Annotated[tuple[Hash32, ...], MaxLen(64)]
    header: Header


def verify_receipt_proof(proof: ReceiptProof, trusted_block_hash: bytes | None = None) -> None:
    """Check a receipt proof.

    Args:
        proof: the proof to check.
        trusted_block_hash: if given, the header must be this block's.

    Raises:
        BadProof: naming the first check that fails.
    """
    header, receipt = proof.header, proof.receipt
    _check_header(header, "receipt", receipt.chain_id, trusted_block_hash)
    if not signature_ok(receipt):
        raise BadProof("receipt is not signed by its node key")
    if not proof.index < header.log_size:
        raise BadProof(f"index {proof.index} is outside a log of {header.log_size} leaves")
    if not merkle.verify_inclusion(encode(receipt), proof.index, header.log_size,
                                   list(proof.path), header.log_root):
        raise BadProof(f"receipt is not leaf {proof.index} of the log committed at height "
                       f"{header.height}")


@wire(41)
@dataclass(frozen=True, slots=True)
class TxProof:
    tx: Tx
    index: U64
    count: U64
    path: Annotated[tuple[Hash32, ...], MaxLen(64)]
    header: Header


def verify_tx_proof(proof: TxProof, trusted_block_hash: bytes | None = None) -> None:
    """Check a transaction proof.

    Args:
        proof: the proof to check.
        trusted_block_hash: if given, the header must be this block's.

    Raises:
        BadProof: naming the first check that fails.
    """
    header = proof.header
    _check_header(header, "transaction", proof.tx.chain_id, trusted_block_hash)
    if not proof.index < proof.count:
        raise BadProof(f"index {proof.index} is outside a block of {proof.count} transactions")
    if not merkle.verify_inclusion(encode(proof.tx), proof.index, proof.count,
                                   list(proof.path), header.txs_root):
        raise BadProof(f"transaction is not leaf {proof.index} of the block at height "
                       f"{header.height}")


def _check_header(header: Header, what: str, chain_id: str, trusted: bytes | None) -> None:
    """The checks every proof makes of its header: the trusted block (if given), the
    proven object's chain, the producer's signature. Raises BadProof."""
    if trusted is not None and block_hash(header) != trusted:
        raise BadProof(f"header of height {header.height} is not the trusted block")
    if chain_id != header.chain_id:
        raise BadProof(f"{what} is for chain {chain_id!r}, header for {header.chain_id!r}")
    if not signature_ok(header):
        raise BadProof(f"header of height {header.height} is not signed by its producer")
