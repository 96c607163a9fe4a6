"""Inference over the swarm: embeddings and head here, the layers on servers.

Owns `RemoteModel`, the client of ``/pnode/inference/2.1.0`` (specs/network.md
section 9.4), after Petals:

1. discovery: dial the given peers and ask each for its view of the swarm
   (`SwarmResponse`: signed announcements), timing each request as the RTT;
2. route: the cheapest chain of servers covering every layer
   (`wallet.route.plan_route`: announced throughput and load, measured RTT),
   only trusted peers when an allow-list is given;
3. one session per hop (the server keeps the KV cache); each step sends the
   hidden states entering the hop and gets those leaving it;
4. push routing (``ClientConfig.push``): the client `Link`s each hop to the
   next and sends a step to the first hop only; the hops push the hidden
   states along the route themselves and only the last answers (one
   crossing per hop instead of a round trip through the client, and no
   copies to read while the next hop computes);
5. failover: the inputs sent to each hop are kept (pushed: the first
   hop's only). When a hop fails (its connection drops, it answers an
   error, or a step takes longer than ``step_timeout``), the hop's peer is
   excluded, the hop's span is planned again over the other servers
   (`wallet.route.plan_route` over that span; the hops before and after
   keep their sessions), and the new hops replay the hop's inputs in the
   original chunks (prompt, then one token per step) so their KV caches are
   bit-identical to the lost one; pushed, those inputs are first rebuilt
   by replaying the first hop's through the hops before it. The generation
   goes on; greedy output does not change. A failure unlinks the route:
   the rest of the generation is driven by the client.

The hops' sessions, push links and failover live in `wallet.session`; the
client's tunables and results in `wallet.generation` (re-exported here). Torch
work (embedding, head, wire encoding) runs in worker threads, never on the
trio loop.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass

import torch
import trio

from compute.generate import next_token
from compute.model import Transformer
from compute.tokenizer import Tokenizer
from ledger.errors import DecodeError
from node import torch_thread
from node.net.host import DialError, Host, PeerIdentity, RequestError, open_host
from node.serve.sessions import tensor_work
from node.wire.serve import Announce
from node.serve.swarm import SwarmView, announce_peer, fetch_view
from wallet.client import InferRequest, Token
from wallet.errors import HopFailed, RemoteError, RouteError, ServerBusy  # noqa: F401
from wallet.generation import ClientConfig, Generation, Served  # noqa: F401
from wallet.session import RouteRun
from wallet.route import Hop, ServerInfo, plan_route


class RemoteModel:
    """Runs generations over the swarm's servers.

    Args:
        ends: a model part holding the embeddings and head (`ModelPart`).
        tokenizer: the model's tokenizer.
        model_id: the id servers must serve (`compute.gguf.model_id`).
        host: a running libp2p host of this client.
        trusted: when given, the only peer ids (base58) routed through.
        config: codec and timeouts.
    """

    def __init__(self, ends: Transformer, tokenizer: Tokenizer, model_id: str, host: Host, *,
                 trusted: Collection[str] | None = None, config: ClientConfig = ClientConfig()):
        self.ends, self.tokenizer, self.model_id, self.host = ends, tokenizer, model_id, host
        self.trusted = None if trusted is None else set(trusted)
        self.config = config
        self.view = SwarmView(ttl=3600.0)  # refreshed on demand, not by gossip
        self.rtt: dict[str, float] = {}
        self.dead: set[str] = set()
        self.route: list[Hop] = []  # the hops of the generation under way, in order

    # -- discovery --------------------------------------------------------------------

    async def discover(self, peers: Collection[str]) -> list[Announce]:
        """Dial ``peers`` and gather their views of the swarm.

        Raises:
            RemoteError: none of the peers could be reached.
        """
        errors = []
        for addr in peers:
            try:
                await self.host.connect(addr)
            except DialError as exc:
                errors.append(str(exc))
        if len(errors) == len(peers):
            raise RemoteError("no peer reachable: " + "; ".join(errors))
        await self.refresh()
        return self.view.fresh(trio.current_time())

    async def refresh(self) -> None:
        """Ask every connected peer for its view; time each ask as that peer's RTT."""
        for peer in self.host.connected_peers():
            if str(peer) in self.dead:
                continue  # a stalled server would cost a timeout per failover
            began = time.perf_counter()
            try:
                announces = await fetch_view(self.host, peer, timeout=5.0)
            except (RequestError, DecodeError):
                continue  # not a serving node, or gone: other peers may know
            self.rtt[str(peer)] = time.perf_counter() - began
            now, now_ms = trio.current_time(), time.time_ns() // 1_000_000
            for announce in announces:
                self.view.add(announce, now, now_ms)

    def servers(self) -> list[ServerInfo]:
        """The known servers of this model, as the route planner sees them."""
        out = []
        for a in self.view.fresh(trio.current_time()):
            if a.model_id != self.model_id:
                continue
            try:  # one odd announcement must not take every route down with it
                out.append(ServerInfo(str(announce_peer(a)), a.layer_start, a.layer_end,
                                      max(a.throughput, 1e-3), a.load, a.max_sessions, a.price))
            except RouteError:
                continue
        return out

    def throughput(self, peer_id: str) -> float:
        """The announced tokens/s of a server (a slow default when unknown)."""
        return next((s.throughput for s in self.servers() if s.peer_id == peer_id), 1.0)

    def announced_full(self, start: int, end: int) -> bool:
        """Whether some server covering part of [start, end) announced itself full."""
        return any(s.load >= s.max_sessions and s.start < end and start < s.end
                   and s.peer_id not in self.dead for s in self.servers())

    def _addrs(self, peer_id: str) -> tuple[str, ...]:
        """The announced addresses of ``peer_id`` that name that same peer."""
        for a in self.view.fresh(trio.current_time()):
            if str(announce_peer(a)) == peer_id:
                return tuple(addr for addr in a.addrs if addr.endswith(f"/p2p/{peer_id}"))
        return ()

    def plan(self, start: int, end: int, also_exclude: Collection[str] = ()) -> list[Hop]:
        """The cheapest route over [start, end) avoiding failed (and ``also_exclude``) servers.

        Raises:
            NoRoute: the usable servers do not cover the span.
        """
        return plan_route(self.servers(), start, end, rtt=self.rtt,
                          exclude=self.dead | set(also_exclude), allowed=self.trusted)

    # -- generation -------------------------------------------------------------------

    async def generate(self, request: InferRequest,
                       on_token: Callable[[Token], None] = lambda t: None) -> Generation:
        """Generate for ``request`` over the swarm, calling ``on_token`` per token.

        Raises:
            NoRoute: the servers (or the trusted ones) do not cover the model.
            RemoteError: failures beyond ``max_failovers``, or a server
                refused the request itself (e.g. too long for its budget).
        """
        cfg = self.ends.config
        ids = (self.tokenizer.encode(request.prompt) if request.raw else
               self.tokenizer.encode_chat([{"role": "user", "content": request.prompt}]))
        max_len = len(ids) + max(request.max_tokens - 1, 0)
        if max_len > cfg.max_seq_len:
            raise RemoteError(f"prompt of {len(ids)} + {request.max_tokens} tokens exceeds the "
                              f"model's context of {cfg.max_seq_len}")
        result = Generation()
        self.dead = set()  # excluded for this generation only: a server may come back
        text = self.tokenizer.stream_decoder(skip_special=True)
        sampling = request.sampling
        gen = None if sampling.greedy else torch.Generator().manual_seed(sampling.seed)
        failure: Exception | None = None
        async with trio.open_nursery() as readers:  # one per hop session
            run = RouteRun(self, result, max_len, readers)
            try:
                await run.open(0, cfg.n_layers)
                x = await torch_thread.run_sync(self._embed, ids)
                pos = 0
                for step in range(request.max_tokens):
                    h = await run.forward(x, pos)
                    tok = await torch_thread.run_sync(self._pick, h, sampling, gen)
                    result.token_ids.append(tok)
                    on_token(Token(tok, text.push(tok)))
                    if tok in self.tokenizer.stop_ids or step == request.max_tokens - 1:
                        break
                    pos += x.shape[1]
                    x = await tensor_work(self._embed, [tok], rows=1)
            except Exception as exc:  # raised as itself below, not in the nursery's group
                failure = exc
            finally:
                await run.close()
                readers.cancel_scope.cancel()  # and any reader a failure left behind
        if failure is not None:
            raise failure
        return result

    def _embed(self, ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return self.ends.embed(torch.tensor([ids]))  # (1, T, C)

    def _pick(self, h: torch.Tensor, sampling, gen) -> int:
        with torch.inference_mode():
            logits = self.ends.head(h[:, -1:])  # (1, 1, V)
            return int(next_token(logits[0, -1], sampling, gen).item())



@dataclass(frozen=True)
class ClientParts:
    """What a client loads: the embeddings and head, the tokenizer, the model id."""

    ends: Transformer
    tokenizer: Tokenizer
    model_id: str


def load_client_parts(path: str | None = None) -> ClientParts:
    """Load the embeddings/head part of a GGUF model (no layers) and its tokenizer.

    Raises:
        ModelFileError: missing or unsupported file.
    """
    from compute.gguf import load_gguf, model_id, open_gguf

    reader = open_gguf(path)
    return ClientParts(load_gguf(reader=reader, layers=range(0)),
                       Tokenizer.from_gguf(reader=reader), model_id(reader))


@asynccontextmanager
async def open_remote(peers: Collection[str], parts: ClientParts, *,
                      trusted: Collection[str] | None = None,
                      config: ClientConfig = ClientConfig()) -> AsyncIterator[RemoteModel]:
    """A `RemoteModel` on a fresh client host (random identity) that knows ``peers``' swarm.

    Raises:
        RemoteError: no peer reachable.
    """
    identity = PeerIdentity.from_seed(os.urandom(32))
    async with open_host(identity) as host:
        client = RemoteModel(parts.ends, parts.tokenizer, parts.model_id, host,
                             trusted=trusted, config=config)
        await client.discover(peers)
        yield client
