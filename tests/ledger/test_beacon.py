"""The block beacon on a real chain: checked, not chosen by its producer, re-drawn only by
withholding."""

from __future__ import annotations

import pytest

from ledger import audit, beacon, vrf
from ledger import errors as E
from ledger.state import KEY_BEACON
from tests.ledger.chainkit import CHAIN, grow, make_net, new_db, next_block, producer, resign


@pytest.fixture
def chain():
    net = make_net(n_nodes=3, with_job=True)
    db = new_db(net)
    grow(db, net, 2)
    return net, db


def check(db, block):
    db.add_block(block, now_ms=block.header.time_ms)


def test_block_zero_holds_the_chain_ids_beacon():
    db = new_db(make_net())
    assert db.tip.vrf_proof == beacon.NO_PROOF
    assert db.state.get(KEY_BEACON).value == beacon.genesis_beacon(CHAIN)
    assert beacon.genesis_beacon(CHAIN) != beacon.genesis_beacon(CHAIN + "x")


def test_each_block_sets_the_beacon_from_its_producers_proof(chain):
    net, db = chain
    parent = db.state.get(KEY_BEACON).value
    applied = next_block(db, net)
    h = applied.block.header
    expected = beacon.beacon_from_proof(h.producer, parent, h.height, h.vrf_proof)
    check(db, applied.block)
    assert db.state.get(KEY_BEACON).value == expected != parent


def test_a_producer_cannot_grind_the_beacon(chain):
    """Every variant of its block (here: other times) has one beacon."""
    net, db = chain
    variants = [next_block(db, net, time_ms=db.tip.time_ms + dt) for dt in (1, 7, 500, 999)]
    assert len({a.block.header.vrf_proof for a in variants}) == 1
    assert len({a.hash for a in variants}) == len(variants)  # the hashes it could grind differ
    assert len({a.writes[KEY_BEACON].value for a in variants}) == 1


def test_withholding_hands_the_draw_to_the_next_producer(chain):
    """The one choice left to a producer: not to publish, and the rank-1 node's beacon differs."""
    net, db = chain
    first, second = next_block(db, net, rank=0), next_block(db, net, rank=1)
    assert first.writes[KEY_BEACON] != second.writes[KEY_BEACON]


def test_a_proof_over_another_input_or_by_another_key_is_refused(chain):
    net, db = chain
    block = next_block(db, net).block
    h = block.header
    key = producer(db, net)
    stale = vrf.prove(key.seed(), beacon.vrf_input(db.state.get(KEY_BEACON).value, h.height - 1))
    with pytest.raises(E.BadBeacon):
        check(db, resign(block, net, vrf_proof=stale))
    other = producer(db, net, rank=1)
    foreign = vrf.prove(other.seed(), beacon.vrf_input(db.state.get(KEY_BEACON).value, h.height))
    with pytest.raises(E.BadBeacon):
        check(db, resign(block, net, vrf_proof=foreign))
    with pytest.raises(E.BadBeacon):
        check(db, resign(block, net, vrf_proof=bytes(80)))
    check(db, block)  # the honest one still goes in


def test_the_audit_seed_is_the_beacon_not_the_block_hash(chain):
    """A receipt's draw reads the beacon of the block after it: ground variants agree."""
    net, db = chain
    variants = [next_block(db, net, time_ms=db.tip.time_ms + dt) for dt in (1, 2, 3)]
    receipt = b"\x42" * 32
    seeds = {audit.audit_seed(a.writes[KEY_BEACON].value, receipt) for a in variants}
    assert len(seeds) == 1
