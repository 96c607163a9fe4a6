"""A running node: the chain store, a libp2p host and chain sync, under one nursery.

`Node.run` (what `pnode start` runs, specs/network.md "pnode start"):

1. opens the data dir's chain (exclusively: a second node on the same data
   dir fails here with `DataDirError`) and loads ``peer.key``;
2. opens the host on the listen multiaddr and starts `ChainService`;
3. writes ``D/node.addr``, the full listen multiaddr with ``/p2p/<peer id>``
   (atomically: temp file + ``os.replace``);
4. dials each ``peers`` address and syncs from it; a peer that cannot be
   reached is logged and retried with backoff, never fatal; every
   ``resync_s`` it syncs again from every connected peer.

Cancelling `run` (SIGINT/SIGTERM in `pnode start`) stops the host, removes
``node.addr`` and closes the store. ChainDB writes are atomic batches, so a
committed block is never lost, whenever the stop comes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import trio

from node.datadir import DataDir, write_private
from node.host import DialError, PeerIdentity, open_host
from node.sync import ChainService, Clock, SyncError, SyncResult

log = logging.getLogger(__name__)

DEFAULT_LISTEN = "/ip4/127.0.0.1/tcp/0"
ADDR_FILE = "node.addr"


class Node:
    """One node of a data dir, run by `run` until cancelled."""

    def __init__(self, data_dir: str | os.PathLike[str], clock: Clock, *,
                 listen: str = DEFAULT_LISTEN, peers: Sequence[str] = (),
                 report: Callable[[str], None] = lambda line: None,
                 dial_attempts: int = 5, first_backoff_s: float = 0.5,
                 resync_s: float = 5.0):
        self.datadir = DataDir(data_dir)
        self.clock, self.listen, self.peers = clock, listen, tuple(peers)
        self.report = report
        self.dial_attempts, self.first_backoff_s = dial_attempts, first_backoff_s
        self.resync_s = resync_s
        self.addr: str | None = None
        self.service: ChainService | None = None

    @property
    def addr_file(self) -> Path:
        return self.datadir.path / ADDR_FILE

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; reports its full listen address once listening.

        Raises:
            DataDirError: no data dir, or its chain is held by another node.
            HostError: the listen address cannot be used.
        """
        chain = self.datadir.open_chain()  # before anything else: a locked store fails fast
        try:
            identity = PeerIdentity.load(self.datadir.peer_key_file)
            async with open_host(identity, self.listen) as host, trio.open_nursery() as nursery:
                self.service = await nursery.start(ChainService(chain, host, self.clock).run)
                self.addr = host.addrs[0]
                write_private(self.addr_file, self.addr + "\n", 0o644, overwrite=True)
                try:
                    task_status.started(self.addr)
                    for peer in self.peers:
                        nursery.start_soon(self._join, peer)
                    nursery.start_soon(self._follow)
                    await trio.sleep_forever()
                finally:
                    self.addr_file.unlink(missing_ok=True)
        finally:
            self.service = None
            chain.store.close()

    async def _join(self, addr: str) -> None:
        """Dial ``addr`` (retrying with backoff) and sync from it once."""
        delay = self.first_backoff_s
        for attempt in range(1, self.dial_attempts + 1):
            try:
                peer = await self.service.host.connect(addr)
                break
            except DialError as exc:
                log.warning("peer %s unreachable (try %d of %d): %s",
                            addr, attempt, self.dial_attempts, exc)
                if attempt == self.dial_attempts:
                    self.report(f"giving up on peer {addr}")
                    return
                await trio.sleep(delay)
                delay *= 2
        await self._sync(peer)

    async def _follow(self) -> None:
        """Sync again from every connected peer now and then (missed gossip)."""
        while True:
            await trio.sleep(self.resync_s)
            for peer in self.service.host.connected_peers():
                await self._sync(peer)

    async def _sync(self, peer) -> SyncResult | None:
        try:
            result = await self.service.sync_from(peer)
        except SyncError as exc:
            log.warning("sync from %s stopped: %s", peer, exc)
            return None
        if result.added:
            self.report(f"synced {result.added} blocks from {str(peer)[:16]}..: "
                        f"height {result.height} tip {result.tip_hash.hex()[:16]}")
        return result

