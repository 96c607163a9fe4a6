"""node.pol.attacks: the withholding producer's rule and attack names, on a real chain."""

from __future__ import annotations

import pytest

from ledger import audit
from ledger.state import KEY_BEACON, KEY_PARAMS, PENDING
from ledger.types import tx_hash
from node.pol.attacks import attack_hooks, attack_parts, withhold
from tests.ledger.chainkit import grow, make_net, new_db, next_block, producer, receipts_due


@pytest.mark.parametrize("audit_bps", [0, 5000, 10_000])
def test_a_withholder_keeps_back_exactly_the_blocks_that_would_audit_it(audit_bps):
    """For each producer of the block after a receipt's, over many receipts: it withholds
    when that block's beacon samples its own receipt, never for another's."""
    net = make_net(n_nodes=3, with_job=True, job_steps=40, audit_bps=audit_bps)
    db = new_db(net)
    seen = {True: 0, False: 0}
    for _ in range(12):
        receipts = receipts_due(db, net)
        grow(db, net, 1, receipts)  # block h: this step's receipts
        mine = {tx_hash(r): r.node_key for r in receipts}
        for rank in range(3):
            applied = next_block(db, net, rank=rank)  # block h+1, by each possible producer
            key = producer(db, net, rank).public
            beacon_value = applied.writes[KEY_BEACON].value
            expected = any(
                node == key and audit.is_sampled(audit.audit_seed(beacon_value, rh),
                                                 db.state.get(KEY_PARAMS).audit_bps)
                for rh, node in mine.items() if db.state.get(PENDING + rh) is not None)
            assert withhold(db, applied, key) == expected
            seen[expected] += 1
        grow(db, net, 2)
    if audit_bps == 0:
        assert seen[True] == 0
    else:
        assert seen[True] > 0 and seen[False] > 0


def test_attack_names_combine_one_per_role():
    assert attack_parts("random-update+withholding") == ["random-update", "withholding"]
    worker, verifier, producer_rule = attack_hooks("lazy-verifier+withholding")
    assert worker is None and verifier is not None and producer_rule is withhold
    assert attack_hooks(None) == (None, None, None)
    for bad in ("random-update+scaled-gradients", "nonsense", "withholding+withholding"):
        with pytest.raises(ValueError):
            attack_parts(bad)
