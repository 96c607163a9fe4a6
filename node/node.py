"""A running node: the chain store, a libp2p host, sync, gossip, block production
and the control socket, under one nursery.

`Node.run` (what `pnode start` runs, specs/network.md "pnode start"):

1. opens the data dir's chain (exclusively: a second node fails here with
   `DataDirError`, after ``LOCK_WAIT_S`` for a reading command to let go);
2. opens the host on ``network.listen`` (``network.trusted``: an allow-list),
   starts `ChainService`, `TxGossip`, the `WalletDesk` (light clients), the
   `DataShelf` (job data), the `ControlServer` on ``D/node.sock`` (the CLIs'
   way in while the node holds the store; its ops are `node.control.NodeOps`)
   and the `Announcer`;
3. dials each of ``network.peers`` and of its peer book ``D/peers``
   (`node.datadir.PeerBook`: the peers it reached before) and syncs from
   it; a peer that cannot be reached is logged and retried with backoff,
   never fatal, and a lost one is redialled for as long as the node runs;
   every ``network.resync_s`` it syncs again from every connected (trusted)
   peer (`node.net.PeerKeeper`); producing blocks with no peer left, having
   had some, is said once, loudly (`node.net.AloneWatch`);
4. with ``serve``, starts the `LayerServer` (after the first joins when it
   places itself) and its `Cashier` (paid sessions' tabs and claims, kept
   in ``D/tabs``): loads its layers, serves sessions, announces them;
5. writes ``D/node.addr``, the full listen multiaddr with ``/p2p/<peer id>``
   (atomically: temp file + ``os.replace``), once listening and serving;
6. once the first syncs are over and the miner is set up (``network.catch_up_s``
   at most), the `Producer` if ``produce.enabled`` and, with ``mine``, the
   `JobRunner` (`node.mine.runner`: the chain's jobs, one after another).

Cancelling `run` (SIGINT/SIGTERM) stops the host, removes ``node.addr`` and
``node.sock`` and closes the store. A block is reported, gossiped or served
only once its atomic, durable batch returned, so an announced block is never
lost. A store fault (a failed write, damaged files) stops the node at once
with `StoreFault`, one line: no write may land after a failed one, and a
damaged store is served to no peer (after Bitcoin Core's AbortNode).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from libp2p.peer.id import ID

from ledger.crypto import SigningKey
from ledger.errors import StoreError, StoreFailedError
from node.chain import (
    ChainService, ChainTabs, Producer, Registrar, SyncError, SyncResult, TxGossip, WalletDesk,
)
from node.clock import Clock
from node.control import ControlOp, ControlServer, NodeOps, socket_path
from node.datadir import DataDir
from node.errors import ChainLockedError, NodeError
from node.datadir import read_public_key, write_private
from node.mine import DataShelf
from node.net import AloneWatch, PeerIdentity, PeerKeeper, open_host
from node.serve import Announcer, Cashier, LayerServer, ServeConfig, announce_peer

log = logging.getLogger(__name__)

DEFAULT_LISTEN = "/ip4/127.0.0.1/tcp/0"  # an embedded node's: any free port
ADDR_FILE = "node.addr"
#: Most seconds production waits for ``wait_peers`` peers.
WAIT_PEERS_S = 60.0
TRAIN_LOG = "train.jsonl"  # one JSON line per loss this node computed
#: How long a starting node waits for a command that reads its store to let go of it.
LOCK_WAIT_S = 5.0


@dataclass(frozen=True)
class NetworkConfig:
    """Where a node listens and whom it talks to.

    listen: multiaddr to listen on.
    peers: full multiaddrs (``.../p2p/<id>``) to join.
    trusted: when given, the only peer ids (base58) this node dials, syncs
        and gossips with and takes announcements from; clients may still use
        its swarm and inference protocols.
    dial_attempts, first_backoff_s: retries of each ``peers`` dial.
    resync_s: seconds between syncs from every connected peer.
    catch_up_s: most seconds production, placement, registration and mining
        wait for the first syncs.
    """

    listen: str = DEFAULT_LISTEN
    peers: tuple[str, ...] = ()
    trusted: frozenset[str] | None = None
    dial_attempts: int = 5
    first_backoff_s: float = 0.5
    resync_s: float = 5.0
    catch_up_s: float = 20.0


@dataclass(frozen=True)
class ProduceConfig:
    """Whether and how a node seals blocks.

    enabled: seal blocks when this node is a registered producer.
    block_interval_ms: least time between the tip and a block this node
        seals on it (None: the chain's slot).
    wait_peers: production also waits (``WAIT_PEERS_S`` at most) until this
        many peers are connected.
    """

    enabled: bool = True
    block_interval_ms: int | None = None
    wait_peers: int = 0


@dataclass(frozen=True)
class MineConfig:
    """How a node mines the chain's jobs.

    job: the job config to mine (`compute.data.JobConfig`; None: whichever
        job the chain trains, from its on-chain spec).
    average_every: updates between the replicas' averaging rounds.
    device: where the miner trains ("cpu" or "cuda:N").
    attack: how this node cheats, for the attack battery only (None: it does not).
    """

    job: Any = None
    average_every: int = 10
    device: str = "cpu"
    attack: str | None = None  # test-only: `node.pol.attacks.ATTACKS` (the attack battery)


class StoreFault(NodeError):
    """The node stopped because its chain store failed (see the module docstring)."""


def store_fault_line(exc: StoreError) -> str:
    """The one line a node stopped by ``exc`` says: what failed and what to do."""
    if isinstance(exc, StoreFailedError):
        return (f"the chain store failed and the node stopped: {exc}. Every block it "
                "announced is on disk; fix the cause (free disk space?) and start it again")
    return (f"the chain store is damaged and the node stopped (it serves no peer from it): "
            f"{exc}. Check it with `pnode verify chain`, or init a fresh data dir and sync "
            "it from peers")


class Node:
    """One node of a data dir, run by `run` until cancelled.

    Args:
        data_dir: an initialised data dir (`pnode init`).
        clock: wall-clock time in ms.
        network: listening, peers, trust and retries.
        produce: block production.
        serve: the layers to serve and how (None: serve nothing).
        mine: the job to mine (None: do not mine).
        wallet_key: the unlocked wallet key: a serving node registers itself
            with it (None: it says it cannot).
        bond: base units to bond when registering (None: the chain's minimum).
        report: gets the lines `pnode start` prints.
        strict: refuse a chain store whose recovery would drop records
            (`DataDir.open_chain`).
    """

    def __init__(self, data_dir: str | os.PathLike[str], clock: Clock, *,
                 network: NetworkConfig = NetworkConfig(),
                 produce: ProduceConfig = ProduceConfig(),
                 serve: ServeConfig | None = None, mine: MineConfig | None = None,
                 wallet_key: SigningKey | None = None, bond: int | None = None,
                 report: Callable[[str], None] = lambda line: None, strict: bool = False):
        self.datadir = DataDir(data_dir)
        self.clock, self.report, self.strict = clock, report, strict
        self.network, self.production, self.serve, self.mine = network, produce, serve, mine
        self.trusted = None if network.trusted is None else {
            ID.from_base58(p) for p in network.trusted}
        self.announcer: Announcer | None = None
        self.server: LayerServer | None = None
        self.spot_voter = None  # a serving node's `node.pol.SpotVoter`
        self.wallet_key, self.bond = wallet_key, bond
        self.registrar: Registrar | None = None
        self.jobs = None  # the mining node's `node.mine.JobRunner`
        self.archive = None  # what the miner keeps for its verifiers (node.pol.PolArchive)
        self.addr: str | None = None
        self.service: ChainService | None = None
        self.fault_source: ChainService | None = None  # kept after run, to name the fault
        self.txs: TxGossip | None = None
        self.producer: Producer | None = None
        self.production_held = False  # the ``hold_production`` op was called
        self.address: bytes | None = None  # the default wallet's account
        self.node_key: bytes | None = None

    @property
    def addr_file(self) -> Path:
        return self.datadir.path / ADDR_FILE

    @property
    def sock_file(self) -> Path:
        return socket_path(self.datadir.path)

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; reports its full listen address once listening.

        Raises:
            DataDirError: no data dir, or its chain is held by another node.
            HostError: the listen address cannot be used.
            StoreFault: the chain store failed while running.
        """
        chain = await self._open_chain()
        try:
            await self._run(chain, task_status)
        except BaseException as exc:
            fault = None if self.fault_source is None else self.fault_source.store_fault
            if fault is not None and not isinstance(exc, (KeyboardInterrupt, trio.Cancelled)):
                raise StoreFault(store_fault_line(fault)) from None
            raise
        finally:
            self.service = self.txs = self.producer = self.announcer = self.server = None
            chain.close()

    async def _open_chain(self):
        """The chain store, tried again for ``LOCK_WAIT_S`` while a command reads it."""
        with trio.move_on_after(LOCK_WAIT_S):
            while True:
                try:
                    return self.datadir.open_chain(strict=self.strict)
                except ChainLockedError:
                    await trio.sleep(0.05)
        return self.datadir.open_chain(strict=self.strict)  # still locked: another node's

    async def _run(self, chain, task_status: trio.TaskStatus[str]) -> None:
        """`run` on an open chain."""
        identity = PeerIdentity.from_seed(self.datadir.peer_key().seed())
        key = self.datadir.node_key()
        self.node_key = key.public
        self.address = read_public_key(self.datadir.wallet_file)
        book = self.datadir.open_peer_book()
        try:
            await self._run_with(chain, book, identity, key, task_status)
        finally:
            book.close()

    async def _run_with(self, chain, book, identity, key,
                        task_status: trio.TaskStatus[str]) -> None:
        """`_run` with the peer book open."""
        async with open_host(identity, self.network.listen, trusted=self.trusted) as host, \
                trio.open_nursery() as nursery:
            service = ChainService(chain, host, self.clock, on_sync=self._synced,
                                   on_tip=self.datadir.write_tip_marker)
            self.fault_source = service
            nursery.start_soon(self._stop_on_store_fault, service)
            self.service = await nursery.start(service.run)
            self.txs = await nursery.start(TxGossip(self.service).run)
            WalletDesk(self.service, self.txs).install()  # light clients (`pwallet --peers`)
            self.shelf = DataShelf(self.datadir.path / "data", host)  # job data by hash
            self.shelf.install()
            await nursery.start(ControlServer(self.sock_file, self.control_ops()).run)
            self.announcer = await nursery.start(
                Announcer(host, self.clock, allowed=self.trusted).run)
            peers = PeerKeeper(host, self._sync, peers=(*self.network.peers, *book.addrs()),
                               dial_attempts=self.network.dial_attempts,
                               first_backoff_s=self.network.first_backoff_s,
                               resync_s=self.network.resync_s, report=self.report,
                               seen=lambda addr: self._remember(book, addr))
            joined = trio.Event()
            nursery.start_soon(peers.join_all, joined)
            nursery.start_soon(AloneWatch(host, self._produced, report=self.report,
                                          now_ms=self.clock).run)
            if self.serve is not None:
                await self._start_serving(nursery, host, identity, joined)
            self.addr = host.addrs[0]
            # Written once listening *and* serving (the scripting contract).
            write_private(self.addr_file, self.addr + "\n", 0o644, overwrite=True)
            try:
                task_status.started(self.addr)
                if self.production.enabled:
                    nursery.start_soon(self._produce_after, joined, key, host)
                if self.server is not None:
                    nursery.start_soon(self._register_after, joined, key, identity)
                if self.mine is not None:
                    nursery.start_soon(self._mine_after, joined, key)
                nursery.start_soon(peers.follow)
                await trio.sleep_forever()
            finally:
                self.addr_file.unlink(missing_ok=True)

    async def _stop_on_store_fault(self, service: ChainService) -> None:
        await service.store_broken.wait()  # whoever caught it: stop the node
        assert service.store_fault is not None
        raise StoreFault(store_fault_line(service.store_fault))

    async def _start_serving(self, nursery: trio.Nursery, host, identity,
                             joined: trio.Event) -> None:
        """Start the `LayerServer`; placed automatically only once the peers were joined."""
        if self.serve.layers is None:
            with trio.move_on_after(self.network.catch_up_s):
                await joined.wait()
        cashier = Cashier(ChainTabs(self.service, self.txs), self.datadir.node_key(),
                          self.serve.price, self.datadir.path / "tabs", report=self.report)
        await nursery.start(cashier.run)
        self.server = LayerServer(host, identity, self.announcer, self.clock, self.serve,
                                  report=self.report, cashier=cashier, node_key=self.node_key)
        self.announcer.make_announce = self.server.announce
        await nursery.start(self.server.run)
        from node.pol import SpotVoter  # torch is loaded by now: the server holds a model

        # Drawn for a spot case (specs/ledger.md 5.2): re-run it on the served model, vote.
        self.spot_voter = SpotVoter(self.service, self.txs, self.datadir.node_key(),
                                    lambda: self.server.inference if self.server else None,
                                    report=self.report)
        nursery.start_soon(self.spot_voter.run)

    # -- hooks --------------------------------------------------------------------------

    def control_ops(self) -> dict[str, ControlOp]:
        """The control socket's ops (`node.control.NodeOps`; a subclass may add some)."""
        return NodeOps(self).table()

    def extra_status(self) -> dict[str, Any]:  # serving: span, sessions, the swarm seen
        info: dict[str, Any] = self.server.status() if self.server else {
            "serving": None, "sessions": 0}
        if self.announcer is not None:
            info["swarm"] = [{"peer_id": str(announce_peer(a)), "layers": [a.layer_start,
                              a.layer_end], "throughput": a.throughput, "load": a.load,
                              "price": a.price} for a in self.announcer.fresh()]
        miner, verifier = (self.jobs.miner, self.jobs.verifier) if self.jobs else (None, None)
        info["mining"] = miner.status() if miner else None
        info["verifier"] = verifier.status() if verifier else None
        info["trusted_peers"] = None if self.trusted is None else sorted(map(str, self.trusted))
        return info

    # -- peers and production -----------------------------------------------------------

    async def _produce_after(self, joined: trio.Event, key, host) -> None:
        """Produce once the first syncs are over (or after ``catch_up_s``).

        Waiting keeps a restarted producer from sealing blocks on a stale tip;
        the limit keeps unreachable peers from keeping it from producing.
        """
        with trio.move_on_after(self.network.catch_up_s):
            await joined.wait()
            # A mining node produces once it can run units: blocks sealed
            # before would let its first deadlines pass while it builds the
            # job's model (a miss, and a jail term, for no fault of the work).
            while self.mine is not None and (self.jobs is None or not self.jobs.ready.is_set()):
                await (self.jobs.ready.wait() if self.jobs else trio.sleep(0.05))
        with trio.move_on_after(WAIT_PEERS_S):
            while len(host.connected_peers()) < self.production.wait_peers:
                await trio.sleep(0.1)
        withhold = None
        if self.mine is not None and self.mine.attack is not None:  # the attack battery only
            from node.pol import attack_hooks
            withhold = attack_hooks(self.mine.attack)[2]
        self.producer = Producer(self.service, key, self.clock,
                                 interval_ms=self.production.block_interval_ms, report=self.report,
                                 withhold=withhold)
        if self.production_held:
            self.producer.hold()
        await self.producer.run()

    async def _register_after(self, joined: trio.Event, key, identity) -> None:
        """Register the served span once the first syncs are over (see `Registrar`)."""
        with trio.move_on_after(self.network.catch_up_s):
            await joined.wait()
        inference = self.server.inference  # its layers change when the server moves

        def served() -> tuple[int, int]:
            return inference.layers.start, inference.layers.stop
        self.registrar = Registrar(self.service, self.txs, self.wallet_key, self.address, key,
                                   self.datadir.peer_key(), served, bond=self.bond,
                                   report=self.report)
        await self.registrar.run()

    async def _mine_after(self, joined: trio.Event, key) -> None:
        """Mine and verify the chain's jobs (`node.mine.runner`) once the first syncs are over."""
        from node.mine import JobRunner  # torch loads with it
        from node.pol import PolArchive, PolFetcher, serve_pol
        from node.wire import MAX_POL_REQUEST, POL_PROTOCOL

        with trio.move_on_after(self.network.catch_up_s):
            await joined.wait()
        # On disk: a restarted worker still answers the audits of units it ran before
        # (opening reads the journal and sweeps the directory: off the event loop).
        # Written without an fsync per unit (it was most of PoL's cost to a worker, on
        # the step's path): flushed every SYNC_S seconds, off the event loop.
        archive = self.archive = await trio.to_thread.run_sync(
            lambda: PolArchive(path=self.datadir.pol_dir, sync_each=False))
        self.service.host.set_request_handler(POL_PROTOCOL, serve_pol(archive),
                                              max_request_size=MAX_POL_REQUEST)
        self.jobs = JobRunner(self.service, self.txs, key, self.mine,
                              log_file=self.datadir.path / TRAIN_LOG, report=self.report,
                              archive=archive, fetcher=PolFetcher(self.service.host),
                              shelf=self.shelf)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._flush_archive, archive)
            await self.jobs.run()

    @staticmethod
    async def _flush_archive(archive) -> None:
        """Make the archive's writes durable every `SYNC_S` seconds while the node runs,
        and once more as it stops."""
        from node.pol import SYNC_S
        try:
            while True:
                await trio.sleep(SYNC_S)
                await trio.to_thread.run_sync(archive.flush)
        finally:
            archive.flush()  # stopping: blocking, once

    def _produced(self) -> int:
        return 0 if self.producer is None else len(self.producer.made)

    def _remember(self, book, addr: str) -> None:
        """Keep a reached peer's address for the next start (a failed write is only logged)."""
        try:
            book.record(addr, self.clock())
        except (StoreError, ValueError) as exc:
            log.warning("peer book: cannot keep %s: %s", addr, exc)

    async def _sync(self, peer) -> SyncResult | None:
        try:
            return await self.service.sync_from(peer)
        except SyncError as exc:
            log.warning("sync from %s stopped: %s", peer, exc)
            return None

    def _synced(self, result: SyncResult) -> None:  # a line per sync that added blocks
        self.report(f"synced {result.added} blocks from {str(result.peer)[:16]}..: "
                    f"height {result.height} tip {result.tip_hash.hex()[:16]}")
