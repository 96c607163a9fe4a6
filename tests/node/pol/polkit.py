"""A worker's step run in-process, archived as a miner archives it, for judging (tests only).

The judge's tests fetch through `node.pol.fetch.ArchiveFetcher` (the
archive's replies through the codec, checked as over the wire), so its
logic is tested apart from libp2p; tests/node/pol/test_fetch.py runs the
protocol over real hosts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from compute.data import batch, load_corpus, make_model
from compute.train import make_sections
from ledger.crypto import SigningKey
from ledger.types import ZERO_SIG, Receipt, sign, tx_hash, unit_id
from node.mine.devnet import devnet_job
from node.mine.jobs import job_units
from node.mine.step_plan import StepPlan
from node.pol.archive import PolArchive
from node.pol.judge import Case

JOB = b"j" * 32
KEY = SigningKey(b"\x05" * 32)  # the worker's node key: it signs its receipts


@dataclass
class Worker:
    """One process's run of a job's steps, every unit archived with its receipt."""

    config: object
    model: object
    sections: object
    plan: StepPlan
    archive: PolArchive
    receipts: dict[tuple[int, int], Receipt]  # (step, unit index): receipt
    units: tuple
    seconds: dict[tuple[int, int], float] = field(default_factory=dict)  # each unit's run


def make_worker(k: int = 2, replicas: int = 1, **job) -> Worker:
    """A worker of the devnet's job (small batches unless ``job`` says otherwise)."""
    config = devnet_job(4, 3, **{"batch_size": 2, "seq_len": 16, "k": k, "replicas": replicas,
                                 **job})
    model = make_model(config)
    sections = make_sections(model, config)
    plan = StepPlan(model, sections, (config.batch_size, config.seq_len, config.model.dim),
                    replicas)
    from compute.blocks import model_partition
    units = job_units(model_partition(model, config.k, config.mlp_slices), replicas)
    return Worker(config, model, sections, plan, PolArchive(), {}, units)


def run_step(w: Worker, t: int, run=None) -> None:
    """Every unit of step ``t`` (``run``: a cheating `plan.run`), archived; then the update."""
    from compute.blocks import add_grads
    from compute.train import average_replicas
    run = run or w.plan.run
    corpus = load_corpus(w.config.data)
    R = w.config.replicas
    shards = [batch(w.config, t, r, R, corpus=corpus) for r in range(R)]
    n = len(w.units)
    phases = sorted((p for i in range(n) for p in w.plan.phases(i)), key=lambda p: p.order)
    inbox, done = {}, {}
    for phase in phases:
        needs = w.plan.needs(t, phase)
        began = time.perf_counter()
        result = run(phase, t, {key: inbox[key] for key in needs}, *shards[phase.replica])
        w.seconds[(t, phase.index)] = w.seconds.get((t, phase.index), 0.0) + \
            time.perf_counter() - began
        for _, key, tensors in result.pushes:
            inbox[key] = tensors
        done.setdefault(phase.index, []).append(result)
        if phase.last:
            uid = unit_id(JOB, t, w.units[phase.index])
            cert = w.plan.certificate(JOB, t, uid, phase.index, done[phase.index])
            hashes = w.plan.receipt_hashes(JOB, t, uid, phase.index, done[phase.index], cert)
            receipt = sign(Receipt("test", KEY.public, JOB, uid, *hashes, ZERO_SIG), KEY)
            w.archive.keep_unit(t, cert, done[phase.index], receipt)
            w.receipts[(t, phase.index)] = receipt
    per_replica = []
    for r in range(R):
        grads = {}
        for key in w.plan.update_needs(t, r, range(w.plan.k)):
            add_grads(grads, {n: v for n, v in inbox[key].items() if n != "g"})
        per_replica.append(grads)
    grads = average_replicas(per_replica)
    with torch.no_grad():
        for opt in (*w.sections.optimizers, w.sections.client):
            opt.step(grads)


def case_of(w: Worker, t: int, index: int, receipts: dict | None = None) -> Case:
    """The judge's case of unit ``index`` at ``t``; other units' receipts from
    ``receipts`` (default: the worker's own, as the chain would hold them)."""
    receipt = w.receipts[(t, index)]
    others = w.receipts if receipts is None else receipts

    async def receipt_of(step, i):
        return others.get((step, i))
    return Case(tx_hash(receipt), receipt, w.units, 1, ("worker",), receipt_of)
