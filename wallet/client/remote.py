"""Inference over the swarm: embeddings and head here, the layers on servers.

Owns `RemoteModel`, the client of ``/pnode/inference/3.1.0`` (specs/network.md
section 9.4), after Petals:

1. discovery: dial the given peers and ask each for its view of the swarm
   (`SwarmResponse`: signed announcements), timing each request as the RTT
   (kept in a `wallet.client.directory.SwarmDirectory`);
2. route: the cheapest chain of servers covering every layer
   (`wallet.client.route.plan_route`: announced throughput and load, measured RTT),
   only trusted peers when an allow-list is given, only registered ones
   when a registry is given (`pwallet infer` gives the chain's);
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
   (`wallet.client.route.plan_route` over that span; the hops before and after
   keep their sessions), and the new hops replay the hop's inputs in the
   original chunks (prompt, then one token per step) so their KV caches are
   bit-identical to the lost one; pushed, those inputs are first rebuilt
   by replaying the first hop's through the hops before it. The generation
   goes on; greedy output does not change. A failure unlinks the route:
   the rest of the generation is driven by the client.
6. spot checks (`wallet.client.spotcheck`): the first step and a drawn share of
   the others are rerun by other servers; a server whose answer the
   majority rejects is banned for the client's lifetime and replaced, and
   the signed answers are kept as evidence.

`RemoteModel` composes the parts, as Petals' client composes its sequence
manager and its inference sessions: it holds the embeddings and head, the
host and a `wallet.client.directory.SwarmDirectory` (the swarm view, exclusions and
route planning), and runs each generation's hops through a
`wallet.client.session.RouteRun` (sessions, push links and failover), which is
given the directory, never the model. The client's tunables and results live
in `wallet.client.generation` (re-exported here). Torch work (embedding, head, wire
encoding) runs on the process's one torch thread (`node.torch_thread`), never
on the trio loop, except a few rows' embedding or wire coding, which
`node.torch_thread.tensor_work` runs inline (cheaper than the thread hop).
"""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

import torch
import trio

from compute.generate import next_token
from compute.model import Transformer
from compute.tokenizer import Tokenizer
from ledger.types import format_coins
from node import torch_thread
from node.net import Host, PeerIdentity, open_host
from node.torch_thread import tensor_work
from node.wire import Announce, ServerInfo
from wallet.client.prompt import InferRequest, Token, prompt_ids
from wallet.client.directory import SwarmDirectory
from wallet.errors import HopFailed, RemoteError, RouteError, ServerBusy  # noqa: F401
from wallet.client.generation import ClientConfig, Generation, Served  # noqa: F401
from wallet.payer import InsufficientFunds, Payer, need
from wallet.client.route import Hop
from wallet.client.session import RouteRun
from wallet.client.spotcheck import SpotChecker


