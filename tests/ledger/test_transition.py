"""Block and transaction rules: every rejection has its own typed error."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ledger import errors as E
from ledger import merkle
from ledger.codec import encode
from ledger import audit
from ledger.state import (
    ACCOUNT, JAIL, KEY_PARAMS, KEY_SUPPLY, NODE, PENDING, UNIT, check_supply,
)
from ledger.transition import validate_block
from ledger.types import (
    COIN, GRADIENT_MISMATCH, MALFORMED, OUTPUT_MISMATCH, PASS, UNAVAILABLE, ZERO_SIG, Block,
    Verdict, sign, tx_hash,
)
from ledger.types import FORWARD, UnitTemplate
from tests.ledger.chainkit import (
    CHAIN, balance, grow, job, make_net, new_db, next_block, producer, receipts_due, registration,
)

EVIDENCE = b"\x07" * 32  # a failing verdict must name its evidence


@pytest.fixture
def chain():
    net = make_net()
    return net, new_db(net)


def resign(block: Block, net, **fields) -> Block:
    """The block with header fields changed and the header signed again."""
    header = replace(block.header, **fields)
    return replace(block, header=sign(header, net.node_key(header.producer)))


def with_txs(block: Block, net, txs) -> Block:
    root = merkle.merkle_root([encode(t) for t in txs])
    return resign(replace(block, txs=tuple(txs)), net, txs_root=root)


def check(db, block, now=None):
    return validate_block(db.state, db.tip, block, now if now is not None else block.header.time_ms)


# -- transactions ---------------------------------------------------------------------


def test_transfer_moves_coins_and_conserves_supply(chain):
    net, db = chain
    alice, bob = net.users
    grow(db, net, 1, [net.transfer(alice, bob.public, 7 * COIN)])
    assert balance(db, alice.public) == 93 * COIN
    assert balance(db, bob.public) == 107 * COIN
    check_supply(db.state)


def test_bad_signature_is_rejected(chain):
    net, db = chain
    alice, bob = net.users
    tx = net.transfer(alice, bob.public, COIN)
    forged = replace(tx, amount=50 * COIN)  # signature no longer covers the amount
    block = with_txs(next_block(db, net).block, net, [forged])
    with pytest.raises(E.BadSignature):
        check(db, block)


def test_wrong_chain_id_is_rejected(chain):
    net, db = chain
    alice, bob = net.users
    tx = net.transfer(alice, bob.public, COIN, chain_id="other-chain")
    block = with_txs(next_block(db, net).block, net, [tx])
    with pytest.raises(E.WrongChainId):
        check(db, block)


@pytest.mark.parametrize("nonce, what", [(1, "out of order"), (5, "out of order")])
def test_out_of_order_nonce_is_rejected(chain, nonce, what):
    net, db = chain
    alice, bob = net.users
    block = with_txs(next_block(db, net).block, net, [net.transfer(alice, bob.public, 1, nonce)])
    with pytest.raises(E.BadNonce, match=what) as raised:
        check(db, block)
    assert raised.value.ahead  # a server may wait for its predecessors
    assert type(raised.value).__name__ == "BadNonce"  # the name refusals carry on the wire


def test_replayed_transaction_is_rejected(chain):
    net, db = chain
    alice, bob = net.users
    tx = net.transfer(alice, bob.public, COIN)
    grow(db, net, 1, [tx])
    block = with_txs(next_block(db, net).block, net, [tx])
    with pytest.raises(E.BadNonce, match="replayed") as raised:
        check(db, block)
    assert not raised.value.ahead


def test_same_nonce_twice_in_one_block_is_rejected(chain):
    net, db = chain
    alice, bob = net.users
    a = net.transfer(alice, bob.public, COIN, nonce=0)
    b = net.transfer(alice, net.users[0].public[::-1], COIN, nonce=0)
    block = with_txs(next_block(db, net).block, net, [a, b])
    with pytest.raises(E.BadNonce, match="tx 1"):
        check(db, block)


def test_overspend_is_rejected(chain):
    net, db = chain
    alice, bob = net.users
    block = with_txs(next_block(db, net).block, net, [net.transfer(alice, bob.public, 101 * COIN)])
    with pytest.raises(E.InsufficientFunds):
        check(db, block)


def test_double_spend_in_one_block_is_rejected(chain):
    net, db = chain
    alice, bob = net.users
    spends = [net.transfer(alice, bob.public, 60 * COIN), net.transfer(alice, bob.public, 60 * COIN)]
    block = with_txs(next_block(db, net).block, net, spends)
    with pytest.raises(E.InsufficientFunds, match="tx 1"):
        check(db, block)


def test_producer_drops_invalid_transactions(chain):
    net, db = chain
    alice, bob = net.users
    good = net.transfer(alice, bob.public, 60 * COIN)
    bad = net.transfer(alice, bob.public, 60 * COIN)
    applied = next_block(db, net, [good, bad])
    assert applied.block.txs == (good,)
    db.add_block(applied.block, now_ms=applied.block.header.time_ms)


def test_zero_and_self_transfers_are_rejected(chain):
    net, db = chain
    alice, _ = net.users
    for tx in (net.transfer(alice, net.users[1].public, 0, nonce=0),
               net.transfer(alice, alice.public, 1, nonce=0)):
        with pytest.raises(E.BadAmount):
            check(db, with_txs(next_block(db, net).block, net, [tx]))


# -- headers ----------------------------------------------------------------------------


def test_wrong_prev_hash_is_rejected(chain):
    net, db = chain
    block = resign(next_block(db, net).block, net, prev_hash=b"\x07" * 32)
    with pytest.raises(E.WrongPrevHash):
        check(db, block)


def test_wrong_height_is_rejected(chain):
    net, db = chain
    block = resign(next_block(db, net).block, net, height=5)
    with pytest.raises(E.WrongHeight):
        check(db, block)


def test_unregistered_producer_is_rejected(chain):
    net, db = chain
    stranger = net.users[0]
    block = next_block(db, net).block
    header = sign(replace(block.header, producer=stranger.public), stranger)
    with pytest.raises(E.WrongProducer):
        check(db, replace(block, header=header))


def test_producer_out_of_turn_is_rejected(chain):
    net, db = chain
    on_time = next_block(db, net, rank=2)  # after 2 slots, rank 2 may produce
    check(db, on_time.block)
    early = resign(on_time.block, net, time_ms=db.tip.time_ms + 1)  # before its slot
    with pytest.raises(E.BadTime, match="rank-2"):
        check(db, early)


def test_header_signed_by_another_node_is_rejected(chain):
    net, db = chain
    block = next_block(db, net).block
    other = producer(db, net, rank=1)
    header = sign(block.header, other)
    with pytest.raises(E.BadSignature):
        check(db, replace(block, header=replace(header, producer=block.header.producer)))


def test_time_too_far_in_future_is_rejected(chain):
    net, db = chain
    block = next_block(db, net).block
    with pytest.raises(E.TimeInFuture):
        check(db, block, now=block.header.time_ms - 16_000)


def test_time_not_after_parent_is_rejected(chain):
    net, db = chain
    block = resign(next_block(db, net).block, net, time_ms=db.tip.time_ms)
    with pytest.raises(E.BadTime):
        check(db, block)


@pytest.mark.parametrize("field, error", [
    ("txs_root", E.BadTxsRoot), ("log_root", E.BadLogRoot), ("log_size", E.BadLogRoot),
    ("state_root", E.BadStateRoot),
])
def test_bad_roots_are_rejected(chain, field, error):
    net, db = chain
    block = next_block(db, net).block
    value = 1 if field == "log_size" else b"\x09" * 32
    with pytest.raises(error):
        check(db, resign(block, net, **{field: value}))


def test_too_many_txs_is_rejected():
    net = make_net(max_block_txs=2)
    db = new_db(net)
    alice, bob = net.users
    txs = [net.transfer(alice, bob.public, 1) for _ in range(3)]
    with pytest.raises(E.TooManyTxs):
        check(db, with_txs(next_block(db, net).block, net, txs))


# -- work, receipts and rewards -----------------------------------------------------------


@pytest.fixture
def job_chain():
    net = make_net(with_job=True)
    return net, new_db(net)


def test_units_are_assigned_by_longest_wait(job_chain):
    net, db = job_chain
    assigned = [db.state.get(UNIT + u).node_key for u in db.state.ids(UNIT)]
    assert len(assigned) == 2 and len(set(assigned)) == 2  # two units go to two nodes


def test_receipt_for_unassigned_unit_is_rejected(job_chain):
    net, db = job_chain
    receipt = receipts_due(db, net)[0]
    others = [k for k in net.nodes if k.public != receipt.node_key]
    stolen = sign(replace(receipt, node_key=others[0].public), others[0])
    with pytest.raises(E.UnassignedReceipt, match="assigned to"):
        check(db, with_txs(next_block(db, net).block, net, [stolen]))
    unknown = sign(replace(receipt, unit_id=b"\x05" * 32), net.node_key(receipt.node_key))
    with pytest.raises(E.UnassignedReceipt, match="not an open unit"):
        check(db, with_txs(next_block(db, net).block, net, [unknown]))


def test_duplicate_receipt_is_rejected(job_chain):
    net, db = job_chain
    receipt = receipts_due(db, net)[0]
    with pytest.raises(E.UnassignedReceipt, match="already"):
        check(db, with_txs(next_block(db, net).block, net, [receipt, receipt]))


def two_section_chain():
    """A chain whose job has two sections: units F0 F1 B1 B0 (indices 0-3)."""
    net = make_net()
    net.genesis = replace(net.genesis, jobs=(job(net.authority, layers=((0, 15), (15, 30))),))
    db = new_db(net)
    due = {db.state.get(UNIT + r.unit_id).index: r for r in receipts_due(db, net)}
    return net, db, due


def hashed(net, receipt, input_byte: int, output_byte: int):
    return sign(replace(receipt, input_hash=bytes([input_byte]) * 32,
                        output_hash=bytes([output_byte]) * 32), net.node_key(receipt.node_key))


def test_receipts_must_chain_with_their_done_neighbours():
    net, db, due = two_section_chain()
    f0, f1, b1, b0 = (due[i] for i in range(4))
    # F1 takes F0's output; B0 takes B1's output; F1 -> B1 (kinds differ) is not a link.
    good = [hashed(net, f0, 1, 2), hashed(net, f1, 2, 3), hashed(net, b1, 9, 4),
            hashed(net, b0, 4, 5)]
    with pytest.raises(E.UnchainedReceipt, match="input hash .* is not the output"):
        check(db, with_txs(next_block(db, net).block, net,
                           [hashed(net, f0, 1, 2), hashed(net, f1, 7, 3)]))
    with pytest.raises(E.UnchainedReceipt, match="output hash .* is not the input"):
        check(db, with_txs(next_block(db, net).block, net,  # later unit first: same rule
                           [hashed(net, b0, 4, 5), hashed(net, b1, 9, 6)]))
    grow(db, net, 1, good[:3])  # chained: accepted, and the hashes are kept
    kept = {db.state.get(UNIT + r.unit_id).index: db.state.get(UNIT + r.unit_id) for r in good}
    assert [(a.input_hash[0], a.output_hash[0], a.done) for a in kept.values()] == \
        [(1, 2, True), (2, 3, True), (9, 4, True), (0, 0, False)]
    with pytest.raises(E.UnchainedReceipt):  # against a neighbour in an earlier block too
        check(db, with_txs(next_block(db, net).block, net, [hashed(net, b0, 8, 5)]))
    grow(db, net, 1, good[3:])
    assert db.state.get(UNIT + b0.unit_id) is None  # the step closed


def test_receipts_of_different_replicas_are_not_chained():
    """Units of other replicas work on other data: their hashes do not link, even
    where their layers meet; within a replica they do."""
    net = make_net()
    units = (UnitTemplate(FORWARD, 0, 10, 0, 0, 0), UnitTemplate(FORWARD, 10, 20, 0, 0, 1),
             UnitTemplate(FORWARD, 20, 30, 0, 0, 1))
    net.genesis = replace(net.genesis, jobs=(sign(replace(job(net.authority), units=units),
                                                   net.authority),))
    db = new_db(net)
    due = {db.state.get(UNIT + r.unit_id).index: r for r in receipts_due(db, net)}
    assert len(due) == 3  # each its own unit id
    grow(db, net, 1, [hashed(net, due[0], 1, 2), hashed(net, due[1], 7, 8)])  # 2 != 7: fine
    assert db.state.get(UNIT + due[1].unit_id).done
    with pytest.raises(E.UnchainedReceipt):  # within replica 1 the link holds
        check(db, with_txs(next_block(db, net).block, net, [hashed(net, due[2], 9, 9)]))
    grow(db, net, 1, [hashed(net, due[2], 8, 9)])


def test_reward_is_minted_only_after_the_challenge_window(job_chain):
    net, db = job_chain
    receipt = receipts_due(db, net)[0]
    owner = next(w for w, n in zip(net.wallets, net.nodes) if n.public == receipt.node_key)
    before = balance(db, owner.public)
    grow(db, net, 1, [receipt])
    assert db.tip.log_size == 1
    window = net.genesis.params.challenge_window
    grow(db, net, window - 1)
    assert balance(db, owner.public) == before  # still in its window
    grow(db, net, 1)
    assert balance(db, owner.public) == before + COIN
    assert db.state.get(KEY_SUPPLY).minted == COIN
    check_supply(db.state)


def test_steps_advance_when_all_units_have_receipts(job_chain):
    net, db = job_chain
    first = set(db.state.ids(UNIT))
    grow(db, net, 1, receipts_due(db, net))
    second = set(db.state.ids(UNIT))
    assert second and not (first & second)  # step 0 closed, step 1 assigned


def test_timed_out_unit_passes_to_another_node(job_chain):
    net, db = job_chain
    uid = db.state.ids(UNIT)[0]
    first = db.state.get(UNIT + uid).node_key
    grow(db, net, net.genesis.params.unit_timeout + 1)
    assert db.state.get(UNIT + uid).node_key != first


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
    chosen.add(real_draw(db.tip_hash, a))  # A's draw at h+2 is seeded by block h+1
    grow(db, net, 1)
    pa = db.state.get(PENDING + a)
    assert pa.status == audit.SAMPLED
    grow(db, net, 1, [_verdict(net, pa, a, GRADIENT_MISMATCH)])  # h+3: A fails
    assert db.state.get(PENDING + b).status == audit.FORCED  # B was drawn, not sampled
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
    """A sampled receipt, passed by its verifier; the block after, its re-check drawn."""
    receipt, rh, first = _sampled(net, db)
    grow(db, net, 1, [_verdict(net, first, rh, PASS, bytes(32))])
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




# -- registration and payments -------------------------------------------------------------


def test_registration_needs_the_minimum_bond(chain):
    net, db = chain
    reg = registration(net.users[0], net.users[1], bond=COIN)
    with pytest.raises(E.BadRegistration, match="minimum"):
        check(db, with_txs(next_block(db, net).block, net, [reg]))


def test_node_key_cannot_be_taken_from_another_account(chain):
    net, db = chain
    reg = registration(net.users[0], net.nodes[0])
    with pytest.raises(E.BadRegistration, match="another account"):
        check(db, with_txs(next_block(db, net).block, net, [reg]))


def test_registration_binding_must_be_signed_by_the_node_key(chain):
    net, db = chain
    reg = registration(net.users[0], net.users[1])
    forged = sign(replace(reg, node_key=net.users[0].public[::-1]), net.users[0])
    with pytest.raises(E.BadSignature, match="binding"):
        check(db, with_txs(next_block(db, net).block, net, [forged]))


def test_new_node_joins_the_producer_rotation(chain):
    net, db = chain
    newcomer = net.users[1]
    grow(db, net, 1, [registration(net.users[0], newcomer)])
    net.nodes.append(newcomer)
    producers = {a.block.header.producer for a in grow(db, net, 4)}
    assert newcomer.public in producers
    assert len(producers) == 4  # every node produced once


@pytest.mark.parametrize("overrides, reason", [
    ({"slash_bps": 10_001}, "basis points"),
    ({"audit_bps": 20_000}, "basis points"),
    ({"recheck_bps": 10_001}, "basis points"),
    ({"unit_timeout": 0}, "at least 1"),
    ({"verdict_window": 0}, "at least 1"),
    ({"challenge_window": 2}, "at least 3"),
    ({"max_block_txs": 0}, "max_block_txs"),
    ({"max_block_txs": 200_000}, "max_block_txs"),
])
def test_genesis_params_are_validated(overrides, reason):
    with pytest.raises(E.BadGenesis, match=reason):
        new_db(make_net(**overrides))


def test_blocks_over_the_byte_limit_are_refused(chain, monkeypatch):
    import ledger.transition as transition
    net, db = chain
    alice, bob = net.users
    txs = [net.transfer(alice, bob.public, 1) for _ in range(3)]
    size = len(encode(txs[0]))
    monkeypatch.setattr(transition, "MAX_BLOCK_BYTES", 2 * size)
    built = next_block(db, net, txs)
    assert len(built.block.txs) == 2  # the producer stops at the limit
    with pytest.raises(E.TooManyTxs, match="bytes"):
        check(db, with_txs(built.block, net, txs))


def test_empty_head_range_is_not_a_unit(chain):
    from ledger.types import UnitTemplate
    net, db = chain
    bad = replace(job(net.authority), units=(UnitTemplate(0, 0, 30, 3, 3),))
    bad = sign(bad, net.authority)
    with pytest.raises(E.BadJob, match="malformed"):
        check(db, with_txs(next_block(db, net).block, net, [bad]))


def test_no_audit_without_another_account_to_verify():
    net = make_net(n_nodes=1, with_job=True, audit_bps=10_000)
    db = new_db(net)
    receipt = receipts_due(db, net)[0]
    grow(db, net, 3, [receipt])
    pending = db.state.get(PENDING + tx_hash(receipt))
    assert pending is None or (pending.status == audit.UNSAMPLED
                               and pending.verifier == bytes(32))


def test_a_verifier_must_have_registered_by_the_receipts_block():
    net = make_net(n_nodes=1, with_job=True, audit_bps=10_000)
    db = new_db(net)
    newcomer = net.users[1]
    receipt = receipts_due(db, net)[0]
    grow(db, net, 1, [receipt])
    # Registered in block h+1, whose hash seeds the draw: too late to be drawn.
    grow(db, net, 1, [registration(net.users[0], newcomer)])
    net.nodes.append(newcomer)
    grow(db, net, 1)
    pending = db.state.get(PENDING + tx_hash(receipt))
    assert pending.status == audit.UNSAMPLED and pending.verifier == bytes(32)
    later = next(r for r in receipts_due(db, net) if r.node_key != newcomer.public)
    grow(db, net, 3, [later])
    assert db.state.get(PENDING + tx_hash(later)).verifier == newcomer.public


def test_genesis_refuses_parameters_under_which_cheating_pays():
    with pytest.raises(E.BadGenesis, match="cheating would pay"):
        new_db(make_net(audit_bps=500, slash_bps=1000))  # 1 coin slashed vs 19 rewards
    new_db(make_net(audit_bps=1000, slash_bps=10_000))  # 10 coins vs 9: it does not pay
def test_reward_must_be_in_range():
    with pytest.raises(E.BadGenesis, match="reward"):
        new_db(make_net(reward=0))


def test_minting_stops_at_the_u64_supply_cap():
    from ledger.types import Allocation
    net = make_net(with_job=True)
    room = COIN // 2  # less than one reward left under the cap
    held = sum(a.amount for a in net.genesis.allocations)
    whale = Allocation(b"\x77" * 32, 2**64 - 1 - held - room)
    net.genesis = replace(net.genesis, allocations=net.genesis.allocations + (whale,))
    db = new_db(net)
    grow(db, net, 1, receipts_due(db, net))
    grow(db, net, net.genesis.params.challenge_window + 1)
    assert db.state.get(KEY_SUPPLY).minted == 0 and not db.state.ids(PENDING)
    check_supply(db.state)
