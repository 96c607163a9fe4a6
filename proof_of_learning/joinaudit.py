"""The join-time audit: replaying windows of the chain's training (specs/pol.md 10.3).

Owns `check_step` (one replayed step against the receipts the chain holds,
pure), `windows_of` (a job's closed steps cut at its checkpoints, pure) and
`replay_window`, which the verifier's ``pol_audit`` op (`pnode verify pol
--windows N`) runs. A window [s, s + K) starts from the job's committed
initial model (s = 0) or from the full state of every part at step s,
kept by the miners (`PolArchive.keep_state`) and fetched over
`/pnode/pol/1.0.0`. It then replays each step with the miners' own code
(`proof_of_learning.replay.Replayer`) and compares every unit's four receipt
hashes, bit for bit.

No chain commitment covers a state as a whole, so a fetched state is
checked by what it must give. Its weights must give the `weights_hash` of
every receipt of step s. Its AdamW moments must give, after step s's
update, the `weights_hash` of step s + 1's receipts. When a unit's weights
disagree there, the parts it reads are taken from the next holder that
keeps them, until the receipts agree or no suspect part has a source
left; the states the most receipts agreed with are then replayed from, and
a difference in their first two steps blames no one (the window is
"unsettled"). A window from genesis needs no state and settles it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from compute.errors import OptimizerStateError
from ledger.types import Receipt
from proof_of_learning.replay import Hashes, Replayer

__all__ = ["FAULTS", "STATUSES", "ReplayReport", "UnitCheck", "check_step", "replay_window",
           "windows_of"]

#: How a replayed unit compares with its receipt on chain.
MATCH, WEIGHTS, INPUT, OUTPUT, MISSING = "match", "weights", "input", "output", "missing"
STATUSES = (MATCH, WEIGHTS, INPUT, OUTPUT, MISSING)
#: The statuses that put the fault on the unit's own worker. ``weights``: it read
#: weights the job's updates do not give (it skipped or changed an update); ``output``:
#: from the same weights and inputs it committed other results. ``input`` follows
#: from an upstream unit's fault, and ``missing`` from the chain.
FAULTS = (WEIGHTS, OUTPUT)

#: ``source(step, part, n)``: a part's full state at a step from the n-th source: None
#: when there is no n-th source, an empty dict when it keeps no such state.
StateSource = Callable[[int, int, int], Awaitable[dict | None]]


@dataclass(frozen=True, slots=True)
class UnitCheck:
    """One unit of a replayed step against its receipt (``worker``: the receipt's node key)."""

    step: int
    index: int
    worker: bytes
    status: str


@dataclass
class ReplayReport:
    """What replaying one window gave.

    ``start``: "genesis", "states" (fetched) or "unavailable" (some part's
    state at ``first`` is kept by no one reached); ``settled``: False when
    no fetched states agreed with every receipt of steps ``first`` and
    ``first + 1``, so a difference there may be the states' and blames no
    one; ``replayed``: steps run; ``matched``: units equal to their
    receipts; ``differing``: the units of the first step that disagreed
    (the replay stops there: what follows builds on it).
    """

    first: int
    steps: int
    start: str
    settled: bool = True
    replayed: int = 0
    matched: int = 0
    differing: list[UnitCheck] = field(default_factory=list)
    detail: str = ""

    @property
    def status(self) -> str:
        """"pass"; "fail" (a unit disagrees, its worker at fault); "unsettled" (a unit
        disagrees where the fetched states were in doubt); "unavailable" (no state)."""
        if self.start == "unavailable":
            return "unavailable"
        if not self.differing:
            return "pass"
        return "fail" if any(self.at_fault(c) for c in self.differing) else "unsettled"

    def at_fault(self, check: UnitCheck) -> bool:
        """Whether ``check`` puts the fault on its worker (`FAULTS`, and not a step whose
        weights rest on states in doubt)."""
        doubtful = not self.settled and check.step <= self.first + 1
        return check.status in FAULTS and not doubtful

    def to_json(self) -> dict:
        return {"first_step": self.first, "steps": self.steps, "start": self.start,
                "status": self.status, "replayed": self.replayed, "matched": self.matched,
                "differing": [{"step": c.step, "index": c.index, "worker": c.worker.hex(),
                               "status": c.status, "at_fault": self.at_fault(c)}
                              for c in self.differing],
                "detail": self.detail}


def windows_of(closed: int, every: int) -> list[tuple[int, int]]:
    """The windows (first step, steps) of a job's ``closed`` steps, cut every ``every``."""
    return [(s, min(every, closed - s)) for s in range(0, closed, every)]


def check_step(step: int, replayed: Mapping[int, Hashes], chain: Mapping[int, Receipt]
               ) -> list[UnitCheck]:
    """Each replayed unit of ``step`` against the chain's receipt of it, in unit order."""
    out = []
    for index, (weights, inp, output, cert) in sorted(replayed.items()):
        r = chain.get(index)
        if r is None:
            status, worker = MISSING, b""
        else:
            worker = r.node_key
            status = WEIGHTS if r.weights_hash != weights else INPUT if r.input_hash != inp \
                else OUTPUT if (r.output_hash, r.cert_hash) != (output, cert) else MATCH
        out.append(UnitCheck(step, index, worker, status))
    return out


async def replay_window(rp: Replayer, job_id: bytes, units: Sequence, first: int, steps: int,
                        receipts: Mapping[tuple[int, int], Receipt], source: StateSource | None,
                        run_sync: Callable, progress: Callable[[int], None] = lambda t: None
                        ) -> ReplayReport:
    """Replay steps [first, first + steps) and compare each with the chain's receipts.

    Args:
        rp: the scratch model to replay on (its state is replaced).
        job_id, units: the job.
        receipts: the chain's receipts by (step, unit index).
        source: where states come from (needed when ``first`` > 0).
        run_sync: runs torch work (`node.torch_thread.run_sync`, or a direct call).
        progress: told of each step replayed.
    """
    report = ReplayReport(first, steps, "genesis" if first == 0 else "states")
    if first == 0:
        await run_sync(rp.start, None)
    elif not await _start_from_states(rp, job_id, units, first, receipts, source, run_sync,
                                      report):
        return report
    for t in range(first, first + steps):
        replayed = await run_sync(rp.step, job_id, t, units)
        checks = check_step(t, replayed, {i: receipts[(t, i)] for i in replayed
                                         if (t, i) in receipts})
        report.replayed += 1
        progress(t)
        report.differing = [c for c in checks if c.status != MATCH]
        report.matched += len(checks) - len(report.differing)
        if report.differing:
            break
    return report


async def _start_from_states(rp: Replayer, job_id: bytes, units: Sequence, first: int,
                             receipts, source: StateSource, run_sync,
                             report: ReplayReport) -> bool:
    """Load a state of every part at ``first`` that gives the chain's weights at ``first``
    and ``first + 1``, trying each part's sources in turn (module docstring). False (and
    ``report`` says why) when some part has no state at all."""
    tried = {part: 0 for part in rp.parts}
    states: dict[int, dict] = {}

    async def next_state(part: int) -> bool:
        """Take ``part``'s state from its next source that has one of its form."""
        while True:
            state = await source(first, part, tried[part])
            tried[part] += 1
            if state is None:
                return False
            try:
                await run_sync(rp.optimizer(part).check_state, state)
            except OptimizerStateError:
                continue  # none, or not of this part's form: the next source's
            states[part] = state
            return True

    for part in rp.parts:
        if not await next_state(part):
            report.start, report.detail = "unavailable", f"no node keeps part {part}'s state " \
                f"at step {first}"
            return False
    best: tuple[tuple[int, int], dict[int, dict]] | None = None
    while True:
        await run_sync(rp.start, states)
        wrong, suspects = await run_sync(_disagreeing, rp, job_id, units, first, receipts)
        if best is None or wrong < best[0]:
            best = (wrong, dict(states))
        # Every suspect part that has a source left moves on to it; the others keep
        # theirs (a part's honest sources are all alike). Ends: each round uses a source.
        if not suspects or not any([await next_state(p) for p in sorted(suspects)]):
            break
    if best[0] != (0, 0):
        report.settled = False
        report.detail = "no states fetched agree with every receipt of steps " \
            f"{first} and {first + 1}: replay from an earlier window (--all) to settle it"
    await run_sync(rp.start, best[1])
    return True


def _disagreeing(rp: Replayer, job_id: bytes, units: Sequence, first: int,
                 receipts) -> tuple[tuple[int, int], set[int]]:
    """((receipts of ``first``, then of ``first + 1`` after that step's update, that commit
    other weights than the loaded states give), the parts those read) (torch thread;
    leaves ``rp`` stepped). States wrong at ``first`` rank below any right there: the
    next step is not replayed for them. When a unit of step ``first`` itself differs
    (a cheat there: its weights and inputs are the chain's), the next step's weights
    cannot test the moments, and the states are taken as they are."""
    wrong, suspects = [0, 0], set()
    for n, t in enumerate((first, first + 1)):
        if n:
            replayed = rp.step(job_id, first, units)
            chain = {i: receipts[(first, i)] for i in replayed if (first, i) in receipts}
            if any(c.status != MATCH for c in check_step(first, replayed, chain)):
                return (0, 0), set()
        for i in range(len(units)):
            r = receipts.get((t, i))
            if r is not None and rp.read_hash(i) != r.weights_hash:
                wrong[n] += 1
                suspects |= rp.suspects(i)
        if suspects:
            if n == 0:
                wrong[1] = len(units) + 1  # not replayed: worse than any that was
            break
    return (wrong[0], wrong[1]), suspects
