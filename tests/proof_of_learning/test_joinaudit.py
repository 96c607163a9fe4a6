"""The join-time audit's window replays (proof_of_learning/joinaudit.py, specs/pol.md 10.3).

A worker runs a job's steps in-process and keeps its checkpoints as a miner
does (`polkit`); a second, scratch `Replayer` replays windows of its
receipts from the initial model or from the kept states, and must agree
with every honest receipt bit for bit and put each cheat on its unit.
"""

from __future__ import annotations

import pytest
import torch
import trio

from node.pol.archive import state_key
from node.pol.attacks import WorkerAttack
from proof_of_learning.joinaudit import (
    INPUT, MATCH, MISSING, OUTPUT, WEIGHTS, check_step, replay_window, windows_of,
)
from proof_of_learning.replay import Replayer

from proof_of_learning.judge import run_inline
from tests.node.pol.polkit import JOB, make_worker, run_step

EVERY = 2  # checkpoints at steps 2, 4, ...


def replay(w, first, steps, sources=()):
    """Replay [first, first + steps) of ``w``'s receipts; ``sources``: archives to ask."""
    async def source(step, part, n):
        if n >= len(sources):
            return None
        return sources[n].state(state_key(JOB, step, part)) or {}
    rp = Replayer(w.config)
    return trio.run(replay_window, rp, JOB, w.units, first, steps, w.receipts, source, run_inline)


@pytest.fixture(scope="module")
def honest():
    w = make_worker(2, state_every=EVERY)
    for t in range(5):
        run_step(w, t)
    return w


def test_windows_cut_the_closed_steps_at_the_checkpoints():
    assert windows_of(5, 2) == [(0, 2), (2, 2), (4, 1)]
    assert windows_of(4, 16) == [(0, 4)]
    assert windows_of(0, 3) == []


def test_an_honest_run_replays_bit_for_bit_from_genesis_and_from_a_kept_state(honest):
    w = honest
    whole = replay(w, 0, 5)
    assert (whole.status, whole.start, whole.replayed) == ("pass", "genesis", 5)
    assert whole.matched == 5 * len(w.units)
    assert w.archive.state_steps() == [2, 4]
    late = replay(w, 2, 3, [w.archive])
    assert (late.status, late.start, late.replayed, late.matched) == \
        ("pass", "states", 3, 3 * len(w.units))


def test_a_window_whose_state_no_one_keeps_is_unavailable(honest):
    report = replay(honest, 2, 2, [])
    assert (report.status, report.replayed) == ("unavailable", 0)
    assert "state" in report.detail


def test_a_wrong_state_is_passed_over_for_the_next_source(honest):
    """A source whose moments are off (weights right) and one whose weights are another
    step's: each disagrees with the receipts, and the honest third is replayed from."""
    w = honest

    class Skewed:
        def __init__(self, how):
            self.how = how

        def state(self, key):
            good = {k: v.clone() for k, v in w.archive.state(key).items()}
            for name, t in good.items():
                if self.how == "moments" and name.endswith("#exp_avg"):
                    t.mul_(1.5)
                elif self.how == "weights" and "#" not in name:
                    t.add_(1e-3)
            return good

    report = replay(w, 2, 2, [Skewed("moments"), Skewed("weights"), w.archive])
    assert (report.status, report.matched, report.detail) == ("pass", 2 * len(w.units), "")
    lied = replay(w, 2, 2, [Skewed("moments")])  # no honest source: the replay disagrees,
    assert lied.status == "unsettled" and "settle" in lied.detail  # and blames no worker
    assert lied.differing and not any(c["at_fault"] for c in lied.to_json()["differing"])


def cheat_at(kind: str, step: int):
    w = make_worker(2, state_every=EVERY)
    attack = WorkerAttack(kind)
    for t in range(4):
        if kind == "stale-weights" and t == step:  # the update of `step` left out
            opts = [*w.sections.optimizers, w.sections.client]
            before = [{k: v.clone() for k, v in opt.weights().items()} for opt in opts]
            run_step(w, t)
            for opt, weights in zip(opts, before):
                opt.load_weights(weights)
            continue
        run_step(w, t, attack.run_phase(w.plan) if t == step else None)
    return w


@pytest.mark.parametrize("kind, status", [("scaled-gradients", OUTPUT),
                                          ("perturbed-forward", OUTPUT),
                                          ("stale-weights", WEIGHTS)])
