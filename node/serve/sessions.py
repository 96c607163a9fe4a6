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
  once rather than queueing the client behind an unknown wait; a full
  server first closes a session idle for ``reclaim_idle_s`` (or one of an
  address over its share), telling its client why, to seat the request
  (`node.serve.admission.reclaim_choice`);
- a forward call runs at most ``max_chunk_positions`` positions and a
  session holds at most ``max_len`` (both announced); longer steps are
  refused with a `SessionError`;
- paid sessions (`node.serve.cashier.Cashier`): a session opens with a bid
  and a tab the node's mempool admits; each step's voucher must cover the
  positions delivered before it; the lane is claimed when it ends;
- every forward call runs as a job on the process's one torch thread
  (`node.torch_thread.run_sync`), one call of this server at a time, in
  fair order (`node.serve.admission.FairScheduler`: a higher bid first,
  then the client that used less compute since it arrived), and the trio
  loop stays free for the network; while another client has a session
  open, a free session's calls run in pieces of at most
  ``free_call_positions`` positions, each its own turn; each session's
  compute is metered and shown in `status`;
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
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import trio
from libp2p.abc import INetStream
from libp2p.peer.id import ID

from compute.codecs import CODECS
from compute.kvcache import KVCache
from compute.model import Transformer
from ledger.codec import decode, encode
from node.net import FrameEOF, FrameReader, FrameTimeout, Host, write_frame
from node.serve.admission import (  # noqa: F401 (SessionConfig: re-exported)
    ClientAtLimit, FairScheduler, Meter, Seat, ServerFull, SessionBusy, SessionConfig,
    SessionRefused, address_key, flow_key, reclaim_choice, refusal, remote_ip,
)
from node.serve.billing import Bill, PaymentError
from node.serve.cashier import Cashier
from node.serve.forward import ForwardCalls
from node.serve.paid import PaidSessions
from node.serve.push import PushRouting
from node.serve.throughput import measure_throughput
from node.serve.waiting import WaitingRoom
from node.wire import (
    INFERENCE_PROTOCOL, MAX_INFERENCE_FRAME, MAX_OPEN_FRAME, PUSH_PROTOCOL, Busy, Link,
    InputHistory, OpenSession, S_STEP, SessionAccepted, SessionError, Settle, Step,
    StepResult, step_claim,
)

log = logging.getLogger(__name__)


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
    ending: str = ""  # why the server ended it (its tab cannot pay any more)
    pending_charge: int = 0  # the running step's charge, owed once its outputs leave
    tokens: int = 0
    steps: int = 0
    inputs: InputHistory = field(default_factory=InputHistory)  # what its claims sign (9.5)
    last_forward: float = 0.0  # trio time of its last forward (or of its opening)
    paid: bool = False  # opened with a tab
    flow_key: str = ""  # its client in the fair queue (`node.serve.admission.flow_key`)
    flow: Meter | None = None  # that client's meter (None: the session's own)
    reclaimed: str = ""  # why the server closed it to seat another request
    wake: trio.CancelScope | None = None  # the client loop's wait for a frame


