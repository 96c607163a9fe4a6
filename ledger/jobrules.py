"""The rules of jobs: posting one, which job trains next, paying its work, refunding the rest.

Pure functions over an `Overlay` (specs/consensus.md 5.2), each checking
everything before it writes, as `ledger.rules` does.

Who pays. The chain's own jobs, posted by its job authority with no
deposit, are paid by minting (one ``reward`` per accepted unit, as the
whitepaper's coin per block). Anyone else's job locks a deposit of at least
`job_cost` when it is accepted, and its units and audits are paid out of
that deposit: no coin is minted for a user's job. What is left once the job
is finished and its last receipt settled (units that failed an audit or
went unaudited cost nothing) goes back to the creator.

Which job trains. One job at a time, to its end: a node holds one job's
model, and every step needs all of its units done. `job_queue` orders the
unfinished jobs: the started one, then paid jobs before minted ones, each
oldest first. A job starts when its first step can be assigned (some bonded
node serves every unit's layers); a queued job that cannot yet is passed
over for the next. A started job is never overtaken; one whose open step
has not closed in ``STALL_TIMEOUTS`` unit timeouts is given up
(`give_up_stalled`), so a job nobody can run holds the queue, and costs the
assigned nodes strikes, for a bounded time.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

from ledger.accounts import U64_MAX, check_nonce, credit, debit_deposit, mint
from ledger.errors import BadJob
from ledger.state import JOB, PENDING, UNIT, Overlay
from ledger.types import UNIT_KINDS, Job, Params, tx_hash, unit_id
from ledger.records import JobRecord

__all__ = ["apply_job", "check_sizes", "give_up_stalled", "job_cost", "job_queue", "pay_work",
           "refund_finished"]

#: Verdicts a receipt can cost its job at most: its audit and one re-check.
FEES_PER_UNIT = 2
#: Most steps a job may have: ten million (about four months at a step a second).
#: Attack note: a job of 10^12 steps was accepted, then held the queue for good.
MAX_JOB_STEPS = 10_000_000
#: A started job whose open step has not closed in this many unit timeouts is given up.
STALL_TIMEOUTS = 16


def job_cost(params: Params, steps: int, n_units: int) -> int:
    """The least deposit of a paid job: every unit's reward and two verifier fees.

    (An unaudited unit costs only its reward: the rest comes back.)
    """
    return steps * n_units * (params.reward + FEES_PER_UNIT * params.verify_fee)


def apply_job(st: Overlay, ctx: Any, tx: Job, raw: bytes) -> None:
    """Accept a job: check its plan and spec, lock its deposit, queue it.

    Raises:
        BadJob: no steps or units, a malformed or repeated unit, a spec that
            is not the one ``hyper_hash`` commits to or states sizes that can
            never run (`check_sizes`), no deposit from anyone
            but the job authority, or a deposit short of `job_cost`.
        InsufficientFunds: the creator's balance is under the deposit.
        BadNonce: not the creator's next nonce.
    """
    check_nonce(st, tx.creator, tx.nonce)
    if tx.steps == 0 or not tx.units:
        raise BadJob("a job needs at least one step and one unit")
    if tx.steps > MAX_JOB_STEPS:
        raise BadJob(f"a job has at most {MAX_JOB_STEPS} steps, not {tx.steps}")
    for t in tx.units:
        heads_ok = t.head_start < t.head_end or t.head_start == t.head_end == 0
        if t.kind not in UNIT_KINDS or not t.layer_start < t.layer_end or not heads_ok:
            raise BadJob(f"malformed unit {t}")
    if len(set(tx.units)) != len(tx.units):
        raise BadJob("a job lists the same unit twice")
    if hashlib.sha256(tx.spec).digest() != tx.hyper_hash:
        raise BadJob("the job's spec is not the one its hyper_hash commits to")
    check_sizes(tx)
    params = st.params()
    cost = job_cost(params, tx.steps, len(tx.units))
    # Attack note: rewards for the authority's jobs are minted, so whoever
    # could post such a job could post busywork for their own nodes and mint
    # coins. Everyone else pays for the work with a deposit that covers it.
    if tx.deposit == 0 and tx.creator != params.job_authority:
        raise BadJob(f"a job pays its miners from its deposit: at least {cost} base units "
                     f"({tx.steps} steps x {len(tx.units)} units x (reward + "
                     f"{FEES_PER_UNIT} verifier fees)), got none")
    if 0 < tx.deposit < cost or cost > U64_MAX:
        raise BadJob(f"deposit short: the job needs at least {cost} base units, got {tx.deposit}")
    debit_deposit(st, tx.creator, tx.deposit)
    st.put(JOB + tx_hash(tx, raw), JobRecord(tx, 0, ctx.height, False, tx.deposit, 0))


def check_sizes(tx: Job) -> None:
    """Refuse a job whose spec states sizes that can never run.

    The spec is the node's canonical config JSON (`compute.jobfile.config_json`:
    every field named, which is the only form a miner mines), read here as
    plain JSON: the ledger knows no model. Of the fields it names: a sample
    of ``seq_len`` + 1 tokens must fit the model's ``max_seq_len`` positions
    (``seq_len <= max_seq_len``), every unit's layers must be the model's
    (``layer_end <= n_layers``), and
    synthetic data must give one sample (``n_chars > seq_len``: a character
    is at least one token's worth, so fewer can never make one).

    Attack note: anyone may post a paid job, and a job nobody can run holds
    the queue and strikes its assignees until it is given up. A spec that
    leaves a field out is no config a miner mines, so it escapes only into
    that bounded give-up. A data file's length is not on chain (the spec
    names the file by its SHA-256 alone), so a file shorter than one sample
    is refused by the client (`pnode job submit`) and skipped by miners
    (`node.mine.miner.Miner._build`), not here.

    Raises:
        BadJob: a stated size the job can never run with.
    """
    try:
        spec = json.loads(tx.spec)
    except (ValueError, UnicodeDecodeError):
        return  # no config at all: no miner builds it (above)
    if not isinstance(spec, dict):
        return
    model, data = (spec.get(k) if isinstance(spec.get(k), dict) else {} for k in ("model", "data"))
    seq, positions = _size(spec, "seq_len"), _size(model, "max_seq_len")
    layers = _size(model, "n_layers")
    if seq is not None and positions is not None and seq > positions:
        raise BadJob(f"seq_len {seq} is more than the model's max_seq_len {positions}")
    if layers is not None and any(t.layer_end > layers for t in tx.units):
        raise BadJob(f"a unit's layers lie outside the model's {layers} layers")
    chars = _size(data, "n_chars") if data.get("source") == "synthetic" else None
    if chars is not None and seq is not None and chars <= seq:
        raise BadJob(f"synthetic data of {chars} characters is shorter than one sample "
                     f"(seq_len {seq} + 1 tokens)")


def _size(fields: dict, name: str) -> int | None:
    """The integer ``fields`` names ``name`` (None: absent, or not an integer)."""
    value = fields.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def job_queue(st: Overlay) -> list[bytes]:
    """The ids of the unfinished jobs in training order (module docstring)."""
    records = {job_id: st.get(JOB + job_id) for job_id in st.ids(JOB)}
    waiting = [j for j, r in records.items() if r.step < r.job.steps]
    return sorted(waiting, key=lambda j: (not records[j].started, records[j].job.deposit == 0,
                                          records[j].posted, j))


def pay_work(st: Overlay, job_id: bytes, account_id: bytes, amount: int) -> None:
    """Pay ``amount`` for work on a job: minted for a minted job, else out of its escrow.

    A paid job's escrow covers every payment `job_cost` allows for; should
    it run short all the same, the payment is cut to what is left.
    """
    record = st.get(JOB + job_id)
    if record is None or record.job.deposit == 0:
        mint(st, account_id, amount)
        return
    paid = min(amount, record.escrow, U64_MAX - st.account(account_id).balance)
    credit(st, account_id, paid)
    st.put(JOB + job_id, replace(record, escrow=record.escrow - paid))


def refund_finished(st: Overlay, ctx: Any) -> None:
    """Give each finished job's unspent escrow back, once none of its receipts is pending."""
    owing = [j for j in st.ids(JOB) if (r := st.get(JOB + j)).escrow and r.step >= r.job.steps]
    if not owing:
        return
    unsettled = {st.get(PENDING + h).job_id for h in st.ids(PENDING)}
    for job_id in owing:
        if job_id in unsettled:
            continue
        record = st.get(JOB + job_id)
        room = U64_MAX - st.account(record.job.creator).balance
        credit(st, record.job.creator, min(record.escrow, room))
        st.put(JOB + job_id, replace(record, escrow=record.escrow - min(record.escrow, room)))


def give_up_stalled(st: Overlay, ctx: Any) -> None:
    """End the started job whose open step has not closed for ``STALL_TIMEOUTS`` unit timeouts.

    Attack note: anyone may post a paid job, and a started job is never
    overtaken; a job no miner can run (a spec they cannot build, data nobody
    has) would otherwise hold the queue for ever, each deadline a strike for
    its assignees. Given up, its units are dropped, it counts as finished,
    and its deposit's rest goes back (`refund_finished`).
    """
    limit = STALL_TIMEOUTS * st.params().unit_timeout
    for job_id in job_queue(st)[:1]:
        record = st.get(JOB + job_id)
        if not record.started or ctx.height <= record.moved + limit:
            return
        for t in record.job.units:
            st.delete(UNIT + unit_id(job_id, record.step, t))
        st.put(JOB + job_id, replace(record, step=record.job.steps))
