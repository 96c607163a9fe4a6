"""The server side of inference sessions: a span of layers, a KV cache per session.

Owns `InferenceServer`, which serves ``/pnode/inference/3.1.0`` (specs/network.md
sections 9.3 and 9.6) from a partial model (`compute.model.ModelPart`: only
the layers it serves are in memory):

- a client opens a session for a sub-span of the served layers; the server
  keeps that session's KV cache until the stream ends, the client settles,
  the session runs no forward for ``idle_timeout`` seconds (other frames do
  not count), or an error;
- a server at ``max_sessions``, or a client at its share (per account, per
  address: `node.serve.admission`), answers `Busy` with a retry hint at
  once rather than queueing the client behind an unknown wait;
- a forward call runs at most ``max_chunk_positions`` positions and a
  session holds at most ``max_len`` (both announced); longer steps are
  refused with a `SessionError`;
- paid sessions (`node.serve.cashier.Cashier`): a session opens with a bid
  and a tab the node's mempool admits; each step's voucher must cover the
  positions delivered before it; the lane is claimed when it ends;
- every forward call runs as a job on the process's one torch thread
  (`node.torch_thread.run_sync`), one call of this server at a time, in
  fair order (`node.serve.admission.FairScheduler`: a higher bid first,
  then the session that used less compute since it arrived), and the trio
  loop stays free for the network; each session's compute is metered and
  shown in `status`;
- push routing (`node.serve.push`): a client may `Link` a session to the
  next hop's session; the server then sends each step's outputs to that hop
  instead of to the client. Steps pushed into a session are checked and run
  exactly as the client's own.

A malformed frame, a step at the wrong position or one past the session's
budget gets a `SessionError` and the stream is closed; a frame that does not
decode or an oversize one also scores the peer (`Host.misbehaving`). The
server never lets one session's failure touch another.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import trio
from libp2p.abc import INetStream
from libp2p.peer.id import ID

from compute.codecs import CODECS
from compute.kvcache import KVCache
from compute.model import Transformer
from compute.wiretensor import TooManyElements, WireTensorError, decode_tensor, encode_tensor
from ledger.codec import decode, encode
from node import torch_thread
from node.net import FrameEOF, FrameReader, FrameTimeout, Host, write_frame
from node.serve.admission import (  # noqa: F401 (SessionConfig: re-exported)
    ClientAtLimit, FairScheduler, Meter, ServerFull, SessionBusy, SessionConfig, SessionRefused,
    address_key, refusal, remote_ip,
)
from node.serve.billing import Bill, PaymentError
from node.serve.cashier import Cashier
from node.serve.push import PushRouting
from node.serve.throughput import measure_throughput
from node.serve.waiting import WaitingRoom
from node.torch_thread import tensor_work
from node.wire import (
    INFERENCE_PROTOCOL, MAX_INFERENCE_FRAME, MAX_OPEN_FRAME, PUSH_PROTOCOL, Busy, Link,
    InputHistory, OpenSession, S_STEP, SessionAccepted, SessionError, Settle, Settled, Step,
    StepResult, step_claim,
)

log = logging.getLogger(__name__)

#: Most client peer ids whose compute `InferenceServer.usage` keeps (the lightest go first).
_MAX_PEERS_METERED = 1024


@dataclass(slots=True)
class _Session:
    """One open session: its sub-span, cache and counters."""

    id: int
    peer: ID
    account: str  # whom the per-client limit counts: the tab's client, else the peer id
    start: int
    end: int
    codec: str
    cache: KVCache
    model: Transformer  # the weights it opened on (a move keeps them for it)
    token: bytes = b""  # names the session to the hop that pushes into it
    client: INetStream | None = None  # the client's stream: every result goes there
    link: INetStream | None = None  # the next hop's push stream, when linked
    lock: trio.Lock = field(default_factory=trio.Lock)  # one step at a time
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)  # the client loop's
    pushes: list[trio.CancelScope] = field(default_factory=list)  # push streams reading
    address: str | None = None  # the client's `address_key` bucket
    meter: Meter = field(default_factory=Meter)  # compute used; its fair-queue tag
    bill: Bill | None = None  # a paid session's lane (`node.serve.billing`)
    tokens: int = 0
    steps: int = 0
    inputs: InputHistory = field(default_factory=InputHistory)  # what its claims sign (9.5)
    last_forward: float = 0.0  # trio time of its last forward (or of its opening)


class InferenceServer(PushRouting):
    """Serves inference sessions for the layers a partial model holds.

    Args:
        host: the running libp2p host.
        model: a `Transformer` holding (at least) ``layers``.
        layers: the span served, [start, end).
        model_id: the id clients must ask for (`compute.gguf.model_id`).
        device: where the weights are; hidden states are moved there.
        config: limits and timeouts.
    """

    def __init__(self, host: Host, model: Transformer, layers: range, model_id: str, *,
                 device: torch.device | str = "cpu", config: SessionConfig = SessionConfig()):
        self.host, self.model, self.layers, self.model_id = host, model, layers, model_id
        self.device, self.config = torch.device(device), config
        self.sessions: dict[int, _Session] = {}
        self._by_token: dict[bytes, _Session] = {}
        self.served_tokens = 0
        self.pushed_steps = 0  # steps that came from the previous hop, not the client
        self.refused_busy = 0  # `Busy` answers, the per-client limits' included
        self.refused_limit = 0  # of which: this client's (peer or address) limit
        self.refused_steps = 0  # steps refused for breaking a rule (a cap included)
        self.compute = Meter()  # every session's compute, added up
        # Compute per client peer id (closed sessions' too), so a heavy client shows in
        # `status`; at most ``_MAX_PEERS_METERED`` peers, the lightest dropped first.
        self.usage: dict[str, Meter] = {}
        #: The `Meter.priority` a new session gets (a higher one gets the compute thread
        #: first): a paid session's bid, a free one's 0.
        self.priority: Callable[[ID, OpenSession], int] = lambda peer, request: (
            request.bid if request.tab else 0)
        #: Payments; None: free sessions only, no tabs.
        self.cashier: Cashier | None = None
        self.scheduler = FairScheduler()
        self.room = WaitingRoom(config.max_waiting or config.max_sessions)
        self._ids = itertools.count(1)

    def start(self) -> None:
        """Register the stream handler on the host (the host runs the streams)."""
        self.host.set_handler(INFERENCE_PROTOCOL, self._serve, public=True)  # clients use it
        self.host.set_handler(PUSH_PROTOCOL, self._serve_push, public=True)  # other servers

    def swap(self, model: Transformer, layers: range) -> None:
        """Serve ``layers`` of ``model`` from now on (a move).

        Open sessions keep the model they opened on until they end; sessions
        and the limits stay shared, and every forward call of either model is
        a job on the one torch thread, so a move never runs two forward calls
        at once nor admits more than ``max_sessions``.
        """
        self.model, self.layers = model, layers

    @property
    def max_session_positions(self) -> int:
        """The most positions one session may hold here (announced)."""
        return min(self.config.max_len, self.model.config.max_seq_len)

    def status(self) -> dict:
        """Served span, open sessions, limits, counters and compute used, for `pnode status`.

        ``open`` lists each open session's client and compute (`Meter`);
        ``heaviest_peers`` the clients that used the most forward seconds
        since the server started (at most 8), so a heavy client is visible.
        """
        limits = self.config.limits()
        heaviest = sorted(self.usage.items(), key=lambda kv: -kv[1].forward_s)[:8]
        return {"serving": [self.layers.start, self.layers.stop],
                "sessions": len(self.sessions), "max_sessions": self.config.max_sessions,
                "max_sessions_per_peer": limits.per_peer,
                "max_sessions_per_address": limits.per_address,
                "max_chunk_positions": self.config.max_chunk_positions,
                "max_session_positions": self.max_session_positions,
                "served_tokens": self.served_tokens, "refused_busy": self.refused_busy,
                "refused_limit": self.refused_limit, "refused_steps": self.refused_steps,
                "pushed_steps": self.pushed_steps, "compute": self.compute.as_json(),
                "waiting": self.scheduler.waiting, "waiting_room": self.room.waiting,
                "open": [{"id": s.id, "peer": str(s.peer), "address": s.address,
                          "layers": [s.start, s.end], **s.meter.as_json()}
                         for s in self.sessions.values()],
                "heaviest_peers": [{"peer": peer, **m.as_json()} for peer, m in heaviest],
                "payments": self.cashier.status() if self.cashier else None}

    def measure_throughput(self, tokens: int = 8) -> float:
        """Decode tokens/s through the served span (blocking: run it on the torch thread)."""
        return measure_throughput(self.model, self.layers, self.device, tokens)

    # -- one stream = one session --------------------------------------------------------

    async def _serve(self, stream: INetStream, peer: ID) -> None:
        reader = FrameReader(stream)  # many frames on this stream: few reads
        try:
            first = await reader.read_frame(MAX_OPEN_FRAME, timeout=self.config.idle_timeout)
        except (FrameEOF, FrameTimeout):
            return  # a client that gave up before asking: nothing to score
        request = decode(first, OpenSession)  # garbage: the host resets and scores
        try:
            paid = self._precheck(request)
            account = paid[0].client.hex() if paid else str(peer)
            address = address_key(remote_ip(stream))
            try:
                session = self._open(request, peer, account, address)
            except ServerFull:  # a paid request waits for a slot, highest bid first
                if not paid or not await self.room.wait(request.bid, self.config.queue_timeout):
                    raise
                self.room.take()
                session = self._open(request, peer, account, address)
        except SessionRefused as exc:
            await self._reply(stream, SessionError(str(exc)[:256]))
            return
        except SessionBusy as exc:  # full, or this client holds its share: the reason
            self.refused_busy += 1
            self.refused_limit += isinstance(exc, ClientAtLimit)
            await self._reply(stream, Busy(self.config.busy_retry_ms, str(exc)[:256],
                                           self.room.min_bid(self.cashier.ask if paid else 0)))
            return
        session.client = stream
        self._by_token[session.token] = session
        try:
            if paid:  # the tab into the mempool (and gossip) before a step runs
                try:
                    session.bill = await self.cashier.open(*paid, request.bid)
                except PaymentError as exc:
                    await self._reply(stream, SessionError(str(exc)[:256]))
                    return
            await self._reply(stream, SessionAccepted(session.cache.max_len, session.token,
                                                      self.cashier.height if paid else 0))
            with session.scope:
                await self._run_session(stream, reader, session)
        finally:
            del self.sessions[session.id]
            del self._by_token[session.token]
            self.room.free()  # the slot goes to the highest bid waiting
            if session.bill is not None:  # the lane's last session: claim it
                await self.cashier.release(session.bill)
            log.info("session %d of %s (%s) closed: %d positions, %.2f s forward, %d steps",
                     session.id, peer, session.address, session.meter.positions,
                     session.meter.forward_s, session.meter.steps)
            for scope in session.pushes:
                scope.cancel()
            await self._unlink(session)

    def _precheck(self, req: OpenSession):
        """The tab and lane paying for ``req`` (None: free), checked without the chain.

        Raises:
            SessionRefused: a tab where this server takes none, a free session
                where it asks a price, or a tab that is bad in itself.
        """
        if self.cashier is None:
            if req.tab:
                raise SessionRefused("this server takes no tabs (it follows no chain): "
                                     "open a free session")
            return None
        try:
            return self.cashier.precheck(req, req.layer_end - req.layer_start)
        except PaymentError as exc:
            raise SessionRefused(str(exc)) from None

    def _open(self, req: OpenSession, peer: ID, account: str, address: str | None
              ) -> _Session:
        """A new session, if the limits let it open.

        Args:
            req: the client's request.
            peer: the client's peer id.
            account: whom the per-client limit counts: a paid session's
                client account (peer ids are free and random per run), else
                the peer id.
            address: its `address_key` bucket (None: unknown).

        Raises:
            SessionRefused: a request this server cannot serve at all.
            SessionBusy: not now: `ServerFull`, or `ClientAtLimit`.
        """
        if req.model_id != self.model_id:
            raise SessionRefused(f"this server serves model {self.model_id}, not {req.model_id}")
        if not (self.layers.start <= req.layer_start < req.layer_end <= self.layers.stop):
            raise SessionRefused(f"this server holds layers {self.layers.start}.."
                                 f"{self.layers.stop - 1}, asked for {req.layer_start}.."
                                 f"{req.layer_end - 1}")
        if req.codec not in CODECS:
            raise SessionRefused(f"unknown codec {req.codec!r}: expected one of {CODECS}")
        limit = self.max_session_positions
        if req.max_len > limit:
            raise SessionRefused(f"a session may hold at most {limit} tokens, asked {req.max_len}")
        busy = refusal(self.config.limits(),
                       [*((s.account, s.address) for s in self.sessions.values()),
                        *[("", None)] * self.room.reserved],  # slots admitted waiters hold
                       account, address)
        if busy is not None:
            raise busy
        # The cache is allocated lazily by torch.empty: an idle budget costs no pages.
        cache = KVCache(self.model.config, req.max_len,
                        layers=range(req.layer_start, req.layer_end), device=self.device)
        session = _Session(next(self._ids), peer, account, req.layer_start, req.layer_end,
                           req.codec,
                           cache, self.model, token=os.urandom(32), address=address,
                           meter=Meter(priority=self.priority(peer, req)))
        self.sessions[session.id] = session
        return session

    async def _run_session(self, stream: INetStream, reader: FrameReader, s: _Session) -> None:
        """The client's frames until it hangs up, or the session runs no forward for a while.

        Idle means no forward, whatever else comes: a `Link` frame now and then
        must not hold a slot (and a cache) for free. A linked session's steps
        may arrive over the previous hop's push stream instead, and count too.
        """
        s.last_forward = trio.current_time()
        while True:
            left = s.last_forward + self.config.idle_timeout - trio.current_time()
            if left <= 0:
                return  # ran nothing for idle_timeout: free the slot and the cache
            try:
                data = await reader.read_frame(MAX_INFERENCE_FRAME, timeout=left)
            except FrameTimeout:
                continue  # a pushed step may have run meanwhile: look again
            except FrameEOF:
                return  # the client is done
            msg = decode(data, (Step, Link, Settle))
            if isinstance(msg, Link):
                async with s.lock:  # never between a pushed step's writes
                    await self._link(s, msg)
            elif isinstance(msg, Settle):
                async with s.lock:
                    await self._settle(s, msg)
                return
            elif not await self._step(s, msg):
                return

    async def _settle(self, s: _Session, msg: Settle) -> None:
        """The client's final voucher: keep it, claim the lane, say what is owed."""
        if s.bill is None:
            await self._reply(s.client, SessionError("a free session has nothing to settle"))
            return
        try:
            s.bill.settle(msg.voucher)
        except PaymentError as exc:
            await self._reply(s.client, SessionError(str(exc)[:256]))
            return
        bill, s.bill = s.bill, None
        claim = await self.cashier.release(bill)
        await self._reply(s.client, Settled(bill.owed, claim or bytes(32)))

    async def _step(self, s: _Session, step: Step) -> bool:
        """Run one step of the client's or the previous hop's; False once the session failed.

        The outputs go to the linked hop, or, when the session is not
        linked, to the client. A push that fails (a dead next hop at once, a
        stalled one after ``push_timeout``, under the client's step timeout)
        unlinks the session and the outputs go to the client instead: it
        goes on from the next hop itself and blames it if it fails again.
        """
        async with s.lock:
            s.last_forward = trio.current_time()  # a long forward is not idleness either
            try:
                hidden = await self._check_step(step, s)
                if s.bill is not None:  # pay after delivery: the voucher covers the steps before
                    self.cashier.take(s.bill, step.voucher, hidden.shape[1], s.end - s.start)
                out = await self._forward(s, step, hidden)
            except (SessionRefused, PaymentError) as exc:
                self.refused_steps += 1
                await self._reply(s.client, SessionError(str(exc)[:256]))
                s.scope.cancel()
                return False
            s.steps += 1
            self._charge(s, steps=1)
            s.last_forward = trio.current_time()
            s.tokens = step.pos + hidden.shape[1]
            self.served_tokens += hidden.shape[1]
            if s.link is not None:
                try:
                    await write_frame(s.link, encode(Step(step.pos, step.chunks, out,
                                                          step.voucher)),
                                      timeout=self.config.push_timeout)
                    self._delivered(s, hidden.shape[1])
                except Exception as exc:  # the next hop died or stalled: the client sees to it
                    log.info("push to the next hop failed: %s: %s", type(exc).__name__, exc)
                    await self._unlink(s)
                else:  # pushed: the client gets the signed answer too, after (9.5)
                    await self._copy(s, self._answer(s, step, out))
                    return True
            await self._reply(s.client, self._answer(s, step, out))
            self._delivered(s, hidden.shape[1])
            return True

    def _delivered(self, s: _Session, positions: int) -> None:
        """The step's outputs left: a paid session's bill counts them (`Cashier.delivered`)."""
        if s.bill is not None:
            self.cashier.delivered(s.bill, positions, s.end - s.start)

    def _answer(self, s: _Session, step: Step, out: bytes) -> StepResult:
        """The signed `StepResult` of ``step``: the server's key over its `StepClaim`.

        Signed so that a client's spot check (specs/network.md 9.5) holds
        the server to what it answered (about 0.1 ms a step). Called once per
        step run: it advances the session's running input hash.
        """
        history = s.inputs.advance(step, s.tokens - step.pos)
        claim = step_claim(s.token, self.model_id, s.start, s.end, step, out, history)
        signature = self.host.identity.key_pair.private_key.sign(S_STEP + encode(claim))
        return StepResult(step.pos, out, signature)

    async def _check_step(self, step: Step, s: _Session) -> torch.Tensor:
        """The step's hidden states, checked against the session. Raises SessionRefused."""
        if step.pos > s.cache.length:
            # A step may restart earlier positions (pos < length: roll back) but never skip.
            raise SessionRefused(f"step at position {step.pos}, the session holds "
                                 f"{s.cache.length}")
        dim = self.model.config.dim
        room = s.cache.max_len - step.pos
        try:  # never decode more than the budget can take (int8 expands 4x)
            hidden = await tensor_work(decode_tensor, step.hidden, max(room, 1) * dim,
                                       rows=len(step.hidden) // (dim * 4))
        except TooManyElements as exc:
            raise SessionRefused(f"step past the session budget of {s.cache.max_len} "
                                 f"positions: {exc}") from None
        except WireTensorError as exc:
            raise SessionRefused(f"bad hidden states: {exc}") from None
        if hidden.dim() != 3 or hidden.shape[0] != 1 or hidden.shape[2] != dim \
                or hidden.shape[1] == 0:
            raise SessionRefused(f"expected hidden states (1, T>0, {dim}), "
                                 f"got {tuple(hidden.shape)}")
        t = hidden.shape[1]
        if step.chunks and sum(step.chunks) != t:
            raise SessionRefused(f"chunks sum to {sum(step.chunks)}, the step has {t} positions")
        cap = self.config.max_chunk_positions
        if max(step.chunks or (t,)) > cap:
            # One forward call holds the compute thread: its length is what the cap bounds.
            raise SessionRefused(f"a forward call of {max(step.chunks or (t,))} positions "
                                 f"exceeds this server's cap of {cap} positions per call "
                                 f"(max_chunk_positions): split the step into chunks")
        if t > room:
            raise SessionRefused(f"step to position {step.pos + t} exceeds the session budget "
                                 f"of {s.cache.max_len}")
        return hidden.to(torch.float32)

    async def _forward(self, s: _Session, step: Step, hidden: torch.Tensor) -> bytes:
        """Run the session's layers on the step, one forward call per chunk.

        Each chunk is its own job on the torch thread (first in, first out),
        so a long replay (many chunks) takes turns with the other sessions'
        decode steps instead of holding the server for its whole length.

        Raises:
            SessionRefused: the forward call failed (out of memory, a device error).
        """
        outs, pos = [], step.pos
        for n in step.chunks or (hidden.shape[1],):
            chunk = hidden[:, pos - step.pos: pos - step.pos + n]
            try:
                async with self.scheduler.turn(s.meter):  # the fair queue, one call at a time
                    out, seconds = await torch_thread.run_sync(self._timed, s, chunk, pos,
                                                               priority=s.meter.priority)
                    self._charge(s, n, seconds)
                outs.append(out)
            except Exception as exc:  # the server's fault, not the client's: no score
                log.warning("forward failed in a session of %s: %s: %s", s.peer,
                            type(exc).__name__, exc)
                raise SessionRefused(f"forward failed: {type(exc).__name__}: {exc}") from None
            pos += n
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        return await tensor_work(encode_tensor, out, s.codec, rows=out.shape[1])

    def _charge(self, s: _Session, positions: int = 0, seconds: float = 0.0,
                steps: int = 0) -> None:
        """Meter a forward call (or a step): the session's, its client's and the server's."""
        usage = self.usage.get(s.account)
        if usage is None:
            if len(self.usage) >= _MAX_PEERS_METERED:  # keep the heavy ones visible
                del self.usage[min(self.usage, key=lambda p: self.usage[p].forward_s)]
            usage = self.usage[s.account] = Meter()
        for meter in (s.meter, usage, self.compute):
            meter.add(positions, seconds, steps)

    def _timed(self, s: _Session, chunk: torch.Tensor, pos: int) -> tuple[torch.Tensor, float]:
        """`_run` and its seconds (on the torch thread: the wait in its queue is not counted)."""
        began = time.perf_counter()
        out = self._run(s, chunk, pos)
        return out, time.perf_counter() - began

    def _run(self, s: _Session, chunk: torch.Tensor, pos: int) -> torch.Tensor:
        """One forward call (on the torch thread); the output back on the CPU."""
        with torch.inference_mode():
            out = s.model.run_layers(chunk.to(self.device), s.start, s.end, pos=pos,
                                     cache=s.cache)
        return out.to("cpu")

    async def _reply(self, stream: INetStream, msg) -> None:
        await write_frame(stream, encode(msg), timeout=self.config.write_timeout)



