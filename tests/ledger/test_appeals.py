"""Appeals (specs/pol.md 6.6): a failed worker's appeal, its fresh verifiers, and who pays."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ledger import audit
from ledger.auditrules import settle_pending
from ledger import errors as E
from ledger.state import (
    ACCOUNT, APPEAL, JAIL, KEY_PARAMS, KEY_SUPPLY, NODE, PENDING, Overlay, check_supply,
)
from ledger.types import (
    GRADIENT_MISMATCH, OUTPUT_MISMATCH, PASS, UNAVAILABLE, ZERO_SIG, Appeal, Verdict, sign,
    tx_hash,
)
from tests.ledger.chainkit import (
    CHAIN, check_block as check, grow, make_net, new_db, next_block, receipts_due, with_txs,
)

EVIDENCE = b"\x07" * 32


@pytest.fixture
def failed():
    """Six nodes of six accounts, every receipt audited; one receipt failed by its verifier."""
    return failed_on(6)


def failed_on(n_nodes: int):
    """A chain of ``n_nodes`` nodes, every receipt audited, where a verifier failed one."""
    net = make_net(n_nodes=n_nodes, with_job=True, audit_bps=10_000)
    db = new_db(net)
    receipt = receipts_due(db, net)[0]
    grow(db, net, 1, [receipt])
    rh = tx_hash(receipt)
    grow(db, net, 2)
    pending = db.state.get(PENDING + rh)
    assert pending.status == audit.SAMPLED
    grow(db, net, 1, [_verdict(net, pending.verifier, rh, OUTPUT_MISMATCH)])
    assert db.state.get(PENDING + rh).status == audit.FAILED
    return net, db, receipt, rh, pending


def _verdict(net, verifier, rh, reason, evidence=EVIDENCE):
    key = net.node_key(verifier)
    return sign(Verdict(CHAIN, key.public, rh, reason, evidence, ZERO_SIG), key)


def _appeal(net, node_key, rh):
    key = net.node_key(node_key)
    return sign(Appeal(CHAIN, key.public, rh, ZERO_SIG), key)


def _appealing(net, db, receipt, rh):
    """Appeal in block b; the appeal's verifiers are drawn at b + 2."""
    grow(db, net, 1, [_appeal(net, receipt.node_key, rh)])
    assert db.state.get(PENDING + rh).status == audit.APPEAL_DUE
    grow(db, net, 1)
    assert db.state.get(PENDING + rh).status == audit.APPEAL_DUE  # not from b's own beacon
    grow(db, net, 1)
    pending = db.state.get(PENDING + rh)
    assert pending.status == audit.APPEALING
    return pending, db.state.get(APPEAL + rh)


def _account(db, key):
    return db.state.get(NODE + key).account


def test_the_appeal_draws_three_fresh_verifiers_of_other_accounts(failed):
    net, db, receipt, rh, pending = failed
    appealing, record = _appealing(net, db, receipt, rh)
    accounts = [_account(db, k) for k in record.verifiers]
    assert len(record.verifiers) == audit.APPEAL_VERIFIERS == len(set(accounts))
    assert not {pending.account, _account(db, pending.verifier)} & set(accounts)
    assert record.votes == (audit.NO_VOTE,) * 3
    assert appealing.final_height == db.height + db.state.get(KEY_PARAMS).verdict_window


def test_a_won_appeal_slashes_the_accuser_and_pays_the_worker(failed):
    """The malicious-verifier attack: its fail falls, its bond burns, the worker's stays."""
    net, db, receipt, rh, pending = failed
    _, record = _appealing(net, db, receipt, rh)
    accuser = _account(db, pending.verifier)
    before = {a: db.state.get(ACCOUNT + a) for a in (pending.account, accuser)}
    burned = db.state.get(KEY_SUPPLY).burned
    votes = [_verdict(net, record.verifiers[0], rh, PASS, bytes(32)),
             _verdict(net, record.verifiers[1], rh, PASS, bytes(32)),
             _verdict(net, record.verifiers[2], rh, GRADIENT_MISMATCH)]
    grow(db, net, 1, votes)  # every vote in: decided at once, 2 passes to 1 fail
    params = db.state.get(KEY_PARAMS)
    assert db.state.get(PENDING + rh) is None and db.state.get(APPEAL + rh) is None
    worker = db.state.get(ACCOUNT + pending.account)
    assert worker.bond == before[pending.account].bond
    assert worker.balance == before[pending.account].balance + params.reward
    assert db.state.get(ACCOUNT + accuser).bond == 0  # slash_bps 10000: the whole bond
    assert db.state.get(JAIL + accuser).strikes >= 1
    assert db.state.get(KEY_SUPPLY).burned == burned + before[accuser].bond
    check_supply(db.state)


