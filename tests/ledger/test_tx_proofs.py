"""ledger.proofs.TxProof: a transaction's inclusion in a block, checked from its header alone.

Against an independent reference: the RFC 6962 root of the block's encoded
transactions (`merkle.merkle_root`) is the header's ``txs_root``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import merkle
from ledger.codec import decode, encode, from_json, to_json
from ledger.proofs import BadProof, TxProof, verify_tx_proof
from ledger.types import COIN, block_hash, tx_hash
from tests.ledger.chainkit import make_net, new_db, next_block


def chain_with(n_txs: int):
    net = make_net()
    db = new_db(net)
    a, b = net.users
    txs = [net.transfer(a, b.public, COIN + i) for i in range(n_txs)]
    applied = next_block(db, net, txs)
    db.add_block(applied.block, now_ms=applied.block.header.time_ms)
    db.add_block(next_block(db, net).block, now_ms=None)  # the tx is one block deep
    return db, txs, applied.block


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 9), data=st.data())
def test_every_transaction_of_a_block_proves_against_its_header(n, data):
    db, txs, block = chain_with(n)
    k = data.draw(st.integers(0, n - 1))
    proof = db.tx_proof(tx_hash(txs[k]))
    assert proof.tx == txs[k] and proof.header == block.header and proof.count == n
    assert block.header.txs_root == merkle.merkle_root([encode(t) for t in block.txs])
    verify_tx_proof(proof, block_hash(block.header))
    assert from_json(to_json(proof), TxProof) == proof == decode(encode(proof), TxProof)


def test_a_proof_that_lies_is_refused():
    db, txs, block = chain_with(5)
    proof = db.tx_proof(tx_hash(txs[2]))
    other = txs[3]
    cases = {
        "is not leaf 2": replace(proof, tx=other),
        "is outside a block of 5": replace(proof, index=5),
        "is not leaf 1": replace(proof, index=1),
        "is not leaf 2 of": replace(proof, count=3),  # a shape whose root differs
        "not signed by its producer": replace(proof, header=replace(block.header, time_ms=1)),
    }
    for reason, bad in cases.items():
        with pytest.raises(BadProof, match=reason):
            verify_tx_proof(bad)
    with pytest.raises(BadProof, match="is not the trusted block"):
        verify_tx_proof(proof, bytes(32))
    with pytest.raises(KeyError):
        db.tx_proof(bytes(32))
