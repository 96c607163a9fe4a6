"""What `pnode job list|show|status` show of the chain's training jobs.

Owns `jobs_view` and `job_view`, built from a `ChainDB` whether a running
node answers (the control socket's ``view`` op) or a command reads a
stopped node's store, like `node.chain.views`. Amounts are given twice:
in coins (a decimal string, as the CLIs print them) and in base units
(``*_units``, integers). Also `find_by_prefix`, how commands take an id
or a hex prefix of one (a job's here, a transaction's in `pnode proof`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from ledger.chaindb import ChainDB
from ledger.jobrules import STALL_TIMEOUTS, job_cost, job_queue
from ledger.state import JOB, NODE, PENDING, UNIT, Overlay
from ledger.types import Job, Receipt, format_coins, tx_hash, unit_id
from ledger.records import JobRecord
from node.errors import NodeError

__all__ = ["find_by_prefix", "find_job", "given_up", "job_view", "jobs_view"]


class UnknownJob(NodeError):
    """No job, or more than one, has the id prefix a command gave."""


def given_up(chain, job_id: bytes) -> bool:
    """Whether the chain ended ``job_id`` unfinished (`ledger.jobrules.give_up_stalled`).

    A given-up job's record reads as a finished one's (``step == steps``);
    what tells them apart is its last step's receipts: a finished job has
    one for every unit, included after the step was assigned (at ``moved``)
    and before a give-up could come (`STALL_TIMEOUTS` unit timeouts on), so
    only those blocks are searched. False for a job still training.
    """
    record = chain.state.get(JOB + job_id)
    if record is None or record.step < record.job.steps:
        return False
    last = record.moved + 1 + STALL_TIMEOUTS * Overlay(chain.state).params().unit_timeout
    wanted = {unit_id(job_id, record.job.steps - 1, u) for u in record.job.units}
    for h in range(record.moved + 1, min(last, chain.height) + 1):
        wanted -= {tx.unit_id for tx in chain.block_at(h).txs if isinstance(tx, Receipt)}
        if not wanted:
            return False
    return True


def _state(chain: ChainDB, record: JobRecord, queue: list[bytes], job_id: bytes) -> str:
    if job_id not in queue and record.posted is None:
        return "in the mempool"
    if record.step >= record.job.steps:  # or ended by the chain: a stalled step
        return "given up" if given_up(chain, job_id) else "finished"
    return "training" if record.started else f"queued ({queue.index(job_id)} ahead)"


def _summary(chain: ChainDB, job_id: bytes, record: JobRecord, queue: list[bytes]
             ) -> dict[str, Any]:
    job = record.job
    return {"id": job_id.hex(), "creator": job.creator.hex(),
            "state": _state(chain, record, queue, job_id),
            "step": min(record.step, job.steps), "steps": job.steps, "units": len(job.units),
            "posted": record.posted, "paid_by": "deposit" if job.deposit else "minting",
            "deposit": format_coins(job.deposit), "deposit_units": job.deposit,
            "escrow": format_coins(record.escrow), "escrow_units": record.escrow}


def jobs_view(chain: ChainDB) -> dict[str, Any]:
    """Every job on the chain: the one training, the queue in order, then the finished ones.

    Returns:
        height and ``jobs``: per job its id, creator, state (training,
        queued (n ahead), finished, given up (ended by the chain with a step
        that did not close: `given_up`; its step reads as
        its steps), or in the mempool), step and steps, units per step, the
        height it was posted at, who pays (deposit or minting), its deposit
        and the escrow left.
    """
    st = Overlay(chain.state)
    queue = job_queue(st)
    records = {j: st.get(JOB + j) for j in st.ids(JOB)}
    order = queue + sorted((j for j in records if j not in queue),
                           key=lambda j: (records[j].posted, j))
    queued = _mempool_jobs(chain)
    return {"height": chain.height, "jobs": [_summary(chain, j, records[j], queue) for j in order]
            + [_summary(chain, j, r, queue) for j, r in queued.items() if j not in records]}


def _mempool_jobs(chain: ChainDB) -> dict[bytes, JobRecord]:
    """The jobs waiting in the mempool, as records not yet posted (``posted`` None)."""
    return {tx_hash(tx): JobRecord(tx, 0, None, False, tx.deposit, 0)
            for tx in chain.mempool() if isinstance(tx, Job)}


def find_by_prefix(prefix: Any, ids: Callable[[], Iterable[bytes]], what: str,
                   error: type[Exception]) -> bytes:
    """The one id of ``ids()`` whose hex starts with ``prefix``: how commands take ids.

    `pnode job ...` (a job id) and `pnode proof` (a transaction id) resolve
    what they are given here, so both take the same prefixes. 64 hex digits
    are the id itself (``ids`` is not called: the caller looks it up).

    Args:
        prefix: hex digits, any case.
        ids: the candidates (called only for a shorter prefix).
        what: what an id names, for the errors ("job", "transaction").
        error: the error to raise.

    Returns:
        The matching id.

    Raises:
        error: ``prefix`` is not hex digits, or no id or more than one starts so.
    """
    text = prefix.lower() if isinstance(prefix, str) else ""
    if not text or len(text) > 64 or any(c not in "0123456789abcdef" for c in text):
        raise error(f'"{prefix}" is not a {what} id (hex; a prefix will do)')
    if len(text) == 64:
        return bytes.fromhex(text)
    found = {i for i in ids() if i.hex().startswith(text)}
    if len(found) != 1:
        many = f"{len(found)} {what}s" if found else f"no {what}"
        raise error(f"{many} on the chain with an id starting {text}")
    return found.pop()


def find_job(chain: ChainDB, prefix: str) -> bytes:
    """The id of the one job whose hex id starts with ``prefix``.

    Raises:
        UnknownJob: not hex, no such job, or more than one.
    """
    return find_by_prefix(prefix, lambda: {*chain.state.ids(JOB), *_mempool_jobs(chain)},
                          "job", UnknownJob)


def job_view(chain: ChainDB, job: str) -> dict[str, Any]:
    """One job in full: `jobs_view`'s fields, its spec, its open step's units, its cost.

    Args:
        job: the job's id in hex, or a prefix of it.

    A job still in the mempool is shown as one (state "in the mempool").

    Returns:
        the summary fields, and height, spec (the job's config, parsed; the
        raw text if it is not JSON), the commitments (model, data and
        hyperparameter hashes), cost (the least deposit such a job needs on
        this chain), receipts_pending (accepted, reward not yet paid), and
        ``open_step``: per unit of the step now open its index, kind, layers,
        assignee's node key, deadline and whether its receipt is in.

    Raises:
        UnknownJob: see `find_job`.
    """
    job_id = find_job(chain, job)
    st = Overlay(chain.state)
    record = st.get(JOB + job_id) or _mempool_jobs(chain)[job_id]
    try:
        spec: Any = json.loads(record.job.spec)
    except ValueError:
        spec = record.job.spec.decode("utf-8", "replace")
    units = []
    for index, t in enumerate(record.job.units):
        a = st.get(UNIT + unit_id(job_id, record.step, t))
        if a is not None:
            node = st.get(NODE + a.node_key)
            units.append({"index": index, "kind": t.kind, "layers": [t.layer_start, t.layer_end],
                          "node_key": a.node_key.hex(), "account": node.account.hex() if node
                          else None, "deadline": a.deadline, "done": a.done})
    pending = sum(1 for h in st.ids(PENDING) if st.get(PENDING + h).job_id == job_id)
    cost = job_cost(st.params(), record.job.steps, len(record.job.units))
    return {**_summary(chain, job_id, record, job_queue(st)), "height": chain.height, "spec": spec,
            "model_hash": record.job.model_hash.hex(), "data_hash": record.job.data_hash.hex(),
            "hyper_hash": record.job.hyper_hash.hex(), "cost": format_coins(cost),
            "cost_units": cost, "receipts_pending": pending, "open_step": units}
