"""A mining node's jobs: the chain's training jobs, one after another, each mined and verified.

Owns `JobRunner`, what `pnode start` runs when it mines. The chain trains
one job at a time (`ledger.jobrules`); the runner asks which
(`node.mine.jobs.job_to_mine`: the job the chain trains now or next, or the
one ``--job`` names), builds a `Miner` and a `Verifier` for it from the
job's on-chain spec, and runs the miner until the job is finished; then the
next. Each job's verifier keeps running after its miner is done: the job's
last receipts are audited after it ends. When there is nothing to mine it
says why once, and looks again at each new tip.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import trio

from node.errors import MinerError, NothingToMine
from node.mine import Miner, job_to_mine

__all__ = ["JobRunner"]


class JobRunner:
    """Mines the chain's jobs in turn (module docstring).

    Args:
        service, txs: the node's chain service and transaction gossip.
        key: the node key (units are assigned to it; it signs receipts and verdicts).
        mine: the node's `node.node.MineConfig` (its ``job`` may be None: the
            chain's choice).
        log_file: where each computed loss is appended (`Miner`).
        report: gets the lines `pnode start` prints.
        archive, fetcher: the node's PoL archive and fetcher, shared by every job.
    """

    def __init__(self, service, txs, key, mine, *, log_file: Path,
                 report: Callable[[str], None], archive, fetcher) -> None:
        self.service, self.txs, self.key, self.mine = service, txs, key, mine
        self.log_file, self.report, self.archive, self.fetcher = log_file, report, archive, fetcher
        self.miner: Miner | None = None
        self.verifier = None
        # Set once the first job's miner could take a unit, or there is nothing to mine.
        self.ready = trio.Event()
        self._said: str | None = None
        self._refused: dict[bytes, str] = {}  # jobs whose miner gave up: why

    async def run(self) -> None:
        """Mine job after job until cancelled."""
        from node.pol import StateCheck, Verifier, attack_hooks  # torch loads with them

        worker_tamper, verifier_tamper = attack_hooks(self.mine.attack)
        async with trio.open_nursery() as verifiers:
            while True:
                tip, choice = await self.service.call(self._choose)
                if isinstance(choice, str):
                    self._say(f"mining: {choice}")
                    self.ready.set()
                    await self.service.wait_tip_change(tip)
                    continue
                job_id, config = choice
                self._said = None
                self.verifier = Verifier(self.service, self.txs, self.key, config, self.archive,
                                         self.fetcher, report=self.report,
                                         tamper=verifier_tamper, job_id=job_id)
                verifiers.start_soon(self.verifier.run)
                self.miner = Miner(self.service, self.txs, self.key, config,
                                   log_file=self.log_file, average_every=self.mine.average_every,
                                   report=self.report, device=self.mine.device,
                                   archive=self.archive, tamper=worker_tamper,
                                   state_check=StateCheck(self.fetcher,
                                                          self.verifier.receipts_of),
                                   job_id=job_id)
                await self._run_miner(job_id)

    async def _run_miner(self, job_id: bytes) -> None:
        async with trio.open_nursery() as nursery:
            async def pass_ready_on() -> None:
                await self.miner.ready.wait()
                self.ready.set()
            nursery.start_soon(pass_ready_on)
            try:
                await self.miner.run()
            except MinerError as exc:  # a job this node cannot mine: it waits for the next
                self._refused[job_id] = str(exc)
                self.report(f"not mining job {job_id.hex()[:16]}..: {exc}")
                self.ready.set()
            nursery.cancel_scope.cancel()

    def _choose(self):
        """(tip, (job id, config) or why there is nothing to mine) (chain thread)."""
        chain = self.service.chain
        try:
            job_id, config = job_to_mine(chain.state, self.mine.job)
        except NothingToMine as exc:
            return chain.tip_hash, str(exc)
        if job_id in self._refused:
            return chain.tip_hash, (f"job {job_id.hex()[:16]}.. cannot be mined here "
                                    f"({self._refused[job_id]}); waiting for the next")
        return chain.tip_hash, (job_id, config)

    def _say(self, line: str) -> None:
        if line != self._said:
            self._said = line
            self.report(line)