class RemoteModel:
    """Runs generations over the swarm's servers.

    Args:
        ends: a model part holding the embeddings and head (`ModelPart`).
        tokenizer: the model's tokenizer.
        model_id: the id servers must serve (`compute.gguf.model_id`).
        host: a running libp2p host of this client.
        trusted: when given, the only peer ids (base58) routed through.
        registered: when given, the registered servers (peer id base58 ->
            `wallet.registry.RegisteredNode`): no other is routed through.
            None: any server (a private swarm).
        config: codec and timeouts.
        payer: pays for sessions (`wallet.payer.Payer`: its ``max_price``
            bounds the servers routed through); None: free servers only.
    """

    def __init__(self, ends: Transformer, tokenizer: Tokenizer, model_id: str, host: Host, *,
                 trusted: Collection[str] | None = None,
                 registered: Mapping[str, object] | None = None,
                 config: ClientConfig = ClientConfig(), payer: Payer | None = None):
        self.ends, self.tokenizer, self.model_id, self.host = ends, tokenizer, model_id, host
        self.config, self.payer = config, payer
        self.directory = SwarmDirectory(host, model_id, trusted=trusted, registered=registered,
                                        max_price=payer.max_price if payer else 0)
        self.route: list[Hop] = []  # the hops of the generation under way, in order
        # The spot checks' draw: explicit and seedable, never the global random state.
        self.rng = random.Random(config.spot_check_seed)

    # -- the swarm (the directory's) --------------------------------------------------

    async def discover(self, peers: Collection[str]) -> list[Announce]:
        """Dial ``peers`` and gather their views of the swarm (`SwarmDirectory.discover`).

        Raises:
            RemoteError: none of the peers could be reached.
        """
        return await self.directory.discover(peers)

    async def refresh(self) -> None:
        """Ask every connected peer for its view again (`SwarmDirectory.refresh`)."""
        await self.directory.refresh()

    def servers(self) -> list[ServerInfo]:
        """The known servers of this model, as the route planner sees them."""
        return self.directory.servers()

    # -- generation -------------------------------------------------------------------

    async def generate(self, request: InferRequest,
                       on_token: Callable[[Token], None] = lambda t: None) -> Generation:
        """Generate for ``request`` over the swarm, calling ``on_token`` per token.

        Raises:
            NoRoute: the servers (or the trusted, or registered, ones) do not
                cover the model.
            SessionTooLong: the prompt plus new tokens is longer than every
                server of some layer announces it takes per session (before
                any session opens; a `RemoteError` and a `NoRoute`).
            RemoteError: failures beyond ``max_failovers``, or a server
                refused the request itself (e.g. too long for its budget).
        """
        cfg = self.ends.config
        ids = prompt_ids(self.tokenizer, request)
        max_len = len(ids) + max(request.max_tokens - 1, 0)
        if max_len > cfg.max_seq_len:
            raise RemoteError(f"prompt of {len(ids)} + {request.max_tokens} tokens exceeds the "
                              f"model's context of {cfg.max_seq_len}")
        result = Generation()
        self.directory.clear_exclusions()  # for this generation only: a server may come back
        if self.payer is not None:
            self.preflight(max_len)
        text = self.tokenizer.stream_decoder(skip_special=True)
        sampling = request.sampling
        gen = None if sampling.greedy else torch.Generator().manual_seed(sampling.seed)
        failure: Exception | None = None
        async with trio.open_nursery() as readers:  # one per hop session
            run = RouteRun(self.directory, self.host, self.config, result, max_len, readers,
                           on_route=self._set_route, payer=self.payer)
            spot = SpotChecker(run, self.rng, result.spot_checks)
            try:
                await run.open(0, cfg.n_layers)
                x = await torch_thread.run_sync(self._embed, ids)
                pos = 0
                for step in range(request.max_tokens):
                    h = await run.forward(x, pos)
                    if spot.wants(step):  # others rerun it: a wrong answer is caught (9.5)
                        h = await spot.check(pos, h)
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
        if self.payer is not None:
            result.tabs = [{"tab": t.tab_id.hex(), "locked": sum(x.cap for x in t.tab.lanes),
                            "paid": sum(t.amounts)} for t in self.payer.tabs]
        if failure is not None:
            raise failure
        return result

    def preflight(self, positions: int) -> None:
        """Raise unless the wallet can lock what the route of ``positions`` would need.

        Raises:
            InsufficientFunds: need and balance, in coins, with how the need is made.
            NoRoute: as `SwarmDirectory.plan` (no route within the max price...).
        """
        hops = self.directory.plan(0, self.ends.config.n_layers, positions=positions,
                                   ignore_load=True)
        servers = self.directory.server_map()
        needed = need(hops, servers, positions, self.payer.margin, self.payer.floor)
        if needed > self.payer.balance:
            bids = sorted({max(servers[h.peer_id].price, self.payer.floor) for h in hops})
            raise InsufficientFunds(
                f"insufficient funds: need {format_coins(needed)} coins ({positions} positions "
                f"x {self.ends.config.n_layers} layers x bid {'/'.join(map(str, bids))} base "
                f"units, x{self.payer.margin:g} margin for failover), balance "
                f"{format_coins(self.payer.balance)}")

    def _set_route(self, hops: list[Hop]) -> None:
        self.route = hops

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
                      registered: Mapping[str, object] | None = None,
                      config: ClientConfig = ClientConfig(),
                      payer: Payer | None = None) -> AsyncIterator[RemoteModel]:
    """A `RemoteModel` on a fresh client host (random identity) that knows ``peers``' swarm.

    Args:
        peers: multiaddrs (with /p2p/) of peers to ask for the swarm's view.
        parts: the client's embeddings, head and tokenizer.
        trusted, registered: as for `RemoteModel` (None: no such filter).
        config: codec and timeouts.
        payer: pays for sessions (None: free servers only).

    Raises:
        RemoteError: no peer reachable.
    """
    identity = PeerIdentity.from_seed(os.urandom(32))
    async with open_host(identity) as host:
        client = RemoteModel(parts.ends, parts.tokenizer, parts.model_id, host,
                             trusted=trusted, registered=registered, config=config, payer=payer)
        await client.discover(peers)
        yield client
