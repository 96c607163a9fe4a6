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
from dataclasses import replace
from pathlib import Path

import trio

from ledger.codec import decode, encode
from ledger.crypto import SigningKey
from node.chain import ChainService, TxGossip
from node.errors import DataUnavailable, MinerError, NothingToMine
from node.mine.data import DataShelf
from node.mine.jobs import job_to_mine
from node.mine.miner import Miner
from node.pol import PolArchive, PolFetcher, StateCheck, Verifier, attack_hooks
from node.wire import STATE_PROTOCOL, StateReply, StateRequest

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
        shelf: the node's `node.mine.DataShelf`: a job's data file comes from
            it, or from peers into it.
    """

    def __init__(self, service: ChainService, txs: TxGossip, key: SigningKey, mine, *,
                 log_file: Path, report: Callable[[str], None], archive: PolArchive,
                 fetcher: PolFetcher, shelf: DataShelf) -> None:
        self.service, self.txs, self.key, self.mine = service, txs, key, mine
        self.shelf = shelf
        self.log_file, self.report, self.archive, self.fetcher = log_file, report, archive, fetcher
        self.miner: Miner | None = None
        self.verifier = None
        self.miners: dict[bytes, Miner] = {}  # every job mined here (kept to export and serve)
        self._states: dict[bytes, Callable] = {}  # job id -> its state server
        # Set once the first job's miner could take a unit, or there is nothing to mine.
        self.ready = trio.Event()
        self._said: str | None = None
        self._refused: dict[bytes, str] = {}  # jobs whose miner gave up: why

    async def run(self) -> None:
        """Mine job after job until cancelled."""
        worker_tamper, verifier_tamper, _ = attack_hooks(self.mine.attack)
        async with trio.open_nursery() as verifiers:
            while True:
                tip, choice = await self.service.call(self._choose)
                if isinstance(choice, str):
                    self._say(f"mining: {choice}")
                    self.ready.set()
                    await self.service.wait_tip_change(tip)
                    continue
                job_id, config = choice
                config = await self._with_data(job_id, config)
                if config is None:  # its data is nowhere yet: look again at the next tip
                    self.ready.set()
                    await self.service.wait_tip_change(tip)
                    continue
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
                                   job_id=job_id, serve_state=self._route_state,
                                   kept_states=self.verifier.state_source)
                self.miners[job_id] = self.miner
                await self._run_miner(job_id)

    async def _run_miner(self, job_id: bytes) -> None:
        async with trio.open_nursery() as nursery:
            async def pass_ready_on() -> None:
                await self.miner.ready.wait()
                self.ready.set()
            nursery.start_soon(pass_ready_on)
            try:
                await self.miner.run()
            except* MinerError as group:  # a job this node cannot mine: it waits for the next
                exc = _first_leaf(group)
                self._refused[job_id] = str(exc)
                self.report(f"not mining job {job_id.hex()[:16]}..: {exc}")
                self.ready.set()
            nursery.cancel_scope.cancel()

    async def _with_data(self, job_id: bytes, config):
        """``config`` with its files here: the data file's local path, and its ``init`` model
        file known by hash (`compute.pretrained`); each from the shelf, else fetched from peers.

        Returns None (and says why) when no peer has one of them.
        """
        data, peers = config.data, self.service.host.connected_peers()
        try:
            if config.init:
                await self.shelf.resolve_model(config.init, peers)
            if data.source != "file" or not data.sha256:
                return config
            path = await self.shelf.fetch(data.sha256, peers)
        except DataUnavailable as exc:
            self._say(f"mining: job {job_id.hex()[:16]}..: {exc}")
            return None
        return replace(config, data=replace(data, path=str(path)))

    def _route_state(self, job_id: bytes, serve) -> None:
        """Register a job's `STATE_PROTOCOL` server; one handler routes by the request's job,
        so a finished job's state stays fetchable (an export on another node)."""
        if not self._states:
            self.service.host.set_request_handler(STATE_PROTOCOL, self._serve_state,
                                                  max_request_size=1024)
        self._states[job_id] = serve

    async def _serve_state(self, peer, request: bytes) -> bytes:
        serve = self._states.get(decode(request, StateRequest).job_id)
        return await serve(peer, request) if serve else encode(StateReply(0, ()))

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


def _first_leaf(group: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups (trio wraps a task's error)."""
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    return group

