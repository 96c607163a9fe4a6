"""Audit rules of block validation: the draw, verdicts, re-checks and what they pay or burn.

Split from test_transition.py (the rest of the block and transaction rules);
every rejection has its own typed error.
"""

from __future__ import annotations

import pytest

from ledger import audit
from ledger import errors as E
from ledger.state import (
    ACCOUNT, JAIL, KEY_BEACON, KEY_PARAMS, KEY_SUPPLY, NODE, PENDING, check_supply,
)
from ledger.types import (
    COIN, GRADIENT_MISMATCH, MALFORMED, OUTPUT_MISMATCH, PASS, UNAVAILABLE, ZERO_SIG, Verdict,
    sign, tx_hash,
)
from tests.ledger.chainkit import (
    CHAIN, check_block as check, grow, make_net, new_db, next_block, receipts_due, with_txs,
)

EVIDENCE = b"\x07" * 32  # a failing verdict must name its evidence


@pytest.fixture
def job_chain():
    net = make_net(with_job=True)
    return net, new_db(net)


@pytest.fixture
def audited():
    """A job chain where every receipt is audited (audit_bps 10000)."""
    net = make_net(with_job=True, audit_bps=10_000)
    return net, new_db(net)


def _sampled(net, db):
    """Include a receipt, then the two blocks after which its audit is drawn."""
    receipt = receipts_due(db, net)[0]
    grow(db, net, 1, [receipt])
    rh = tx_hash(receipt)
    assert db.state.get(PENDING + rh).status == audit.DRAW_DUE
    grow(db, net, 2)
    pending = db.state.get(PENDING + rh)
    assert pending.status == audit.SAMPLED
    return receipt, rh, pending


def _verdict(net, pending, rh, reason, evidence=EVIDENCE):
    verifier = net.node_key(pending.verifier)
    return sign(Verdict(CHAIN, verifier.public, rh, reason, evidence, ZERO_SIG), verifier)


def test_the_audit_is_drawn_two_blocks_later_never_for_the_workers_account(audited):
    net, db = audited
    receipt, rh, pending = _sampled(net, db)
    worker = db.state.get(NODE + receipt.node_key).account
    assert db.state.get(NODE + pending.verifier).account != worker
    params = db.state.get(KEY_PARAMS)
    assert pending.final_height == pending.height + 2 + params.verdict_window


def test_a_failing_verdict_burns_the_reward_and_the_bond_pays_a_flat_fee_and_jails(audited):
    net, db = audited
    receipt, rh, pending = _sampled(net, db)
    verifier_account = db.state.get(NODE + pending.verifier).account
    worker_before = db.state.get(ACCOUNT + pending.account)
    verifier_before = db.state.get(ACCOUNT + verifier_account).balance
    supply_before = db.state.get(KEY_SUPPLY)
    grow(db, net, 1, [_verdict(net, pending, rh, OUTPUT_MISMATCH)])
    params = db.state.get(KEY_PARAMS)
    failed = db.state.get(PENDING + rh)  # the slash waits out the appeal window
    assert failed.status == audit.FAILED and failed.final_height == db.height + params.verdict_window
    assert db.state.get(ACCOUNT + pending.account).bond == worker_before.bond
    grow(db, net, params.verdict_window)  # nobody appealed
    worker = db.state.get(ACCOUNT + pending.account)
    assert worker.bond == worker_before.bond - worker_before.bond * params.slash_bps // 10_000
    assert db.state.get(PENDING + rh) is None  # its reward is never minted
    # No bounty: the verifier gets the flat fee, the slash is burned whole.
    assert db.state.get(ACCOUNT + verifier_account).balance == verifier_before + params.verify_fee
    supply = db.state.get(KEY_SUPPLY)
    assert supply.burned == supply_before.burned + worker_before.bond - worker.bond
    assert supply.minted == supply_before.minted + params.verify_fee
    assert db.state.get(JAIL + pending.account).strikes == 1
    check_supply(db.state)


def test_a_failing_verdict_has_every_other_pending_receipt_of_the_account_audited(monkeypatch):
    net = make_net(n_nodes=2, with_job=True, audit_bps=10_000)
    db = new_db(net)
    chosen: set[bytes] = set()  # the draw, made deterministic: only these are sampled
    real_draw = audit.audit_seed
    monkeypatch.setattr(audit, "is_sampled", lambda seed, bps: seed in chosen)
    first = receipts_due(db, net)
    worker = first[0].node_key
    grow(db, net, 1, first)  # block h: step 0's receipts
    a = tx_hash(first[0])
    second = [r for r in receipts_due(db, net) if r.node_key == worker]
    assert second, "step 1 gave the worker no unit"
    grow(db, net, 1, second)  # h+1: the worker's next receipt
    b = tx_hash(second[0])
    chosen.add(real_draw(db.state.get(KEY_BEACON).value, a))  # A's draw at h+2: h+1's beacon
    grow(db, net, 1)
    pa = db.state.get(PENDING + a)
    assert pa.status == audit.SAMPLED
    grow(db, net, 1, [_verdict(net, pa, a, GRADIENT_MISMATCH)])  # h+3: A fails
    assert db.state.get(PENDING + b).status == audit.FORCED  # B was drawn, not sampled
    grow(db, net, 1)
    assert db.state.get(PENDING + b).status == audit.FORCED  # its draw: two blocks on
    grow(db, net, 1)
    pb = db.state.get(PENDING + b)
    assert pb.status == audit.SAMPLED and pb.verifier != worker


