"""Inference over the swarm: embeddings and head here, the layers on servers.

Owns `RemoteModel`, the client of ``/pnode/inference/1.0.0`` (specs/network.md
section 9.4), after Petals:

1. discovery: dial the given peers and ask each for its view of the swarm
   (`SwarmResponse`: signed announcements), timing each request as the RTT;
2. route: the cheapest chain of servers covering every layer
   (`wallet.route.plan_route`: announced throughput and load, measured RTT),
   only trusted peers when an allow-list is given;
3. one session per hop (the server keeps the KV cache); each step sends the
   hidden states entering the hop and gets those leaving it;
4. failover: every input sent to a hop is kept. When a hop fails (its
   connection drops, it answers an error, or a step takes longer than
   ``step_timeout``), the hop's peer is excluded, the hop's span is planned
   again over the other servers (`wallet.route.plan_route` over that span;
   the hops before and after keep their sessions), and the new hops replay the kept inputs in the
   original chunks (prompt, then one token per step) so their KV caches are
   bit-identical to the lost one. The generation goes on; greedy output does
   not change.

Torch work (embedding, head, wire encoding) runs in worker threads, never on
the trio loop.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import torch
import trio
from libp2p.abc import INetStream
from libp2p.peer.id import ID

from compute.generate import next_token
from compute.model import Transformer
from compute.quant import WireTensorError, decode_tensor, encode_tensor
from compute.tokenizer import Tokenizer
from ledger.codec import decode, encode
from ledger.errors import DecodeError, EncodeError
from node.framing import FrameReader, FramingError, read_frame, write_frame
from node.host import DialError, Host, PeerIdentity, RequestError, open_host
from node.inference import tensor_work
from node.serve_protocol import (
    CODECS, INFERENCE_PROTOCOL, MAX_INFERENCE_FRAME, MAX_SWARM_FRAME, SWARM_PROTOCOL, Announce,
    Busy, OpenSession, SessionAccepted, SessionError, Step, StepResult, SwarmRequest,
    SwarmResponse,
)
from node.swarm import SwarmView, announce_peer
from wallet.client import InferRequest, Token
from wallet.errors import NoRoute, RouteError, WalletError
from wallet.route import Hop, ServerInfo, plan_route


class RemoteError(WalletError):
    """Networked inference failed: no peer reachable, no route, too many failures."""


class HopFailed(RemoteError):
    """One server of the route failed (dead, stalled, refused or garbled)."""


class ServerBusy(RemoteError):
    """A server answered `Busy`."""

    def __init__(self, peer: str, retry_after_ms: int, reason: str):
        super().__init__(f"{peer} is busy ({reason}); retry after {retry_after_ms} ms")
        self.peer, self.retry_after_ms = peer, retry_after_ms


@dataclass(frozen=True)
class ClientConfig:
    """Tunables of the client.

    codec: wire encoding of hidden states both ways ("raw" keeps the output
        bit-identical to a local run; "fp16" halves the bytes).
    step_timeout: seconds a step may take, plus ``step_timeout_per_token``
        per position it carries: past it the server counts as stalled.
    """

    codec: str = "raw"
    step_timeout: float = 5.0
    step_timeout_per_token: float = 0.02
    open_timeout: float = 10.0
    max_failovers: int = 8
    busy_wait: float = 15.0  # most seconds spent waiting on busy servers per hop

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise RemoteError(f"unknown wire codec {self.codec!r}: expected one of {CODECS}")


@dataclass(slots=True)
class Served:
    """One server's part in a generation, for the ``route`` of the result."""

    peer_id: str
    start: int
    end: int
    failed: bool = False

    def as_json(self) -> dict:
        return {"peer_id": self.peer_id, "start": self.start, "end": self.end,
                "failed": self.failed}


@dataclass(slots=True)
class Generation:
    """What `RemoteModel.generate` did."""

    token_ids: list[int] = field(default_factory=list)
    route: list[Served] = field(default_factory=list)
    failovers: int = 0
    wire_bytes: int = 0  # hidden-state payload bytes sent and received


