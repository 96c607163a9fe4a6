"""A worker's step run in-process, archived as a miner archives it, for judging (tests only).

The judge's tests fetch through `node.pol.fetch.ArchiveFetcher` (the
archive's replies through the codec, checked as over the wire), so its
logic is tested apart from libp2p; tests/node/pol/test_fetch.py runs the
protocol over real hosts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ledger.crypto import SigningKey
from ledger.types import ZERO_SIG, Receipt, sign, tx_hash
from node.mine.devnet import devnet_job
from proof_of_learning.step_plan import StepPlan
from node.pol.archive import PolArchive
from proof_of_learning.judge import Case
from proof_of_learning.replay import Replayer

JOB = b"j" * 32
KEY = SigningKey(b"\x05" * 32)  # the worker's node key: it signs its receipts


@dataclass
class Worker:
    """One process's run of a job's steps, every unit archived with its receipt."""

    replayer: Replayer  # its model, sections and plan: the swarm's step in one process
    archive: PolArchive
    receipts: dict[tuple[int, int], Receipt]  # (step, unit index): receipt
    units: tuple
    seconds: dict[tuple[int, int], float] = field(default_factory=dict)  # each unit's run
    key: SigningKey = KEY  # its node key: it signs its receipts
    job_id: bytes = JOB  # the job its receipts name (a real `Job`'s hash where one is needed)

    @property
    def config(self):
        return self.replayer.config

    @property
    def model(self):
        return self.replayer.model

    @property
    def sections(self):
        return self.replayer.sections

    @property
    def plan(self) -> StepPlan:
        return self.replayer.plan


def make_worker(k: int = 2, replicas: int = 1, key: SigningKey = KEY, path=None,
                sync_each: bool = True, **job) -> Worker:
    """A worker of the devnet's job (small batches unless ``job`` says otherwise);
    ``path``: the directory its archive keeps everything in (None: memory);
    ``sync_each``: as `PolArchive`'s (False: as a running node keeps it)."""
    config = devnet_job(4, 3, **{"batch_size": 2, "seq_len": 16, "k": k, "replicas": replicas,
                                 **job})
    replayer = Replayer(config)
    return Worker(replayer, PolArchive(path=path, sync_each=sync_each), {}, replayer.units,
                  key=key)


def run_step(w: Worker, t: int, run=None, certify=None) -> None:
    """Every unit of step ``t``, archived; then the update. ``run``: a cheating
    `plan.run`; ``certify``: what a cheater signs in place of a unit's certificate."""
    run = run or w.plan.run

    def timed(phase, *args):
        began = time.perf_counter()
        result = run(phase, *args)
        w.seconds[(t, phase.index)] = w.seconds.get((t, phase.index), 0.0) + \
            time.perf_counter() - began
        return result

    def signed(index, uid, cert, results, hashes):
        if certify is not None:
            cert = certify(cert)
            hashes = w.plan.receipt_hashes(w.job_id, t, uid, index, results, cert)
        receipt = sign(Receipt("test", w.key.public, w.job_id, uid, *hashes, ZERO_SIG), w.key)
        w.archive.keep_unit(t, cert, results, receipt)
        w.receipts[(t, index)] = receipt

    w.replayer.step(w.job_id, t, w.units, run=timed, on_unit=signed)
    if (t + 1) % w.config.state_every == 0:  # a checkpoint, as a miner keeps it
        for part in w.replayer.parts:
            w.archive.keep_state(w.job_id, t + 1, part, w.replayer.part_state(part))


def case_of(w: Worker, t: int, index: int, receipts: dict | None = None) -> Case:
    """The judge's case of unit ``index`` at ``t``; other units' receipts from
    ``receipts`` (default: the worker's own, as the chain would hold them)."""
    receipt = w.receipts[(t, index)]
    others = w.receipts if receipts is None else receipts

    async def receipt_of(step, i):
        return others.get((step, i))
    return Case(tx_hash(receipt), receipt, w.units, 1, ("worker",), receipt_of)