def test_a_pass_pays_the_fee_and_the_worker_is_paid_at_the_final_height(audited):
    net, db = audited
    receipt, rh, pending = _sampled(net, db)
    verifier_account = db.state.get(NODE + pending.verifier).account
    before = db.state.get(ACCOUNT + verifier_account).balance
    worker_before = db.state.get(ACCOUNT + pending.account).balance
    grow(db, net, 1, [_verdict(net, pending, rh, PASS, bytes(32))])
    params = db.state.get(KEY_PARAMS)
    assert db.state.get(PENDING + rh).status == audit.PASSED
    assert db.state.get(ACCOUNT + verifier_account).balance == before + params.verify_fee
    grow(db, net, params.verdict_window)
    assert db.state.get(PENDING + rh) is None
    assert db.state.get(ACCOUNT + pending.account).balance >= worker_before + params.reward
    check_supply(db.state)


def test_a_silent_verifier_is_struck_and_the_worker_paid(audited):
    net, db = audited
    receipt, rh, pending = _sampled(net, db)
    verifier_account = db.state.get(NODE + pending.verifier).account
    worker_before = db.state.get(ACCOUNT + pending.account).balance
    grow(db, net, db.state.get(KEY_PARAMS).verdict_window - 1)
    assert db.state.get(PENDING + rh) is not None
    # (Its other strikes: unit deadlines this test lets pass; the silence is one more.)
    strikes = getattr(db.state.get(JAIL + verifier_account), "strikes", 0)
    grow(db, net, 1)  # the final height: the reward is paid, the silence struck
    assert db.state.get(PENDING + rh) is None
    assert db.state.get(JAIL + verifier_account).strikes == strikes + 1
    assert db.state.get(ACCOUNT + pending.account).balance >= worker_before + COIN
    check_supply(db.state)


@pytest.fixture
def rechecked():
    """A job chain where every receipt is audited and every pass re-checked."""
    net = make_net(with_job=True, audit_bps=10_000, recheck_bps=10_000)
    return net, new_db(net)


def _rechecking(net, db):
    """A sampled receipt, passed by its verifier in block b; its re-check drawn at b + 2.

    Never at b + 1: the seed would then be block b's beacon, and b's
    producer chose to include the pass knowing it.
    """
    receipt, rh, first = _sampled(net, db)
    grow(db, net, 1, [_verdict(net, first, rh, PASS, bytes(32))])
    assert db.state.get(PENDING + rh).status == audit.RECHECK_DUE
    grow(db, net, 1)
    assert db.state.get(PENDING + rh).status == audit.RECHECK_DUE
    grow(db, net, 1)
    second = db.state.get(PENDING + rh)
    assert second.status == audit.RECHECKING
    return receipt, rh, first, second


def test_a_pass_is_rechecked_by_another_account_than_the_worker_and_the_first(rechecked):
    net, db = rechecked
    receipt, rh, first, second = _rechecking(net, db)
    account = lambda key: db.state.get(NODE + key).account  # noqa: E731
    assert second.first_verifier == first.verifier
    assert account(second.verifier) not in (account(first.verifier), first.account)
    assert second.final_height == db.height + db.state.get(KEY_PARAMS).verdict_window


def test_a_failing_recheck_slashes_the_worker_and_the_lazy_first_verifier(rechecked):
    net, db = rechecked
    receipt, rh, first, second = _rechecking(net, db)
    lazy = db.state.get(NODE + first.verifier).account
    bonds = {a: db.state.get(ACCOUNT + a).bond for a in (first.account, lazy)}
    supply_before = db.state.get(KEY_SUPPLY)
    grow(db, net, 1, [_verdict(net, second, rh, GRADIENT_MISMATCH)])
    assert db.state.get(PENDING + rh).status == audit.FAILED
    grow(db, net, db.state.get(KEY_PARAMS).verdict_window)  # unappealed: it stands
    assert db.state.get(PENDING + rh) is None
    for a in (first.account, lazy):  # both lose the whole bond (slash_bps 10000), a strike
        assert db.state.get(ACCOUNT + a).bond == 0 and db.state.get(JAIL + a).strikes >= 1
    assert db.state.get(KEY_SUPPLY).burned == supply_before.burned + sum(bonds.values())
    check_supply(db.state)