class InferenceServer(PushRouting, PaidSessions, ForwardCalls):
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
        self.reclaimed = 0  # sessions closed to seat another request (`reclaim_choice`)
        self.compute = Meter()  # every session's compute, added up
        # Compute per client peer id (closed sessions' too), so a heavy client shows in
        # `status`; at most ``_MAX_PEERS_METERED`` peers, the lightest dropped first.
        self.usage: dict[str, Meter] = {}
        self._flows: dict[str, Meter] = {}  # the open sessions' clients' fair-queue meters
        #: The `Meter.priority` a new session gets (a higher one gets the compute thread
        #: first): a paid session's bid, a free one's 0.
        self.priority: Callable[[ID, OpenSession], int] = lambda peer, request: (
            request.bid if request.tab else 0)
        self._cashier: Cashier | None = None
        self._vetting: dict[bytes, int] = {}  # tabs being vetted, by their client account
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
                "reclaimed": self.reclaimed,
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
            self._servable(request)  # the cheap refusals first
            paid = self._precheck(request)
            if paid:  # the chain's checks before a slot or a seat: an unfunded tab holds none
                await self._vet(paid[0])
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
            if session.ending:  # its tab cannot pay any more (`Cashier.on_end`): say why
                with trio.move_on_after(self.config.push_timeout):
                    await self._reply(stream, SessionError(session.ending[:256]))
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

    def _servable(self, req: OpenSession) -> None:
        """Raises `SessionRefused` when this server cannot serve ``req`` at all (model,
        layers, codec, length): asked before anything costlier."""
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
        self._servable(req)
        limits, paid, priority = self.config.limits(), bool(req.tab), self.priority(peer, req)
        held = [s for s in self.sessions.values() if not s.reclaimed]  # reclaimed: going
        reserved = [("", None)] * self.room.reserved  # slots admitted waiters hold
        busy = refusal(limits, [*((s.account, s.address) for s in held), *reserved],
                       account, address)
        # Full: a session idle (or over its address's share) makes way; not for a free
        # request while paid ones wait for a slot (the next slot is theirs).
        if isinstance(busy, ServerFull) and (paid or not self.room.waiting):
            if self._reclaim(held, reserved, paid, priority, account, address):
                busy = None
        if busy is not None:
            raise busy
        # The cache is allocated lazily by torch.empty: an idle budget costs no pages.
        cache = KVCache(self.model.config, req.max_len,
                        layers=range(req.layer_start, req.layer_end), device=self.device)
        key = flow_key(limits, paid, account, address)
        live = {s.flow_key for s in self.sessions.values()} | {key}
        for gone in [k for k in self._flows if k not in live]:  # clients with no session
            del self._flows[gone]
        session = _Session(next(self._ids), peer, account, req.layer_start, req.layer_end,
                           req.codec,
                           cache, self.model, token=os.urandom(32), address=address,
                           meter=Meter(priority=priority), paid=paid, flow_key=key,
                           flow=self._flows.setdefault(key, Meter()),
                           last_forward=trio.current_time())
        self.sessions[session.id] = session
        return session

    def _reclaim(self, held: list[_Session], reserved: list, paid: bool, priority: int,
                 account: str, address: str | None) -> bool:
        """Close a session to seat a request at a full server (`reclaim_choice`); True if done.

        Only when the request then passes its own limits: a session is never
        closed for a request refused anyway. The session's client loop tells
        its client why and ends (`_run_session`); it no longer counts from now.
        """
        limits, now = self.config.limits(), trio.current_time()
        choice = reclaim_choice(
            limits, self.config,
            [Seat(s.id, s.address, s.paid, s.meter.priority, now - s.last_forward,
                  s.lock.locked()) for s in held],
            paid=paid, priority=priority, address=address)
        if choice is None:
            return False
        victim = self.sessions[choice[0]]
        rest = [(s.account, s.address) for s in held if s is not victim]
        if refusal(limits, [*rest, *reserved], account, address) is not None:
            return False
        victim.reclaimed = choice[1]
        if victim.wake is not None:
            victim.wake.cancel()
        self.reclaimed += 1
        log.info("session %d of %s (%s) reclaimed: %s", victim.id, victim.peer,
                 victim.address, choice[1])
        return True

    async def _run_session(self, stream: INetStream, reader: FrameReader, s: _Session) -> None:
        """The client's frames until it hangs up, or the session runs no forward for a while.

        Idle means no forward, whatever else comes: a `Link` frame now and then
        must not hold a slot (and a cache) for free. A linked session's steps
        may arrive over the previous hop's push stream instead, and count too.
        """
        s.last_forward = trio.current_time()
        while True:
            if s.reclaimed:  # closed to seat another request: say why (briefly), and go
                with trio.move_on_after(self.config.push_timeout):
                    try:
                        await self._reply(s.client, SessionError(s.reclaimed[:256]))
                    except Exception:  # a client gone meanwhile: nothing to tell
                        pass
                return
            left = s.last_forward + self.config.idle_timeout - trio.current_time()
            if left <= 0:
                return  # ran nothing for idle_timeout: free the slot and the cache
            data = None
            with trio.CancelScope() as s.wake:  # `_reclaim` cancels it
                try:
                    data = await reader.read_frame(MAX_INFERENCE_FRAME, timeout=left)
                except FrameTimeout:
                    pass  # a pushed step may have run meanwhile: look again
                except FrameEOF:
                    return  # the client is done
            if data is None or s.reclaimed:  # a frame read as it was reclaimed is dropped
                continue
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
            charge = 0
            try:
                hidden = await self._check_step(step, s)
                if s.bill is not None:  # pay after delivery, within the lane's credit
                    charge = self.cashier.take(s.bill, step.voucher, hidden.shape[1],
                                               s.end - s.start)
                try:
                    return await self._run_step(s, step, hidden, charge)
                finally:
                    if s.pending_charge and s.bill is not None:  # its outputs never left
                        self.cashier.drop(s.bill, s.pending_charge)
                        s.pending_charge = 0
            except (SessionRefused, PaymentError) as exc:
                self.refused_steps += 1
                await self._reply(s.client, SessionError(str(exc)[:256]))
                s.scope.cancel()
                return False

    async def _run_step(self, s: _Session, step: Step, hidden: torch.Tensor, charge: int
                        ) -> bool:
        """Run a checked step and deliver its outputs (to the linked hop, else the client).

        ``charge`` (what `Cashier.take` counted running) is owed once the
        outputs left; the caller drops it if they never did.
        """
        s.pending_charge = charge
        out = await self._forward(s, step, hidden)
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
                self._delivered(s)
            except Exception as exc:  # the next hop died or stalled: the client sees to it
                log.info("push to the next hop failed: %s: %s", type(exc).__name__, exc)
                await self._unlink(s)
            else:  # pushed: the client gets the signed answer too, after (9.5)
                await self._copy(s, self._answer(s, step, out))
                return True
        await self._reply(s.client, self._answer(s, step, out))
        self._delivered(s)
        return True

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

    async def _reply(self, stream: INetStream, msg) -> None:
        await write_frame(stream, encode(msg), timeout=self.config.write_timeout)



