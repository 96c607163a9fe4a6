"""The hops of one generation: sessions, steps, push links and failover.

Owns what `wallet.remote.RemoteModel` does with the servers of a route
(specs/network.md sections 9.3a and 9.4): opening one session per hop
(around busy and dead servers), sending steps and matching their results,
linking the hops for push routing, and replacing a failed hop by replaying
the inputs it was sent, chunk by chunk, so the rebuilt KV caches are
bit-identical. Also the client's tunables, results and errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import trio
from libp2p.abc import INetStream
from libp2p.peer.id import ID

from compute.quant import WireTensorError, decode_tensor, encode_tensor
from ledger.codec import decode, encode
from ledger.errors import DecodeError, EncodeError
from node.framing import FrameReader, FramingError, read_frame, write_frame
from node.host import DialError, RequestError
from node.inference import tensor_work
from node.serve_protocol import (
    CODECS, INFERENCE_PROTOCOL, MAX_INFERENCE_FRAME, Busy, Link, Linked, OpenSession,
    SessionAccepted, SessionError, Step, StepResult,
)
from wallet.errors import NoRoute, WalletError
from wallet.route import Hop

if TYPE_CHECKING:
    from wallet.remote import RemoteModel


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
    push: link the hops so that each pushes its outputs to the next
        (`wallet.remote`'s module docstring, step 4; the default: on loopback as fast as
        driving every hop from here, on a real network two one-way
        latencies per token fewer over three hops).
    step_timeout: seconds a step may take, plus ``step_timeout_per_token``
        per position it carries: past it the server counts as stalled.
    """

    codec: str = "raw"
    step_timeout: float = 5.0
    step_timeout_per_token: float = 0.02
    open_timeout: float = 10.0
    max_failovers: int = 8
    busy_wait: float = 15.0  # most seconds spent waiting on busy servers per hop
    push: bool = True

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


class HopSession:
    """One open inference stream to one server for one hop."""

    def __init__(self, hop: Hop, stream: INetStream, served: Served, token: bytes = b""):
        self.hop, self.stream, self.served, self.token = hop, stream, served, token
        self.reader = FrameReader(stream)
        self.steps = 0

    async def close(self) -> None:
        with trio.move_on_after(2.0, shield=True):
            try:
                await self.stream.close()
            except Exception:  # a dead server's stream: nothing to close
                pass



