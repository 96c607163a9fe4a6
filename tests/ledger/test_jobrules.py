"""Jobs anyone can post: deposits, paying work out of them, refunds, and the one-job queue.

Real chains (`chainkit`): every block is built and then validated by the
same rules; the supply invariant is checked after each.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ledger import errors as E
from ledger.jobrules import MAX_JOB_STEPS, STALL_TIMEOUTS, check_sizes, job_cost
from ledger.state import JAIL, JOB, KEY_SUPPLY, PENDING, UNIT, check_supply
from ledger.types import COIN, sign, tx_hash
from tests.ledger.chainkit import (
    balance, grow, job, key, make_net, new_db, next_block, receipts_due,
)
from tests.ledger.test_transition import check, with_txs


@pytest.fixture
def chain():
    net = make_net()
    return net, new_db(net)


def _post(db, net, *jobs):
    grow(db, net, 1, list(jobs))
    return [db.state.get(JOB + tx_hash(j)) for j in jobs]


def _work_until_done(db, net, job_ids, limit=60):
    """Receipts for every open unit, block after block, until the jobs are finished and settled."""
    for _ in range(limit):
        grow(db, net, 1, receipts_due(db, net))
        check_supply(db.state)
        records = [db.state.get(JOB + j) for j in job_ids]
        if all(r.step == r.job.steps and r.escrow == 0 for r in records) and \
                not any(db.state.get(PENDING + h).job_id in job_ids for h in db.state.ids(PENDING)):
            return
    raise AssertionError("the jobs did not finish")


def test_a_paid_job_pays_its_miners_from_its_deposit_and_refunds_the_rest(chain):
    net, db = chain
    user = net.users[0]
    cost = job_cost(db.state.get(b"Mparams"), 3, 2)
    assert cost == 3 * 2 * 3 * COIN  # reward 1 + two fees of 1, per unit
    paid = job(user, steps=3, deposit=cost + 5 * COIN)
    before = {w.public: balance(db, w.public) for w in net.wallets}
    minted = db.state.get(KEY_SUPPLY).minted
    (record,) = _post(db, net, paid)
    assert balance(db, user.public) == 100 * COIN - cost - 5 * COIN
    assert record.escrow == cost + 5 * COIN and record.started
    _work_until_done(db, net, [tx_hash(paid)])
    earned = sum(balance(db, w.public) - before[w.public] for w in net.wallets)
    assert earned == 3 * 2 * COIN  # one reward per unit: no audits on this chain
    assert db.state.get(KEY_SUPPLY).minted == minted  # not a coin minted for it
    assert balance(db, user.public) == 100 * COIN - earned  # the rest came back
    assert db.state.get(JOB + tx_hash(paid)).escrow == 0


def test_the_authoritys_job_is_still_minted(chain):
    net, db = chain
    minted = db.state.get(KEY_SUPPLY).minted
    _post(db, net, job(net.authority, steps=2))
    _work_until_done(db, net, [tx_hash(job(net.authority, steps=2))])
    assert db.state.get(KEY_SUPPLY).minted == minted + 2 * 2 * COIN


def job_cost_of(steps, units=2):
    return steps * units * 3 * COIN  # reward 1 + two fees of 1 (TEST_PARAMS), per unit


def _wrong_spec(tx):
    return sign(replace(tx, spec=b'{"other":1}'), key(300))


@pytest.mark.parametrize("make, error, words", [
    (lambda net: job(net.users[0]), E.BadJob, "pays its miners from its deposit"),
    (lambda net: job(net.users[0], deposit=job_cost_of(3) - 1), E.BadJob, "deposit short"),
    (lambda net: job(net.users[0], steps=20, deposit=job_cost_of(20)), E.InsufficientFunds,
     "deposit"),
    (lambda net: _wrong_spec(job(net.users[0], deposit=job_cost_of(3))), E.BadJob, "spec"),
    # Beyond the bound even for the authority, whose jobs are minted (issue 28: 10^12 steps).
    (lambda net: job(net.authority, steps=MAX_JOB_STEPS + 1), E.BadJob, "at most 10000000 steps"),
    (lambda net: job(net.authority, steps=10**12), E.BadJob, "at most"),
    # Sizes that can never run (issue 28, item 8), as the canonical spec states them.
    (lambda net: job(net.authority, spec=b'{"model":{"max_seq_len":128},"seq_len":129}'),
     E.BadJob, "seq_len 129 is more than the model's max_seq_len 128"),
    (lambda net: job(net.authority, spec=b'{"model":{"n_layers":4}}'), E.BadJob,
     "outside the model's 4 layers"),
    (lambda net: job(net.authority, spec=b'{"data":{"n_chars":64,"source":"synthetic"},'
                                         b'"seq_len":64}'), E.BadJob, "shorter than one sample"),
])
def test_bad_jobs_are_refused(chain, make, error, words):
    net, db = chain
    with pytest.raises(error, match=words):
        check(db, with_txs(next_block(db, net).block, net, [make(net)]))


def test_sizes_a_job_can_run_with_pass():
    from compute.data import DataSpec, JobConfig
    from compute.jobfile import config_json

    fits = config_json(JobConfig(seq_len=64, data=DataSpec(n_chars=65))).encode()
    check_sizes(job(key(1), spec=fits, layers=((0, 2), (2, 4))))  # the default model's 4
    with pytest.raises(E.BadJob, match="shorter than one sample"):
        check_sizes(job(key(1), spec=fits.replace(b'"n_chars":65', b'"n_chars":64'),
                        layers=((0, 4),)))
    for spec in (b"not json", b"[1]", b'{"seq_len":true,"model":{"max_seq_len":1}}',
                 b'{"model":"x","data":7}'):  # no config: left to the give-up, not refused
        check_sizes(job(key(1), spec=spec))


def test_a_paid_job_goes_first_and_a_started_job_is_never_overtaken(chain):
    net, db = chain
    minted = job(net.authority, steps=100)
    paid = job(net.users[0], steps=1, deposit=job_cost_of(1))
    first, second = _post(db, net, minted, paid)
    assert second.started and not first.started  # the paid one jumped the queue
    _work_until_done(db, net, [tx_hash(paid)])
    assert db.state.get(JOB + tx_hash(minted)).started
    later = job(net.users[1], steps=1, deposit=job_cost_of(1))
    (queued,) = _post(db, net, later)  # the minted job has started: it is not overtaken
    assert not queued.started
    assert {db.state.get(UNIT + u).job_id for u in db.state.ids(UNIT)} == {tx_hash(minted)}


def test_a_job_nobody_serves_is_passed_over(chain):
    net, db = chain
    unservable = job(net.users[0], steps=1, layers=((40, 50),), deposit=job_cost_of(1))
    servable = job(net.users[1], steps=1, deposit=job_cost_of(1))
    first, second = _post(db, net, unservable, servable)
    assert not first.started and second.started


def test_a_stalled_job_is_given_up_and_its_deposit_refunded(chain):
    net, db = chain
    user = net.users[0]
    stalled = job(user, steps=2, deposit=job_cost_of(2))
    _post(db, net, stalled)
    timeout = db.state.get(b"Mparams").unit_timeout
    grow(db, net, STALL_TIMEOUTS * timeout + 1)  # nobody sends a receipt
    assert db.state.get(JOB + tx_hash(stalled)).step == 2  # given up ...
    grow(db, net, 1)  # ... and refunded in the next block's prelude
    record = db.state.get(JOB + tx_hash(stalled))
    assert record.step == record.job.steps and record.escrow == 0
    assert balance(db, user.public) == 100 * COIN
    assert not [u for u in db.state.ids(UNIT)]
    assert any(db.state.get(JAIL + w.public) for w in net.wallets)  # the misses were struck
    check_supply(db.state)
