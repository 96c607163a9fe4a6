"""node.chain.jobviews: a job the chain gave up is shown as given up, never as finished.

Issue 28, item 10: `pnode job list` said ``finished 200/200`` of a job the
chain had given up at step 13 (`ledger.jobrules.give_up_stalled` sets its
step to its steps). Real chains (`tests.ledger.chainkit`).
"""

from __future__ import annotations

from ledger.jobrules import STALL_TIMEOUTS
from ledger.state import JOB, UNIT
from ledger.types import COIN, tx_hash
from node.chain.jobviews import given_up, job_view, jobs_view
from tests.ledger.chainkit import grow, job, make_net, new_db, receipts_due

TWO_STEPS = 2 * 2 * 3 * COIN  # steps x units x (reward + two fees)


def _state(db, j) -> str:
    return next(x["state"] for x in jobs_view(db)["jobs"] if x["id"] == tx_hash(j).hex())


def test_a_finished_job_reads_finished_and_a_stalled_one_given_up():
    net = make_net()
    db = new_db(net)
    done, stalled = (job(u, steps=2, deposit=TWO_STEPS) for u in net.users)
    grow(db, net, 1, [done])
    for _ in range(20):  # every unit's receipt, block after block, to its end
        grow(db, net, 1, receipts_due(db, net))
        if db.state.get(JOB + tx_hash(done)).step == 2:
            break
    assert _state(db, done) == "finished" and not given_up(db, tx_hash(done))

    grow(db, net, 1, [stalled])
    assert _state(db, stalled) == "training" and not given_up(db, tx_hash(stalled))
    grow(db, net, 1, receipts_due(db, net))  # step 0 closes; step 1 only half done
    grow(db, net, 1, receipts_due(db, net)[:1])
    assert db.state.get(JOB + tx_hash(stalled)).step == 1
    timeout = db.state.get(b"Mparams").unit_timeout
    grow(db, net, STALL_TIMEOUTS * timeout + 1)  # nobody sends the other receipt
    record = db.state.get(JOB + tx_hash(stalled))
    assert record.step == record.job.steps and not list(db.state.ids(UNIT))  # as if finished
    assert given_up(db, tx_hash(stalled)) and _state(db, stalled) == "given up"
    assert job_view(db, tx_hash(stalled).hex()[:12])["state"] == "given up"
    assert _state(db, done) == "finished"  # long after it ended, still
