"""node.pol.catchup: a holder's state is taken only if the open step's receipts agree.

The receipts and their committed weights come from an in-process worker
(tests/node/pol/polkit.py) through `ArchiveFetcher`; the state is a
section's weights as `StateSync` receives them.
"""

from __future__ import annotations

import torch
import trio

from node.pol import ArchiveFetcher, StateCheck
from tests.node.pol.polkit import JOB, make_worker, run_step


def worker_at_step_1():
    w = make_worker(2)
    run_step(w, 0)
    before = {n: p.detach().clone() for n, p in w.model.named_parameters()}  # version 1
    run_step(w, 1)  # its receipts of step 1 commit the weights at version 1
    return w, before


def check(w, state, receipts=None):
    step1 = [(r, ("worker",)) for (t, _), r in sorted(w.receipts.items()) if t == 1]

    async def receipts_of(job_id, step):
        assert (job_id, step) == (JOB, 1)
        return step1 if receipts is None else receipts
    checker = StateCheck(ArchiveFetcher({"worker": w.archive}), receipts_of)
    return trio.run(checker, JOB, 0, 1, state), checker


def section_state(weights, section_names):
    return {n: weights[n] for n in section_names} | {
        f"{n}#exp_avg": torch.zeros_like(weights[n]) for n in section_names}


def test_the_holders_state_that_the_receipts_committed_is_taken():
    w, v1 = worker_at_step_1()
    names = [n for n in v1 if n.startswith("layers.0.")]
    ok, checker = check(w, section_state(v1, names))
    assert ok and checker.refused == 0
    drifted = {n: t * (1 + 1e-7) for n, t in v1.items()}  # rounding drift: within 1e-4
    assert check(w, section_state(drifted, names))[0]


def test_a_state_every_receipt_contradicts_is_refused():
    w, v1 = worker_at_step_1()
    names = [n for n in v1 if n.startswith("layers.0.")]
    stale = make_worker(2)  # a holder that never stepped: version 0's weights
    ok, checker = check(w, section_state(dict(stale.model.named_parameters()), names))
    assert not ok and checker.refused == 1


def test_with_nothing_to_check_against_the_state_is_taken():
    w, v1 = worker_at_step_1()
    names = [n for n in v1 if n.startswith("layers.0.")]
    stale = make_worker(2)
    assert check(w, section_state(dict(stale.model.named_parameters()), names), receipts=[])[0]