def test_a_lost_appeal_slashes_the_worker_and_pays_each_voter(failed):
    net, db, receipt, rh, pending = failed
    _, record = _appealing(net, db, receipt, rh)
    voters = [_account(db, k) for k in record.verifiers]
    paid = {a: db.state.get(ACCOUNT + a).balance for a in voters}
    bond = db.state.get(ACCOUNT + pending.account).bond
    votes = [_verdict(net, record.verifiers[0], rh, OUTPUT_MISMATCH),
             _verdict(net, record.verifiers[1], rh, PASS, bytes(32)),
             _verdict(net, record.verifiers[2], rh, UNAVAILABLE, bytes(32))]
    grow(db, net, 1, votes)  # one pass, one fail: not more passes, so the fail stands
    assert db.state.get(PENDING + rh) is None
    assert db.state.get(ACCOUNT + pending.account).bond == 0 < bond
    assert db.state.get(ACCOUNT + _account(db, pending.verifier)).bond > 0
    fee = db.state.get(KEY_PARAMS).verify_fee
    assert [db.state.get(ACCOUNT + a).balance - paid[a] for a in voters] == [fee, fee, 0]
    check_supply(db.state)


def test_silent_appeal_verifiers_are_struck_and_decide_nothing(failed):
    """Settled at the final height alone (units timing out strike nodes in the blocks too)."""
    net, db, receipt, rh, pending = failed
    appealing, record = _appealing(net, db, receipt, rh)
    grow(db, net, 1, [_verdict(net, record.verifiers[0], rh, PASS, bytes(32))])
    st = Overlay(db.state)
    strikes = lambda k: getattr(st.get(JAIL + _account(db, k)), "strikes", 0)  # noqa: E731
    before = {k: strikes(k) for k in record.verifiers}
    settle_pending(st, SimpleNamespace(height=appealing.final_height))
    assert st.get(PENDING + rh) is None  # one pass, no fail: the appeal is won
    assert st.account(_account(db, pending.verifier)).bond == 0
    assert [strikes(k) - before[k] for k in record.verifiers] == [0, 1, 1]


def test_an_appeal_nobody_votes_on_leaves_the_fail_standing(failed):
    net, db, receipt, rh, pending = failed
    appealing, _ = _appealing(net, db, receipt, rh)
    grow(db, net, appealing.final_height - db.height)
    assert db.state.get(PENDING + rh) is None
    assert db.state.get(ACCOUNT + pending.account).bond == 0


def test_appeals_that_cannot_be_taken(failed):
    net, db, receipt, rh, pending = failed
    stranger = next(k for k in net.nodes if k.public != receipt.node_key)
    with pytest.raises(E.BadAppeal, match="only the node that signed"):
        check(db, with_txs(next_block(db, net).block, net, [_appeal(net, stranger.public, rh)]))
    with pytest.raises(E.BadAppeal, match="no failing verdict"):
        check(db, with_txs(next_block(db, net).block, net,
                           [_appeal(net, receipt.node_key, b"\x01" * 32)]))
    _, record = _appealing(net, db, receipt, rh)
    with pytest.raises(E.BadAppeal, match="no failing verdict"):  # not twice
        check(db, with_txs(next_block(db, net).block, net, [_appeal(net, receipt.node_key, rh)]))
    outsider = next(k for k in net.nodes if k.public not in record.verifiers)
    with pytest.raises(E.BadVerdict, match="not drawn for this appeal"):
        check(db, with_txs(next_block(db, net).block, net,
                           [_verdict(net, outsider.public, rh, PASS, bytes(32))]))
    grow(db, net, 1, [_verdict(net, record.verifiers[0], rh, PASS, bytes(32))])
    with pytest.raises(E.BadVerdict, match="voted on the appeal already"):
        check(db, with_txs(next_block(db, net).block, net,
                           [_verdict(net, record.verifiers[0], rh, PASS, bytes(32))]))


def test_an_appeal_window_that_closes_slashes_the_worker(failed):
    net, db, receipt, rh, pending = failed
    grow(db, net, db.state.get(KEY_PARAMS).verdict_window)
    with pytest.raises(E.BadAppeal):
        check(db, with_txs(next_block(db, net).block, net, [_appeal(net, receipt.node_key, rh)]))
    assert db.state.get(ACCOUNT + pending.account).bond == 0


def test_with_no_one_left_to_judge_the_appeal_the_fail_stands():
    net, db, receipt, rh, pending = failed_on(2)  # the worker and its accuser
    grow(db, net, 1, [_appeal(net, receipt.node_key, rh)])
    grow(db, net, 2)
    assert db.state.get(PENDING + rh) is None
    assert db.state.get(ACCOUNT + pending.account).bond == 0