def test_a_cheat_is_put_on_its_units(kind, status):
    w = cheat_at(kind, 1)
    report = replay(w, 0, 4)
    at = 2 if kind == "stale-weights" else 1  # stale weights show in the next step's reads
    assert report.status == "fail" and report.replayed == at + 1
    assert {c.step for c in report.differing} == {at}
    assert status in {c.status for c in report.differing}
    assert all(c.status in (status, INPUT) for c in report.differing)


def test_a_cheat_at_a_windows_first_step_is_put_on_its_units_from_fetched_states():
    """The cheater's update changes the next step's weights, which is no fault of the
    fetched states: the window fails at its first step, on the cheater's units."""
    w = cheat_at("scaled-gradients", 2)
    report = replay(w, 2, 2, [w.archive])
    assert (report.status, report.start, report.replayed) == ("fail", "states", 1)
    outputs = [c for c in report.differing if c.status == OUTPUT]
    assert outputs and all(report.at_fault(c) for c in outputs)


def test_check_step_names_what_differs_first(honest):
    w = honest
    replayed = {i: (r.weights_hash, r.input_hash, r.output_hash, r.cert_hash)
                for (t, i), r in w.receipts.items() if t == 0}
    chain = {i: w.receipts[(0, i)] for i in replayed}
    assert {c.status for c in check_step(0, replayed, chain)} == {MATCH}
    x = bytes(32)
    bent = {0: (x, *replayed[0][1:]), 1: (replayed[1][0], x, *replayed[1][2:]),
            2: (*replayed[2][:3], x)}
    statuses = [c.status for c in check_step(0, {**replayed, **bent}, chain)]
    assert statuses[:3] == [WEIGHTS, INPUT, OUTPUT]
    del chain[3]
    assert check_step(0, replayed, chain)[3].status == MISSING


def test_a_miner_keeps_the_newest_states_only():
    from node.pol.archive import KEEP_STATES, PolArchive
    a = PolArchive()
    for step in range(0, 40, 4):
        a.keep_state(JOB, step, 0, {"w": torch.full((2,), float(step))})
        a.keep_state(JOB, step, 1, {"w": torch.zeros(2)})
    assert a.state_steps() == list(range(0, 40, 4))[-KEEP_STATES:]
    assert float(a.state(state_key(JOB, 36, 0))["w"][0]) == 36.0
    assert a.state(state_key(JOB, 0, 0)) is None and a.state(state_key(JOB, 36, 2)) is None
    assert a.state(state_key(b"k" * 32, 36, 0)) is None  # another job's key


def test_the_jobs_thread_count_makes_a_replay_exact_whatever_the_callers():
    """A weight gradient's rounding may depend on the intra-op thread count: every unit
    runs at the job's (`pinned_threads`), so a node whose own count differs replays
    exactly. The control, a replay without the pin, shows the effect where the CPU's
    BLAS splits the gradients' batch reduction by thread (1 and 2 threads differ); where
    it does not, the job rounds alike at any count and the control is skipped (the pin
    itself is shown on a reduction torch splits: tests/compute/test_device.py)."""
    from compute.device import pinned_threads
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        w = make_worker(2, batch_size=16, seq_len=64, threads=2)  # the devnet job's batch
        run_step(w, 0)
        for caller in (1, 2):  # a count not the job's, and the job's
            torch.set_num_threads(caller)
            assert replay(w, 0, 1).status == "pass"
            assert torch.get_num_threads() == caller
        with pinned_threads(1):
            assert torch.get_num_threads() == 1
            unpinned = Replayer(w.config)
            unpinned.plan.threads = None  # computes at the caller's count, 1
            hashes = unpinned.step(JOB, 0, w.units)
        assert torch.get_num_threads() == 2
        # (Not the certificates: the unpinned replay's name its compute class with 1
        # thread, so their hashes differ whatever the bits.)
        committed = {i: (r.weights_hash, r.input_hash, r.output_hash)
                     for (t, i), r in w.receipts.items()}
        hashes = {i: h[:3] for i, h in hashes.items()}
        assert hashes[0] == committed[0]  # no weight gradient: alike at any count
        if all(hashes[i] == committed[i] for i in (1, 2, 3)):  # the control, measured
            pytest.skip("control not shown: this CPU rounds the devnet job alike at 1 and 2 "
                        "threads (an unpinned replay at 1 thread matched all 4 units "
                        "computed at 2: its BLAS does not split a weight gradient's batch "
                        "reduction by thread), so the replays above pass at any count")
    finally:
        torch.set_num_threads(before)