class RouteRun:
    """The sessions of one generation and the inputs kept for replay."""

    def __init__(self, client: RemoteModel, result: Generation, max_len: int):
        self.client, self.result, self.max_len = client, result, max_len
        self.sessions: list[HopSession] = []
        self.pushing = False  # the hops are linked: each pushes to the next
        # Hidden states sent into each hop's first layer, as the chunks they went in.
        self.inputs: dict[int, list[torch.Tensor]] = {}

    async def open(self, start: int, end: int) -> None:
        self.sessions = await self._open_span(start, end)
        self.client.route = [s.hop for s in self.sessions]
        if self.client.config.push and len(self.sessions) > 1:
            self.pushing = await self._link_all()

    async def close(self) -> None:
        for s in self.sessions:
            await s.close()

    async def forward(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        """Run hidden states ``x`` (1, T, C) at ``pos`` through every hop; fail over as needed."""
        i = 0
        if self.pushing:
            i, x = await self._forward_pushed(x, pos)
        while i < len(self.sessions):
            session = self.sessions[i]
            self.inputs.setdefault(session.hop.start, []).append(x)
            try:
                x = await self._step(session, x, pos, ())
                i += 1
            except HopFailed as exc:
                i, x = await self._fail_over(i, exc)
        return x

    async def _forward_pushed(self, x: torch.Tensor, pos: int) -> tuple[int, torch.Tensor]:
        """The step sent to the first hop, every hop's result read as the hops push it on.

        Returns (hops done, the last one's output): all of them, or after a
        failure, which unlinks the route, the failed-over hop's output and
        the index of the hop after it.
        """
        i = 0
        self.inputs.setdefault(self.sessions[0].hop.start, []).append(x)
        try:
            timeout, sent = await self._send(self.sessions[0], x, pos, ())
            for i, session in enumerate(self.sessions):
                x = await self._result(session, x, pos, timeout, sent if i == 0 else 0)
                if i + 1 < len(self.sessions):
                    self.inputs.setdefault(self.sessions[i + 1].hop.start, []).append(x)
            return len(self.sessions), x
        except HopFailed as exc:
            self.pushing = False
            await self._unlink_all()
            return await self._fail_over(i, exc)

    async def _link_all(self) -> bool:
        """Link each hop to the next; False (and nothing linked) if any hop could not."""
        try:
            with trio.fail_after(self.client.config.open_timeout):
                for a, b in zip(self.sessions, self.sessions[1:]):
                    await write_frame(a.stream, encode(Link(
                        b.hop.peer_id, self.client._addrs(b.hop.peer_id), b.token)))
                    reply = decode(await a.reader.read_frame(4096), Linked)
                    if not reply.ok:
                        raise HopFailed(f"{a.hop.peer_id} cannot reach {b.hop.peer_id}: "
                                        f"{reply.reason}")
            return True
        except (trio.TooSlowError, FramingError, DecodeError, HopFailed):
            await self._unlink_all()  # a hop that fails for real shows at the first step
            return False

    async def _unlink_all(self) -> None:
        for session in self.sessions:
            with trio.move_on_after(1.0):
                try:
                    await write_frame(session.stream, encode(Link("", (), bytes(32))))
                except Exception:  # a dead hop: failover sees to it
                    pass

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

    async def _open_span(self, start: int, end: int) -> list[HopSession]:
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
            opened: list[HopSession] = []
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

    async def _open(self, hop: Hop) -> HopSession:
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
                await HopSession(hop, stream, served).close()
            raise HopFailed(f"cannot open a session on {hop.peer_id}: {exc!r}") from None
        session = HopSession(hop, stream, served,
                           reply.token if isinstance(reply, SessionAccepted) else b"")
        if isinstance(reply, Busy):
            await session.close()
            raise ServerBusy(hop.peer_id, reply.retry_after_ms, reply.reason)
        if isinstance(reply, SessionError):
            # E.g. it moved to other layers since it announced: plan around it.
            await session.close()
            raise HopFailed(f"{hop.peer_id} refused the session: {reply.reason}")
        return session

    async def _step(self, session: HopSession, x: torch.Tensor, pos: int,
                    chunks: tuple[int, ...]) -> torch.Tensor:
        timeout, sent = await self._send(session, x, pos, chunks)
        return await self._result(session, x, pos, timeout, sent)

    async def _send(self, session: HopSession, x: torch.Tensor, pos: int,
                    chunks: tuple[int, ...]) -> tuple[float, int]:
        """Send a step to ``session``; returns (its answer's timeout, payload bytes)."""
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
        except trio.TooSlowError:
            raise HopFailed(f"{session.hop.peer_id} stalled: a step unsent in {timeout:.1f} s"
                            ) from None
        except FramingError as exc:
            raise HopFailed(f"{session.hop.peer_id} failed: {exc}") from None
        return timeout, len(payload)

    async def _result(self, session: HopSession, x: torch.Tensor, pos: int, timeout: float,
                      sent: int) -> torch.Tensor:
        """The hop's outputs for the step at ``pos`` whose inputs were ``x``.

        A result for another position is skipped: a pushed step that a
        failover then sent again is answered twice.
        """
        try:
            with trio.fail_after(timeout):
                while True:
                    reply = decode(await session.reader.read_frame(MAX_INFERENCE_FRAME),
                                   (StepResult, SessionError))
                    if not isinstance(reply, StepResult) or reply.pos == pos:
                        break
        except trio.TooSlowError:
            raise HopFailed(f"{session.hop.peer_id} stalled: no answer in {timeout:.1f} s"
                            ) from None
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
        self.result.wire_bytes += sent + len(reply.hidden)
        if not session.steps:  # the route lists servers that actually served
            self.result.route.append(session.served)
        session.steps += 1
        return out.to(x.dtype)
