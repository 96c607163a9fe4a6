"""A node's model serving: which layers, loaded how, announced to whom.

Owns `LayerServer`, the component `pnode start` runs when the node serves
layers (specs/network.md section 9.1):

1. it reads the GGUF file's metadata and model id;
2. it takes its span: the one given (``--layers A:B``), or with ``auto`` the
   window of ``span_len`` layers the swarm serves least (`node.serve.placement`),
   after asking its peers for their views of the swarm;
3. it loads only those layers (`compute.model.ModelPart`) on the process's
   torch thread (`node.torch_thread`), on the chosen device, measures its
   decode throughput there, and serves
   sessions (`node.serve.sessions.InferenceServer`);
4. its announcement (span, throughput, load, price, addresses), signed with
   the node's peer key, goes out through the node's `Announcer`;
5. with ``auto`` it looks again every ``rebalance_s`` seconds and moves only
   when `node.serve.placement.should_move` says the swarm's bottleneck would clearly
   rise: new sessions get the new span; open ones finish on the old span's
   weights (their handlers hold them; freed when the last one ends).
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import trio

from compute.gguf import config_from_gguf, load_gguf, model_id, open_gguf
from ledger.errors import DecodeError
from node import torch_thread
from node.net import Host, PeerIdentity, RequestError
from node.serve.cashier import Cashier
from node.serve.placement import choose_span, should_move
from node.serve.sessions import InferenceServer, SessionConfig
from node.serve.throughput import measure_throughput
from node.serve.swarm import Announcer, announce_peer
from node.wire import Announce, ServerInfo, sign_announce

if TYPE_CHECKING:
    from gguf import GGUFReader

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeConfig:
    """What and how to serve.

    layers: the span (start, end), or None to choose it (``--auto``).
    span_len: layers held when choosing (default: the whole model).
    model_path: a GGUF file (default: the bundled SmolLM2-135M-Instruct).
    device: "cpu", "cuda:0", ...
    price: the ask, base units per position per layer, announced (0: free).
    threads: torch threads for the forward passes.
    rebalance_s, discover_s: how often an ``--auto`` server reconsiders its
        span, and how long it listens to the swarm before choosing one.
    sessions: the inference sessions' limits and timeouts.
    """

    layers: tuple[int, int] | None = None
    span_len: int | None = None
    model_path: str | None = None
    device: str = "cpu"
    price: int = 0
    threads: int = 2
    rebalance_s: float = 30.0
    discover_s: float = 2.0
    sessions: SessionConfig = SessionConfig()


class LayerServer:
    """Loads, serves and announces one span of the model's layers."""

    def __init__(self, host: Host, identity: PeerIdentity, announcer: Announcer,
                 clock: Callable[[], int], config: ServeConfig = ServeConfig(), *,
                 report: Callable[[str], None] = lambda line: None,
                 reader: GGUFReader | None = None, cashier: Cashier | None = None,
                 node_key: bytes = bytes(32)):
        """
        Args:
            reader: an open GGUF reader to load from (default: open
                ``config.model_path``); lets several servers share one.
            cashier: the node's payments (None: free sessions only; then the
                price must be 0).
            node_key: the node key announced for tab lanes (zeros: none).
        """
        self.host, self.identity, self.announcer = host, identity, announcer
        self.clock, self.config, self.report = clock, config, report
        self.inference: InferenceServer | None = None
        self.throughput = 0.0
        self.model_id = ""
        self._reader = reader
        self._n_layers = 0
        self.cashier, self.node_key = cashier, node_key

    async def run(self, *, task_status: trio.TaskStatus[LayerServer] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Load, serve and announce; with auto placement, rebalance; until cancelled."""
        torch.set_num_threads(self.config.threads)
        if self._reader is None:
            self._reader = await trio.to_thread.run_sync(open_gguf, self.config.model_path)
        self.model_id = model_id(self._reader)
        self._n_layers = config_from_gguf(self._reader).n_layers
        span = self.config.layers
        if span is None:
            span = await self._choose()
        await self._load(span)
        task_status.started(self)
        if self.config.layers is None:
            await self._rebalance_forever()
        else:
            await trio.sleep_forever()

    def announce(self) -> Announce | None:
        """This server's signed announcement now (None until it serves)."""
        server = self.inference
        if server is None:
            return None
        unsigned = Announce(
            self.identity.public_key, self.node_key, tuple(self.host.addrs[:8]), self.model_id,
            server.layers.start, server.layers.stop, int(self.throughput * 1000),
            len(server.sessions), server.config.max_sessions,
            server.config.max_chunk_positions, server.max_session_positions, self.config.price,
            self.clock(), bytes(64))
        return sign_announce(unsigned, self.identity.key_pair.private_key.sign)

    def status(self) -> dict:
        if self.inference is None:
            return {"serving": None, "sessions": 0}
        return {**self.inference.status(), "throughput": round(self.throughput, 2),
                "model_id": self.model_id, "device": self.config.device}

    # -- placement ---------------------------------------------------------------------

    def _span_len(self) -> int:
        return min(self.config.span_len or self._n_layers, self._n_layers)

    def _others(self) -> list[ServerInfo]:
        """The other servers of this model; one announcing no throughput adds no capacity."""
        me, others = str(self.host.peer_id), []
        for a in self.announcer.fresh():
            peer = str(announce_peer(a))
            if a.model_id == self.model_id and peer != me and a.throughput > 0:
                others.append(ServerInfo.from_announce(a, peer))
        return others

    async def _choose(self) -> tuple[int, int]:
        """The span the swarm serves least, after gathering the peers' views."""
        await self._gather_views()
        start = choose_span(self._others(), self._n_layers, self._span_len())
        return start, start + self._span_len()

    async def _gather_views(self) -> None:
        """Ask connected peers for their views; give gossip a moment as well."""
        with trio.move_on_after(self.config.discover_s):
            for peer in self.host.connected_peers():
                try:
                    await self.announcer.pull(peer, timeout=2.0)
                except (RequestError, DecodeError) as exc:  # a peer without the protocol, or gone
                    log.debug("no swarm view from %s: %s", peer, exc)
            await trio.sleep(self.config.discover_s)

    async def _rebalance_forever(self) -> None:
        # Each server waits its own share of the period (from its peer id), and
        # confirms a move on a fresh view before making it: two auto servers
        # with the same view cannot keep moving in lockstep and swap forever.
        me = str(self.host.peer_id)
        phase = 0.5 + int.from_bytes(hashlib.sha256(me.encode()).digest()[:4], "big") / 2**32
        while True:
            await trio.sleep(self.config.rebalance_s * phase)
            start = self._proposed_move(me)
            if start is None:
                continue
            await trio.sleep(2 * self.announcer.interval)  # others' moves show up meanwhile
            if self._proposed_move(me) != start:
                continue
            self.report(f"moving to layers {start}:{start + self._span_len()} "
                        "(the swarm serves them least)")
            try:
                await self._load((start, start + self._span_len()))
            except Exception as exc:  # e.g. out of memory: keep serving the old span
                log.warning("move to layers %d.. failed: %s: %s", start, type(exc).__name__, exc)
                self.report(f"could not move ({type(exc).__name__}: {exc}); still serving "
                            f"layers {self.inference.layers.start}:{self.inference.layers.stop}")

    def _proposed_move(self, me: str) -> int | None:
        assert self.inference is not None
        mine = ServerInfo(me, self.inference.layers.start, self.inference.layers.stop,
                          max(self.throughput, 1e-3))
        return should_move([*self._others(), mine], me, self._n_layers)

    async def _load(self, span: tuple[int, int]) -> None:
        """Load ``span``, measure it, and serve it in place of any earlier span.

        A move swaps the span in the same `InferenceServer`: open sessions
        finish on the old weights; the limits stay shared, and old and new
        forwards queue on the same torch thread.
        """
        began = time.monotonic()
        layers = range(*span)
        if self._reader is None:  # dropped after the last load: its metadata is large
            self._reader = await trio.to_thread.run_sync(open_gguf, self.config.model_path)
        try:
            model = await torch_thread.run_sync(self._load_part, layers)
        finally:
            self._reader = None
        await trio.to_thread.run_sync(_return_freed_memory)
        self.throughput = await torch_thread.run_sync(
            measure_throughput, model, layers, self.config.device)
        if self.inference is None:
            self.inference = InferenceServer(self.host, model, layers, self.model_id,
                                             device=self.config.device, config=self.config.sessions)
            self.inference.cashier = self.cashier
            self.inference.start()
        else:
            self.inference.swap(model, layers)
        self.report(f"serving layers {span[0]}:{span[1]} of {self._n_layers} on "
                    f"{self.config.device} ({self.throughput:.0f} tokens/s, loaded in "
                    f"{time.monotonic() - began:.1f} s)")
        await self.announcer.announce_now()

    def _load_part(self, layers: range):
        """Load ``layers``; on a CPU keep only the packed copies (half the memory)."""
        if self.config.device != "cpu":
            return load_gguf(reader=self._reader, layers=layers, ends=False).move(
                self.config.device)
        return load_gguf(reader=self._reader, layers=layers, ends=False, serve_only=True)


def _return_freed_memory() -> None:
    """Hand the loader's freed buffers back to the OS (glibc keeps them otherwise)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the memory is reused, just not returned
        pass