class _Session:
    """One open inference stream to one server for one hop."""

    def __init__(self, hop: Hop, stream: INetStream, served: Served):
        self.hop, self.stream, self.served = hop, stream, served
        self.reader = FrameReader(stream)
        self.steps = 0

    async def close(self) -> None:
        with trio.move_on_after(2.0, shield=True):
            try:
                await self.stream.close()
            except Exception:  # a dead server's stream: nothing to close
                pass


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
                data = await self.host.request(peer, SWARM_PROTOCOL, encode(SwarmRequest()),
                                               timeout=5.0, max_response_size=MAX_SWARM_FRAME)
                response = decode(data, SwarmResponse)
            except (RequestError, DecodeError):
                continue  # not a serving node, or gone: other peers may know
            self.rtt[str(peer)] = time.perf_counter() - began
            now, now_ms = trio.current_time(), time.time_ns() // 1_000_000
            for announce in response.announces:
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
        run = _Run(self, result, max_len)
        text = self.tokenizer.stream_decoder(skip_special=True)
        sampling = request.sampling
        gen = None if sampling.greedy else torch.Generator().manual_seed(sampling.seed)
        try:
            await run.open(0, cfg.n_layers)
            x = await trio.to_thread.run_sync(self._embed, ids)
            pos = 0
            for step in range(request.max_tokens):
                h = await run.forward(x, pos)
                tok = await trio.to_thread.run_sync(self._pick, h, sampling, gen)
                result.token_ids.append(tok)
                on_token(Token(tok, text.push(tok)))
                if tok in self.tokenizer.stop_ids or step == request.max_tokens - 1:
                    break
                pos += x.shape[1]
                x = await tensor_work(self._embed, [tok], rows=1)
        finally:
            await run.close()
        return result

    def _embed(self, ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return self.ends.embed(torch.tensor([ids]))  # (1, T, C)

    def _pick(self, h: torch.Tensor, sampling, gen) -> int:
        with torch.inference_mode():
            logits = self.ends.head(h[:, -1:])  # (1, 1, V)
            return int(next_token(logits[0, -1], sampling, gen).item())


class _Run:
    """The sessions of one generation and the inputs kept for replay."""

    def __init__(self, client: RemoteModel, result: Generation, max_len: int):
        self.client, self.result, self.max_len = client, result, max_len
        self.sessions: list[_Session] = []
        # Hidden states sent into each hop's first layer, as the chunks they went in.
        self.inputs: dict[int, list[torch.Tensor]] = {}

    async def open(self, start: int, end: int) -> None:
        self.sessions = await self._open_span(start, end)
        self.client.route = [s.hop for s in self.sessions]

    async def close(self) -> None:
        for s in self.sessions:
            await s.close()

    async def forward(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        """Run hidden states ``x`` (1, T, C) at ``pos`` through every hop; fail over as needed."""
        i = 0
        while i < len(self.sessions):
            session = self.sessions[i]
            self.inputs.setdefault(session.hop.start, []).append(x)
            try:
                x = await self._step(session, x, pos, ())
                i += 1
            except HopFailed as exc:
                i, x = await self._fail_over(i, exc)
        return x

    async def _fail_over(self, i: int, exc: Exception) -> tuple[int, torch.Tensor]:
        """Replace hop ``i`` and replay its kept inputs; returns (next hop index, its output).

        The replacement may be several servers; each replays the inputs in
        their original chunks, and its outputs are the next one's inputs.
        """
        failed = self.sessions[i]
        span = (failed.hop.start, failed.hop.end)
        kept = self.inputs[span[0]]
        lengths = [c.shape[1] for c in kept]
        while True:
            failed.served.failed = True
            await failed.close()
            self._count_failure(exc)
            self.client.dead.add(failed.hop.peer_id)
            await self.client.refresh()
            replacement = await self._open_span(*span)
            history = kept
            try:
                for failed in replacement:
                    self.inputs[failed.hop.start] = history
                    out = await self._step(failed, torch.cat(history, dim=1), 0, tuple(lengths))
                    history = list(torch.split(out, lengths, dim=1))
            except HopFailed as again:
                exc = again  # ``failed`` is the replacement that failed: exclude it, retry
                for session in replacement:
                    await session.close()
                continue
            self.sessions[i: i + 1] = replacement
            self.client.route = [s.hop for s in self.sessions]
            return i + len(replacement), history[-1]

    def _count_failure(self, exc: Exception) -> None:
        self.result.failovers += 1
        if self.result.failovers > self.client.config.max_failovers:
            raise RemoteError(f"gave up after {self.client.config.max_failovers} "
                              f"failures: {exc}") from None

    async def _open_span(self, start: int, end: int) -> list[_Session]:
        """Sessions covering [start, end): planned, opened, replanned around busy or dead servers.

        Raises:
            NoRoute: no usable servers cover the span (after waiting out busy ones).
            RemoteError: too many failures.
        """
        client = self.client
        busy: dict[str, int] = {}
        give_up_at = trio.current_time() + client.config.busy_wait
        while True:
            try:
                hops = client.plan(start, end, also_exclude=busy)
            except NoRoute:
                waiting = busy or client.announced_full(start, end)
                if not waiting or trio.current_time() >= give_up_at:
                    raise
                # The servers' own hint, or a second for servers that announced themselves full.
                await trio.sleep(min(busy.values(), default=1000) / 1000)
                busy.clear()
                await client.refresh()
                continue
            opened: list[_Session] = []
            try:
                for hop in hops:
                    opened.append(await self._open(hop))
                return opened
            except (ServerBusy, HopFailed) as exc:
                if isinstance(exc, ServerBusy):
                    busy[exc.peer] = max(exc.retry_after_ms, 50)
                else:
                    self._count_failure(exc)
                    client.dead.add(hops[len(opened)].peer_id)
            finally:
                if len(opened) < len(hops):  # failed part way (or cancelled): free them
                    for session in opened:
                        await session.close()

    async def _open(self, hop: Hop) -> _Session:
        client = self.client
        served = Served(hop.peer_id, hop.start, hop.end)
        stream = None
        try:
            with trio.fail_after(client.config.open_timeout):
                peer = ID.from_base58(hop.peer_id)
                if peer not in client.host.connected_peers():
                    for addr in client._addrs(hop.peer_id):
                        try:
                            await client.host.connect(addr)
                            break
                        except DialError:
                            continue
                stream = await client.host.open_stream(peer, INFERENCE_PROTOCOL)
                await write_frame(stream, encode(OpenSession(
                    client.model_id, hop.start, hop.end, self.max_len, client.config.codec)))
                reply = decode(await read_frame(stream, 4096),
                               (SessionAccepted, Busy, SessionError))
        except (trio.TooSlowError, RequestError, FramingError, DecodeError, ValueError) as exc:
            if stream is not None:
                await _Session(hop, stream, served).close()
            raise HopFailed(f"cannot open a session on {hop.peer_id}: {exc!r}") from None
        session = _Session(hop, stream, served)
        if isinstance(reply, Busy):
            await session.close()
            raise ServerBusy(hop.peer_id, reply.retry_after_ms, reply.reason)
        if isinstance(reply, SessionError):
            # E.g. it moved to other layers since it announced: plan around it.
            await session.close()
            raise HopFailed(f"{hop.peer_id} refused the session: {reply.reason}")
        return session

    async def _step(self, session: _Session, x: torch.Tensor, pos: int,
                    chunks: tuple[int, ...]) -> torch.Tensor:
        cfg = self.client.config
        payload = await tensor_work(encode_tensor, x, cfg.codec, rows=x.shape[1])
        # A replay makes one forward call per chunk: allow each about twice
        # the server's announced time for one token through its layers.
        calls = max(len(chunks), 1)
        timeout = (cfg.step_timeout + cfg.step_timeout_per_token * x.shape[1]
                   + 2.0 * (calls - 1) / self.client.throughput(session.hop.peer_id))
        try:
            message = encode(Step(pos, chunks, payload))
        except EncodeError as exc:
            raise RemoteError(f"a step of {x.shape[1]} positions is too large for one frame "
                              f"({exc}); use a shorter prompt or --wire fp16") from None
        try:
            with trio.fail_after(timeout):
                await write_frame(session.stream, message)
                reply = decode(await session.reader.read_frame(MAX_INFERENCE_FRAME),
                               (StepResult, SessionError))
        except trio.TooSlowError:
            raise HopFailed(f"{session.hop.peer_id} stalled: no answer in {timeout:.1f} s") from None
        except (FramingError, DecodeError) as exc:
            raise HopFailed(f"{session.hop.peer_id} failed: {exc}") from None
        if isinstance(reply, SessionError):
            raise HopFailed(f"{session.hop.peer_id} refused a step: {reply.reason}")
        try:
            out = await tensor_work(decode_tensor, reply.hidden, rows=x.shape[1])
        except WireTensorError as exc:
            raise HopFailed(f"{session.hop.peer_id} sent bad hidden states: {exc}") from None
        if out.shape != x.shape:
            raise HopFailed(f"{session.hop.peer_id} answered shape {tuple(out.shape)} "
                            f"for {tuple(x.shape)}")
        self.result.wire_bytes += len(payload) + len(reply.hidden)
        if not session.steps:  # the route lists servers that actually served
            self.result.route.append(session.served)
        session.steps += 1
        return out.to(x.dtype)




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
