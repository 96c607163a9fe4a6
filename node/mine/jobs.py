"""Which job a miner runs, and who did a closed step's units: reads of the chain's state.

The pure side of a job (its units, commitments and `Job` transaction) is
`proof_of_learning.units`; this module only reads the chain for the miner.
"""

from __future__ import annotations

from libp2p.peer.id import ID

from compute.data import JobConfig
from compute.errors import ComputeError
from ledger.jobrules import job_queue
from ledger.state import JOB, NODE, Overlay
from ledger.types import Receipt, unit_id
from node.errors import NothingToMine
from proof_of_learning.units import config_of, matches

__all__ = ["STEP_SEARCH_BACK", "job_to_mine", "step_workers"]


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


#: How many blocks back from the tip `step_workers` looks for a closed step's receipts.
STEP_SEARCH_BACK = 256


def step_workers(chain, job_id: bytes, step: int) -> dict[int, str]:
    """Unit index -> the peer id of the worker whose receipt the chain took, for a closed
    ``step`` of ``job_id`` (the last `STEP_SEARCH_BACK` blocks; chain thread).

    Only that worker's pushes of the step are its update: a unit reassigned
    after a timeout was pushed by its former assignee too, and a cheat's late
    push must not become the weights of the nodes it reached first.
    """
    st = chain.state
    record = st.get(JOB + job_id)
    if record is None:
        return {}
    index = {unit_id(job_id, step, t): i for i, t in enumerate(record.job.units)}
    found: dict[int, str] = {}
    for h in range(chain.height, max(0, chain.height - STEP_SEARCH_BACK), -1):
        for tx in chain.block_at(h).txs:
            if isinstance(tx, Receipt) and tx.unit_id in index:
                node = st.get(NODE + tx.node_key)
                if node is not None:
                    found.setdefault(index[tx.unit_id], str(ID(node.peer_id)))
        if len(found) == len(index):
            break
    return found
