"""The compute -> ledger contract: a partition's blocks become valid job units."""

from __future__ import annotations

import hashlib

import pytest

from compute.partition import KINDS, model_units, partition
from ledger import types as T
from ledger.types import UNIT_KINDS, unit_id
from proof_of_learning.units import job_units
from tests.ledger.chainkit import make_net, new_db, next_block

SMOL = dict(n_layers=30, dim=576, n_heads=9, n_kv_heads=3, ffn_dim=1536, vocab_size=49152)


def test_kind_codes_agree():
    assert [T.FORWARD, T.BACKWARD, T.ATTENTION_HEADS] == list(UNIT_KINDS)
    assert KINDS == ("forward", "backward", "attention_heads")


@pytest.mark.parametrize("k, replicas", [(1, 1), (3, 1), (8, 1), (60, 1), (61, 1), (3, 4)])
def test_partition_units_are_a_valid_job_with_distinct_ids(k, replicas):
    units = job_units(partition(model_units(**SMOL), k), replicas)
    n = 2 * k * replicas
    assert len(units) == n and [u.replica for u in units] == [i // (2 * k) for i in range(n)]
    assert len({unit_id(b"\x01" * 32, 5, u) for u in units}) == n
    net = make_net()
    db = new_db(net)
    job = T.sign(T.Job("pnode-test", net.authority.public, bytes(32), bytes(32),
                       hashlib.sha256(b"{}").digest(), b"{}", 1, units, 0, 0, T.ZERO_SIG),
                 net.authority)
    applied = next_block(db, net, [job])
    assert applied.block.txs == (job,)  # the ledger's job rules accept it