def test_a_passing_recheck_pays_its_fee_and_an_unavailable_one_keeps_the_pass(rechecked):
    net, db = rechecked
    receipt, rh, first, second = _rechecking(net, db)
    checker = db.state.get(NODE + second.verifier).account
    before = db.state.get(ACCOUNT + checker).balance
    grow(db, net, 1, [_verdict(net, second, rh, PASS, bytes(32))])
    assert db.state.get(PENDING + rh).status == audit.PASSED
    assert db.state.get(ACCOUNT + checker).balance == before + db.state.get(KEY_PARAMS).verify_fee
    # Another receipt: the re-checker cannot fetch; the first pass stands, no fee.
    net2 = make_net(with_job=True, audit_bps=10_000, recheck_bps=10_000)
    db2 = new_db(net2)
    _, rh2, _, second2 = _rechecking(net2, db2)
    checker2 = db2.state.get(NODE + second2.verifier).account
    before2 = db2.state.get(ACCOUNT + checker2).balance
    grow(db2, net2, 1, [_verdict(net2, second2, rh2, UNAVAILABLE, bytes(32))])
    assert db2.state.get(PENDING + rh2).status == audit.PASSED
    assert db2.state.get(ACCOUNT + checker2).balance == before2


def test_a_silent_rechecker_is_struck_and_the_worker_paid(rechecked):
    net, db = rechecked
    receipt, rh, first, second = _rechecking(net, db)
    checker = db.state.get(NODE + second.verifier).account
    worker_before = db.state.get(ACCOUNT + first.account).balance
    grow(db, net, second.final_height - db.height - 1)
    strikes = getattr(db.state.get(JAIL + checker), "strikes", 0)
    grow(db, net, 1)
    assert db.state.get(PENDING + rh) is None
    assert db.state.get(JAIL + checker).strikes == strikes + 1
    assert db.state.get(ACCOUNT + first.account).balance >= worker_before + COIN
    check_supply(db.state)


def test_verdict_from_unassigned_verifier_is_rejected(audited):
    net, db = audited
    receipt, rh, pending = _sampled(net, db)
    rogue = next(k for k in net.nodes if k.public not in (pending.verifier, receipt.node_key))
    verdict = sign(Verdict(CHAIN, rogue.public, rh, OUTPUT_MISMATCH, EVIDENCE, ZERO_SIG), rogue)
    with pytest.raises(E.BadVerdict, match="not the one assigned"):
        check(db, with_txs(next_block(db, net).block, net, [verdict]))


def test_second_verdict_is_rejected(audited):
    net, db = audited
    _, rh, pending = _sampled(net, db)
    ok = _verdict(net, pending, rh, PASS, bytes(32))
    grow(db, net, 1, [ok])
    with pytest.raises(E.BadVerdict, match="not awaiting a verdict"):
        check(db, with_txs(next_block(db, net).block, net, [ok]))


def test_no_verdict_before_the_draw_nor_on_an_unsampled_receipt(job_chain):
    net, db = job_chain  # audit_bps 0: nothing is sampled
    receipt = receipts_due(db, net)[0]
    grow(db, net, 1, [receipt])
    rh = tx_hash(receipt)
    other = next(k for k in net.nodes if k.public != receipt.node_key)
    verdict = sign(Verdict(CHAIN, other.public, rh, OUTPUT_MISMATCH, EVIDENCE, ZERO_SIG), other)
    for _ in range(2):  # in block h+1 (before its draw), then h+2 (drawn: unsampled)
        with pytest.raises(E.BadVerdict, match="not awaiting a verdict"):
            check(db, with_txs(next_block(db, net).block, net, [verdict]))
        grow(db, net, 1)
    assert db.state.get(PENDING + rh).status == audit.UNSAMPLED


@pytest.mark.parametrize("reason, evidence, error", [
    (7, EVIDENCE, "unknown verdict reason 7"),
    (255, EVIDENCE, "unknown verdict reason"),
    (OUTPUT_MISMATCH, bytes(32), "'output mismatch' verdict must name its evidence"),
    (MALFORMED, bytes(32), "'malformed' verdict must name its evidence"),
])
def test_a_verdict_must_give_a_known_reason_and_evidence_to_fail(audited, reason, evidence,
                                                                  error):
    net, db = audited
    _, rh, pending = _sampled(net, db)
    with pytest.raises(E.BadVerdict, match=error):
        check(db, with_txs(next_block(db, net).block, net,
                           [_verdict(net, pending, rh, reason, evidence)]))


def test_unavailable_forfeits_the_reward_and_slashes_nobody(audited):
    net, db = audited
    _, rh, pending = _sampled(net, db)
    bond_before = db.state.get(ACCOUNT + pending.account).bond
    supply_before = db.state.get(KEY_SUPPLY)
    grow(db, net, 1, [_verdict(net, pending, rh, UNAVAILABLE, bytes(32))])
    assert db.state.get(PENDING + rh) is None  # no proof, no pay; and no fee
    assert db.state.get(ACCOUNT + pending.account).bond == bond_before
    assert db.state.get(KEY_SUPPLY).burned == supply_before.burned
    assert db.state.get(KEY_SUPPLY).minted == supply_before.minted
    assert db.state.get(JAIL + pending.account) is None
    check_supply(db.state)




