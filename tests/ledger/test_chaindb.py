"""The chain database: extension, side branches, reorgs, persistence."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ledger import errors as E, schema
from ledger.chaindb import EXTENDED, KNOWN, REORG, SIDE, ChainDB
from ledger.codec import decode, encode
from ledger.state import ACCOUNT, state_root
from ledger.store import LevelDBStore, MemoryStore
from ledger.types import COIN, Receipt, tx_hash
from ledger.records import Account
from tests.ledger.chainkit import (
    balance, copy_chain, grow, make_net, new_db, next_block, receipts_due,
)


def branch(db, net, n, rank, spend_to, nonce, amount=60 * COIN):
    """Grow ``db`` by n blocks of the rank-``rank`` producer; the first spends ``amount``."""
    alice = net.users[0]
    blocks = []
    for i in range(n):
        txs = receipts_due(db, net)
        if i == 0:
            txs.append(net.transfer(alice, spend_to, amount, nonce=nonce))
        applied = next_block(db, net, txs, rank=rank)
        assert db.add_block(applied.block, now_ms=None).status == EXTENDED
        blocks.append(applied.block)
    return blocks


@pytest.fixture(params=["memory", "leveldb"])
def store_factory(request, tmp_path):
    if request.param == "memory":
        return lambda name: MemoryStore()
    return lambda name: LevelDBStore(tmp_path / name)


def test_reorg_of_depth_5_and_back(store_factory):
    net = make_net(n_nodes=3, with_job=True)
    main = new_db(net, store_factory("main"))
    grow(main, net, 2, receipts_due(main, net))
    fork_height = main.height
    db_a, db_b = copy_chain(net, main), copy_chain(net, main)
    bob, carol = net.users[1].public, net.wallets[0].public
    a_blocks = branch(db_a, net, 5, rank=1, spend_to=bob, nonce=0)    # 5 x weight 2^31
    b_blocks = branch(db_b, net, 3, rank=0, spend_to=carol, nonce=0)  # 3 x weight 2^32

    for block in a_blocks:
        assert main.add_block(block, now_ms=None).status == EXTENDED
    assert main.add_block(b_blocks[0], now_ms=None).status == SIDE
    assert main.add_block(b_blocks[1], now_ms=None).status == SIDE
    result = main.add_block(b_blocks[2], now_ms=None)
    assert (result.status, result.reorg_depth) == (REORG, 5)
    _assert_same_chain(main, db_b, fork_height)
    alice = net.users[0].public
    assert balance(main, bob) == 100 * COIN  # branch A's spend to bob is undone
    assert balance(main, alice) == 40 * COIN  # branch B's spend to carol stands
    assert balance(main, carol) == balance(db_b, carol)
    main.verify_chain()

    # A grows heavier again: the chain switches back, replaying undone blocks.
    more_a = branch(db_a, net, 2, rank=1, spend_to=bob, nonce=1, amount=30 * COIN)
    statuses = [main.add_block(b, now_ms=None).status for b in more_a]
    # A6 ties B on weight (the lower tip hash wins the tie); A7 outweighs B.
    assert REORG in statuses and main.tip_hash == db_a.tip_hash
    _assert_same_chain(main, db_a, fork_height)
    assert balance(main, bob) == 190 * COIN and balance(main, alice) == 10 * COIN
    main.verify_chain()


def _assert_same_chain(db: ChainDB, reference: ChainDB, fork_height: int) -> None:
    assert db.tip_hash == reference.tip_hash
    assert state_root(db.state) == state_root(reference.state) == db.tip.state_root
    for h in range(db.height + 1):
        assert db.hash_at(h) == reference.hash_at(h)
    assert db.hash_at(db.height + 1) is None
    assert db.log_leaves() == reference.log_leaves()
    for leaf in db.log_leaves():
        receipt = decode(leaf, Receipt)
        assert db.receipt_index(tx_hash(receipt)) == reference.receipt_index(tx_hash(receipt))


def test_abandoned_branch_receipts_leave_the_index():
    net = make_net(with_job=True)
    main = new_db(net)
    db_b = copy_chain(net, main)
    a = branch(main, net, 1, rank=2, spend_to=net.users[1].public, nonce=0)
    abandoned = [tx for tx in a[0].txs if isinstance(tx, Receipt)]
    assert abandoned and main.receipt_index(tx_hash(abandoned[0])) is not None
    b = branch(db_b, net, 1, rank=0, spend_to=net.users[1].public, nonce=0)
    assert main.add_block(b[0], now_ms=None).status == REORG
    kept = {tx_hash(tx) for tx in b[0].txs if isinstance(tx, Receipt)}
    for receipt in abandoned:
        if tx_hash(receipt) not in kept:
            assert main.receipt_index(tx_hash(receipt)) is None


def test_known_unknown_and_invalid_blocks():
    net = make_net()
    db = new_db(net)
    applied = next_block(db, net)
    assert db.add_block(applied.block, now_ms=None).status == EXTENDED
    assert db.add_block(applied.block, now_ms=None).status == KNOWN
    orphan = replace(applied.block, header=replace(applied.block.header, prev_hash=b"\x01" * 32))
    with pytest.raises(E.UnknownParent):
        db.add_block(orphan, now_ms=None)
    bad = next_block(db, net).block
    bad = replace(bad, header=replace(bad.header, state_root=b"\x02" * 32))
    keys_before = list(db.store.iterate())
    with pytest.raises(E.ValidationError):
        db.add_block(bad, now_ms=None)
    assert list(db.store.iterate()) == keys_before  # nothing written


def test_leveldb_chain_survives_reopen(tmp_path):
    net = make_net(with_job=True)
    db = new_db(net, LevelDBStore(tmp_path / "chain"))
    for _ in range(4):
        grow(db, net, 1, receipts_due(db, net) + [net.transfer(net.users[0], net.users[1].public, COIN)])
    tip, root = db.tip_hash, state_root(db.state)
    db.close()
    with ChainDB(LevelDBStore(tmp_path / "chain")) as again:
        assert again.tip_hash == tip and state_root(again.state) == root
        again.verify_chain()
        grow(again, net, 1)  # and it goes on


def test_close_closes_the_store_and_is_idempotent(store_factory):
    net = make_net()
    db = new_db(net, store_factory("chain"))
    grow(db, net, 1)
    db.close()
    db.close()  # a second close does nothing
    with pytest.raises(E.StoreClosedError):
        db.block_at(1)


def test_with_closes_the_store_on_an_exception(store_factory):
    net = make_net()
    store = store_factory("chain")
    with pytest.raises(RuntimeError, match="boom"):
        with new_db(net, store) as db:
            grow(db, net, 1)
            raise RuntimeError("boom")
    with pytest.raises(E.StoreClosedError):
        store.get(schema.TIP)


def test_with_closes_the_store_on_success_and_it_reopens(tmp_path):
    net = make_net()
    with new_db(net, LevelDBStore(tmp_path / "chain")) as db:
        tip = grow(db, net, 2)[-1].hash
    with ChainDB(LevelDBStore(tmp_path / "chain")) as again:  # the lock went with the close
        assert again.tip_hash == tip


def test_open_refuses_a_store_whose_state_disagrees_with_its_tip():
    net = make_net()
    db = new_db(net)
    grow(db, net, 2)
    db.store.write([(schema.state_key(ACCOUNT + b"\x42" * 32), encode(Account(5, 0, 0, 0)))])
    with pytest.raises(E.StoreCorruptError, match="does not match the tip"):
        ChainDB(db.store)


def test_open_refuses_an_empty_store():
    with pytest.raises(E.StoreCorruptError, match="no chain"):
        ChainDB(MemoryStore())


def test_verify_chain_finds_a_tampered_block():
    net = make_net()
    db = new_db(net)
    grow(db, net, 3, [])
    block = db.block_at(2)
    forged = replace(block, header=replace(block.header, time_ms=block.header.time_ms + 1))
    db.store.write([(schema.block_key(db.hash_at(2)), encode(forged))])
    with pytest.raises(E.BadSignature, match="height 2"):
        db.verify_chain()


def test_reorg_moves_transactions_between_mempool_and_chain():
    net = make_net()
    main = new_db(net)
    db_b = copy_chain(net, main)
    bob, carol = net.users[1], net.users[0]
    abandoned = branch(main, net, 1, rank=1, spend_to=bob.public, nonce=0, amount=7 * COIN)[0]
    # The abandoned block also held a transfer of bob's, which the winning branch lacks.
    winner = branch(db_b, net, 1, rank=0, spend_to=bob.public, nonce=0, amount=9 * COIN)[0]
    main.add_to_mempool(winner.txs[0])  # also queued locally
    bobs = net.transfer(bob, carol.public, COIN, nonce=0)
    main.add_to_mempool(bobs)
    assert main.add_block(winner, now_ms=None).status == REORG
    queued = main.mempool()
    assert bobs in queued                   # still applies: kept
    assert winner.txs[0] not in queued      # the winner's tx left it ...
    # ... and the abandoned transfer, whose nonce the winner used, can never apply: gone.
    assert abandoned.txs[-1] not in queued
    assert bobs in next_block(main, net, queued).block.txs


def test_transactions_that_can_never_apply_leave_the_mempool():
    """Issue 28: the loser of a same-nonce race stayed queued for good, as did a job the
    rules refuse whatever the state; one that may still apply (a nonce gap) stays."""
    from ledger.jobrules import MAX_JOB_STEPS
    from tests.ledger.chainkit import job
    net = make_net()
    db = new_db(net)
    alice, bob = net.users
    spent = net.transfer(alice, bob.public, COIN, nonce=0)
    racer = net.transfer(alice, bob.public, 2 * COIN, nonce=0)  # the same nonce
    later = net.transfer(alice, bob.public, COIN, nonce=5)  # a gap: may fit one day
    endless = job(net.authority, steps=MAX_JOB_STEPS + 1)
    for tx in (racer, later, endless):
        db.add_to_mempool(tx)
    grow(db, net, 1, [spent])
    assert db.mempool() == [later]
def test_forks_deeper_than_the_limit_are_refused(monkeypatch):
    import ledger.chaindb as chaindb
    monkeypatch.setattr(chaindb, "MAX_REORG_DEPTH", 3)
    net = make_net()
    main = new_db(net)
    side = copy_chain(net, main)
    grow(main, net, 4)
    fork_block = next_block(side, net, rank=1).block
    with pytest.raises(E.ForkTooDeep):
        main.add_block(fork_block, now_ms=None)
