"""What a miner reads of the chain: which job to run, its view of it, who did a step's units.

The pure side of a job (its units, commitments and `Job` transaction) is
`proof_of_learning.units`; this module only reads the chain for the miner.
"""

from __future__ import annotations

from dataclasses import dataclass

from libp2p.peer.id import ID

from compute.data import JobConfig
from compute.errors import ComputeError
from ledger.jobrules import job_queue
from ledger.rules import candidates
from ledger.state import JOB, NODE, PENDING, UNIT, Overlay
from ledger.types import Job, unit_id
from node.chain import CLOSED_STEP_BLOCKS, step_receipts
from node.errors import MinerError, NothingToMine
from node.wire import MAX_TRAIN_FRAME
from proof_of_learning.units import config_of, job_units, matches

__all__ = ["MinerView", "check_job", "job_to_mine", "miner_view", "step_workers", "unauditable"]


def job_to_mine(state, wanted: JobConfig | None) -> tuple[bytes, JobConfig]:
    """The job a miner should set up for: the one the chain trains now, or ``wanted``'s.

    Args:
        state: the chain's state (a reader; read in the chain thread).
        wanted: ``pnode start --job``'s config (None: whichever job the chain
            trains now or next, `ledger.jobrules.job_queue`).

    Returns:
        (job id, its config).

    Raises:
        NothingToMine: with the reason, for `pnode start` to say.
    """
    st = Overlay(state)
    queue = job_queue(st)
    if wanted is not None:
        queue = [j for j in queue if matches(st.get(JOB + j).job, wanted)]
        if not queue:
            raise NothingToMine("no unfinished job on the chain is --job's config")
        return queue[0], wanted
    if not queue:
        raise NothingToMine("the chain has no job left to train (`pnode job submit` posts one)")
    job_id = queue[0]
    try:
        return job_id, config_of(st.get(JOB + job_id).job)
    except (ValueError, ComputeError) as exc:
        raise NothingToMine(f"job {job_id.hex()[:16]}.. is not one this node can run: "
                            f"{exc}") from None


def step_workers(chain, job_id: bytes, step: int) -> dict[int, str]:
    """Unit index -> the peer id of the worker whose receipt the chain took, for a closed
    ``step`` of ``job_id`` (the last `CLOSED_STEP_BLOCKS` blocks; chain thread).

    Only that worker's pushes of the step are its update: a unit reassigned
    after a timeout was pushed by its former assignee too, and a cheat's late
    push must not become the weights of the nodes it reached first.
    """
    st = chain.state
    record = st.get(JOB + job_id)
    if record is None:
        return {}
    found = step_receipts(chain, job_id, record.job.units, [step], back=CLOSED_STEP_BLOCKS)
    workers = {index: st.get(NODE + r.node_key) for (_, index), r in found.items()}
    return {index: str(ID(n.peer_id)) for index, n in workers.items() if n is not None}


@dataclass(frozen=True, slots=True)
class MinerView:
    """What the chain says about a miner's job now (read in the chain thread)."""

    tip: bytes
    job_id: bytes | None
    step: int
    steps: int
    mine: tuple[int, ...]  # unit indices of the open step assigned to this node, not done
    holders: tuple[tuple[str, ...], ...]  # per section: peer ids of the nodes covering it
    assignees: dict[int, str]  # unit index of the open step: the peer id it is assigned to
    miners: tuple[str, ...]  # every registered node's peer id
    span: tuple[int, int] | None  # this node's registered layers


def miner_view(chain, job_id: bytes | None, me: bytes) -> MinerView:
    """The chain's view of job ``job_id`` (`node.chain.job_named`) for the node key ``me``.

    Holders are the nodes the longest-wait rule may pick: registered and bonded.
    """
    st = chain.state
    bonded = [c.node_key for c in candidates(Overlay(st))]
    nodes = [st.get(NODE + k) for k in bonded]
    miners = tuple(sorted(str(ID(n.peer_id)) for n in nodes))
    mine_rec = dict(zip(bonded, nodes)).get(me)
    span = (mine_rec.layer_start, mine_rec.layer_end) if mine_rec else None
    if job_id is None:
        return MinerView(chain.tip_hash, None, 0, 0, (), (), {}, miners, span)
    record = st.get(JOB + job_id)
    units = record.job.units
    holders = tuple(tuple(sorted(str(ID(n.peer_id)) for n in nodes
                                 if n.layer_start <= t.layer_start and t.layer_end <= n.layer_end))
                    for t in units[:len(units) // 2])
    mine, assignees = [], {}
    if record.step < record.job.steps:
        for i, t in enumerate(units):
            a = st.get(UNIT + unit_id(job_id, record.step, t))
            if a is None:
                continue
            if a.node_key == me and not a.done:
                mine.append(i)
            node = st.get(NODE + a.node_key)
            if node is not None:
                assignees[i] = str(ID(node.peer_id))
    return MinerView(chain.tip_hash, job_id, record.step, record.job.steps,
                     tuple(mine), holders, assignees, miners, span)


def unauditable(state, kept: dict[bytes, int], step: int) -> tuple[set[bytes], set[bytes]]:
    """Of ``kept`` (receipt hash: step): those no audit can come for (no `Pending` left,
    of a step before ``step``: past their window, judged or replaced), and those drawn
    for an audit now (`Pending` with a verifier)."""
    pending = {h: state.get(PENDING + h) for h in kept}
    return ({h for h, t in kept.items() if t < step and pending[h] is None},
            {h for h, p in pending.items() if p is not None and p.verifier != bytes(32)})


def check_job(job: Job, built: tuple[bytes, bytes, bytes], sections, replicas: int,
              classes: tuple[str, ...] = (), mine: str = "") -> None:
    """Check an on-chain job against the model a miner built from its config.

    Args:
        built: the built model's (model, data, hyper) hashes
            (`proof_of_learning.units.commitments`).
        sections: the built model's `compute.train.Sections`.
        classes, mine: the compute classes the job admits (() any) and this
            miner's (`compute.device.compute_class`).

    Raises:
        MinerError: the job's hashes or units are not this config's, a
            section's state would not fit one state frame, or the job does
            not take this miner's compute class (its units would fail).
    """
    if classes and mine not in classes:
        raise MinerError(f"the job takes units of the compute classes {', '.join(classes)} "
                         f"only, and this node computes as {mine}")
    if (job.model_hash, job.data_hash, job.hyper_hash) != built:
        raise MinerError("the job on chain does not commit to this config's initial "
                         "weights and data")
    if job.units != job_units(sections.partition, replicas):
        raise MinerError("the job's units are not this config's partition")
    for opt in (*sections.optimizers, sections.client):  # weights + 2 AdamW moments
        size = 3 * 4 * opt.numel()
        if size > MAX_TRAIN_FRAME - (1 << 20):
            raise MinerError(f"a section's state ({size} bytes) does not fit one "
                             f"{MAX_TRAIN_FRAME}-byte frame: use more sections (k)")
