"""Invariants under random histories (hypothesis).

- Whatever a producer builds from any mix of valid and invalid transactions,
  an independent replica accepts, reaching the same state root.
- Balances + bonds always equal premine + minted - burned.
- The state root is a function of the records alone, not of write order.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from ledger.state import ACCOUNT, KEY_SUPPLY, MemoryState, check_supply, state_root
from ledger.types import COIN
from ledger.records import Account
from tests.ledger.chainkit import make_net, new_db, next_block, receipts_due

ops = st.lists(
    st.tuples(
        st.integers(0, 3),                 # sender (index into users)
        st.integers(0, 3),                 # recipient
        st.integers(0, 150 * COIN),        # amount (some overspend)
        st.integers(-1, 2),                # nonce offset: -1 replay, 0 ok, >0 gap
        st.booleans(),                     # end the block after this op
    ),
    max_size=30,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, st.integers(0, 2))
def test_built_blocks_validate_on_a_replica_and_conserve_supply(history, rank):
    net = make_net(n_nodes=3, n_users=4, with_job=True)
    producer_db, replica = new_db(net), new_db(net)
    pending = []
    for sender, recipient, amount, offset, seal in history + [(0, 1, 1, 0, True)]:
        user = net.users[sender]
        nonce = producer_db.state.get(ACCOUNT + user.public).nonce + offset
        nonce += sum(1 for t in pending if t.sender == user.public)
        if nonce >= 0:
            pending.append(net.transfer(user, net.users[recipient].public, amount, nonce=nonce))
        if seal:
            applied = next_block(producer_db, net, receipts_due(producer_db, net) + pending,
                                 rank=rank)
            producer_db.add_block(applied.block, now_ms=applied.block.header.time_ms)
            replica.add_block(applied.block, now_ms=applied.block.header.time_ms)
            assert state_root(replica.state) == state_root(producer_db.state)
            check_supply(replica.state)
            pending = []
    supply = replica.state.get(KEY_SUPPLY)
    assert supply.premine == 7 * 100 * COIN


@given(st.lists(st.tuples(st.binary(min_size=32, max_size=32), st.integers(0, 2**40)),
                max_size=20, unique_by=lambda t: t[0]), st.randoms())
def test_state_root_does_not_depend_on_write_order(records, rnd):
    writes = {ACCOUNT + k: Account(v, 0, 0, 0) for k, v in records}
    shuffled = list(writes.items())
    rnd.shuffle(shuffled)
    one = MemoryState(writes)
    other = MemoryState()
    for key, record in shuffled:
        other.apply({key: record})
    assert state_root(one) == state_root(other)
