"""Jailing: a node that lets a unit's deadline pass goes to the back of the unit queue."""

from __future__ import annotations

from ledger.schedule import Candidate, assign_units
from ledger.state import JAIL, NODE, UNIT
from tests.ledger.chainkit import grow, make_net, new_db, receipts_due

SEED = b"\x07" * 32


def _cand(i: int, served: int, jailed_until: int = 0) -> Candidate:
    return Candidate(bytes([i]) * 32, served, 0, 30, jailed_until)


def test_a_jailed_node_comes_after_every_free_node_however_long_it_waited():
    old_but_jailed, fresh = _cand(1, 0, jailed_until=50), _cand(2, 40)
    assert assign_units([(0, 30)], [old_but_jailed, fresh], SEED, 45) == [fresh.node_key]
    # Its term over (until <= height), the wait counts again.
    assert assign_units([(0, 30)], [old_but_jailed, fresh], SEED, 50) == [old_but_jailed.node_key]


def test_a_jailed_node_still_takes_a_unit_no_free_node_covers():
    jailed = _cand(1, 0, jailed_until=99)
    narrow = Candidate(b"\x02" * 32, 0, 0, 10)  # free, but does not cover 10:30
    assert assign_units([(0, 10), (10, 30)], [jailed, narrow], SEED, 5) == \
        [narrow.node_key, jailed.node_key]


def _account(db, node_key: bytes) -> bytes:
    return db.state.get(NODE + node_key).account


def _assignees(db) -> list[bytes]:
    return [db.state.get(UNIT + u).node_key for u in db.state.ids(UNIT)]


def test_missing_a_deadline_jails_the_node_and_its_units_go_to_a_free_one():
    net = make_net(with_job=True)
    db = new_db(net)
    timeout = net.genesis.params.unit_timeout
    late = set(_assignees(db))  # two units (F0, B0) on two of the three nodes
    grow(db, net, timeout + 1)
    height = db.tip.height
    for node_key in late:
        jail = db.state.get(JAIL + _account(db, node_key))
        assert (jail.until, jail.strikes) == (height + timeout, 1)
    free = {k.public for k in net.nodes} - late
    assert set(_assignees(db)) == free  # both units to the one node not in jail
    assert db.state.get(JAIL + _account(db, free.pop())) is None


def test_each_missed_deadline_doubles_the_term():
    net = make_net(n_nodes=1, with_job=True)  # no other node: the same one keeps the units
    db = new_db(net)
    timeout, node_key = net.genesis.params.unit_timeout, net.nodes[0].public
    terms = []
    for _ in range(3):
        grow(db, net, timeout + 1)
        jail = db.state.get(JAIL + _account(db, node_key))
        terms.append((jail.until - db.tip.height, jail.strikes))
    assert terms == [(timeout, 1), (2 * timeout, 2), (4 * timeout, 3)]
    assert set(_assignees(db)) == {node_key}  # jailed, yet the job goes on with it


def test_a_receipt_after_the_term_clears_the_record_one_during_it_does_not():
    net = make_net(n_nodes=1, with_job=True)
    db = new_db(net)
    timeout, node_key = net.genesis.params.unit_timeout, net.nodes[0].public
    grow(db, net, timeout + 1)  # strike 1: jailed until now + timeout
    key = JAIL + _account(db, node_key)
    grow(db, net, 1, receipts_due(db, net)[:1])  # works again while still jailed
    assert db.state.get(key).strikes == 1
    until = db.state.get(key).until
    grow(db, net, until - db.tip.height - 1)
    grow(db, net, 1, receipts_due(db, net))  # in the block at height == until
    assert db.state.get(key) is None
