"""Receipt proofs: what `pnode proof` writes and `pnode verify proof` checks."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ledger.codec import decode, encode, from_json, to_json
from ledger.proofs import BadProof, ReceiptProof, verify_receipt_proof
from ledger.types import Receipt, block_hash, tx_hash
from tests.ledger.chainkit import grow, make_net, new_db, receipts_due


@pytest.fixture(scope="module")
def chain():
    net = make_net(with_job=True)
    db = new_db(net)
    for _ in range(4):
        grow(db, net, 1, receipts_due(db, net))
    return net, db


def test_every_receipt_has_a_valid_proof(chain):
    net, db = chain
    leaves = db.log_leaves()
    assert len(leaves) == 6  # 3 steps x 2 units
    for leaf in leaves:
        proof = db.receipt_proof(tx_hash(decode(leaf, Receipt)))
        verify_receipt_proof(proof, trusted_block_hash=db.tip_hash)
        assert decode(encode(proof), ReceiptProof) == proof
        assert from_json(to_json(proof), ReceiptProof) == proof


def test_tampered_proofs_fail(chain):
    net, db = chain
    proof = db.receipt_proof(tx_hash(decode(db.log_leaves()[3], Receipt)))
    forged_receipt = replace(proof.receipt, output_hash=b"\x01" * 32)
    cases = {
        "not signed by its node": replace(proof, receipt=forged_receipt),
        "is not leaf": replace(proof, index=2),
        "outside a log": replace(proof, index=99),
        "not signed by its producer": replace(proof, header=replace(proof.header,
                                                                    log_root=b"\x02" * 32)),
    }
    bad_path = list(proof.path)
    bad_path[0] = bytes(32)
    cases["is not leaf "] = replace(proof, path=tuple(bad_path))
    for reason, bad in cases.items():
        with pytest.raises(BadProof, match=reason.strip()):
            verify_receipt_proof(bad)
    with pytest.raises(BadProof, match="trusted"):
        verify_receipt_proof(proof, trusted_block_hash=block_hash(db.block_at(1).header))


def test_unknown_receipt_has_no_proof(chain):
    _, db = chain
    with pytest.raises(KeyError):
        db.receipt_proof(b"\x00" * 32)
