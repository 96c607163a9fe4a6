"""Block and transaction rules: every rejection has its own typed error."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ledger import errors as E
from ledger.codec import encode
from ledger import audit
from ledger.state import KEY_SUPPLY, PENDING, UNIT, check_supply
from ledger.types import COIN, sign, tx_hash
from ledger.types import FORWARD, UnitTemplate
from tests.ledger.chainkit import (
    check_block, resign, with_txs, balance, grow, job, make_net, new_db, next_block, producer, receipts_due, registration,
)

EVIDENCE = b"\x07" * 32  # a failing verdict must name its evidence


@pytest.fixture
def chain():
    net = make_net()
    return net, new_db(net)


check = check_block  # the name every test here reads


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
    # A fifth of the nodes colluding (withholding blocks, passing their own):
    # caught 0.065 of the time, so a 10-coin bond loses to 14.3 rewards.
    with pytest.raises(E.BadGenesis, match="cartel_bps 2000"):
        new_db(make_net(audit_bps=1000, slash_bps=10_000, cartel_bps=2000, min_bond=10 * COIN))
    new_db(make_net(audit_bps=1000, slash_bps=10_000, cartel_bps=0, min_bond=10 * COIN))


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
