"""The hops of one generation: sessions, steps, push links and failover.

Owns what a client does with the servers of a route (specs/network.md
sections 9.3a, 9.4 and 9.6): opening the hops' sessions at once (around busy
and dead servers, only on servers whose caps fit; paid from a tab when the
run pays), reading every hop's frames through one inbox, sending steps (a
long prompt in forward calls within every hop's ``max_chunk_positions``)
with their vouchers and matching their results, linking the hops for push
routing, replacing a failed hop by replaying the inputs it was sent (rebuilt
first when they were pushed) chunk by chunk, so the rebuilt KV caches are
bit-identical, and settling the paid sessions at the end.

A run is given the swarm's `wallet.client.directory.SwarmDirectory`, the client's
host and its `ClientConfig`; it never sees the model (`wallet.client.remote`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import trio

from compute.wiretensor import WireTensorError, decode_tensor, encode_tensor
from ledger.codec import decode, encode
from ledger.errors import EncodeError
from node.net import FramingError, Host, write_frame
from node.torch_thread import tensor_work
from node.wire import (
    MAX_INFERENCE_FRAME, MAX_POSITIONS, TAB_ENDS, Link, Linked, SessionError, Settle, Settled,
    Step, StepCopy, StepResult,
)
from wallet.client.directory import SwarmDirectory
from wallet.client.failover import Failover
from wallet.errors import HopFailed, NoRoute, RemoteError, RouteBusy, ServerBusy, SessionTooLong
from wallet.client.generation import ClientConfig, Generation
from wallet.client.hop import (
    HopSession, chained_timeout, count_delivered, open_all, open_hop, step_timeout,
)
from wallet.payer import ClientTab, Payer
from wallet.client.route import Hop


#: Frames a run's readers may hold before they wait for the client to take them.
INBOX_SIZE = 16


class RouteRun(Failover):
    """The sessions of one generation and the inputs kept for replay.

    Every hop's frames arrive through one inbox (a reader task per session
    in ``nursery``), so a hop that dies is noticed whichever hop the client
    is waiting for. When the hops are linked (push routing) they answer
    the client only at the end of the chain, or where a push failed; the
    client then keeps only the first hop's inputs, and a failover first
    rebuilds the failed hop's inputs by replaying the hops before it.

    Args:
        directory: the swarm as the client sees it; plans the hops and
            records the peers that failed.
        host: the client's running libp2p host.
        config: the client's codec, timeouts and push setting.
        result: the generation's result, whose route, failovers and wire
            bytes the run fills in.
        max_len: the most positions a session will hold (prompt + new tokens).
        nursery: where the sessions' reader tasks run.
        on_route: called with the route's hops whenever they change (opened,
            or a hop replaced).
        payer: pays the sessions (None: free sessions only): one tab for the
            route's hops, one more for each replacement or spot check.
    """

    def __init__(self, directory: SwarmDirectory, host: Host, config: ClientConfig,
                 result: Generation, max_len: int, nursery: trio.Nursery,
                 on_route: Callable[[list[Hop]], None] = lambda hops: None,
                 payer: Payer | None = None):
        self.directory, self.host, self.config, self.payer = directory, host, config, payer
        self.result, self.max_len = result, max_len
        self.nursery, self.on_route = nursery, on_route
        self.sessions: list[HopSession] = []
        self.pushing = False  # the hops are linked: each pushes to the next
        # Hidden states sent into each hop's first layer, as the chunks they went in,
        # complete (since position 0) for the hops whose start is in ``kept``.
        self.inputs: dict[int, list[torch.Tensor]] = {}
        self.kept: set[int] = set()
        # Steps go in forward calls (chunks) of at most ``chunk`` positions: the smallest
        # ``max_chunk_positions`` of the route's servers, so a pushed step fits every hop;
        # ``widest`` is the longest call sent so far, which a replacement must run too.
        self.chunk = MAX_POSITIONS
        self.widest = 1
        self._dated = trio.current_time()  # when the payer last asked the chain's height
        # The route's final outputs since position 0, as the steps returned them (a
        # spot check compares them all: one check covers every earlier step, 9.5).
        self.outputs: list[torch.Tensor] = []
        self._inbox_in, self._inbox = trio.open_memory_channel(INBOX_SIZE)

    async def open(self, start: int, end: int) -> None:
        """Open (and, pushing, link) the sessions over [start, end). Raises as `_open_span`."""
        self.sessions = await self._open_span(start, end)
        self.on_route([s.hop for s in self.sessions])
        if self.config.push and len(self.sessions) > 1:
            self.pushing = await self._link_all()
        self.kept = {s.hop.start for s in (self.sessions[:1] if self.pushing else self.sessions)}

    async def close(self) -> None:
        """Settle the paid sessions (the final voucher pays the last step), then close all."""
        for s in self.sessions:
            try:
                if s.paid and s.error is None:
                    await self._settle(s)
            finally:  # cancelled (a killed client): no settling, but every stream closes
                await s.close()

    async def _settle(self, s: HopSession) -> None:
        """Send the final voucher; keep what the server says it is owed and its claim."""
        owed, claim = None, None
        try:
            with trio.fail_after(self.config.open_timeout):
                s.settled = True
                await write_frame(s.stream, encode(Settle(s.voucher())))
                _, reply = await self._receive(
                    [s], lambda x, m: x is s and isinstance(m, Settled))
            owed, claim = reply.owed, (reply.claim.hex() if any(reply.claim) else None)
        except (trio.TooSlowError, FramingError, HopFailed):
            pass  # it claims after its idle timeout anyway, with the voucher it holds
        layers, bid, amount = s.hop.end - s.hop.start, s.tab.bids[s.hop.peer_id], s.tab.owed(
            s.hop.peer_id)
        self.result.payments.append({
            "peer_id": s.hop.peer_id, "layers": layers, "positions": amount // (layers * bid),
            "bid": bid, "amount": amount, "server_counted": owed, "tab": s.tab.tab_id.hex(),
            "claim": claim})

    async def forward(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        """Run hidden states ``x`` (1, T, C) at ``pos`` through every hop; fail over as needed."""
        await self._renew_due()
        i = 0
        while i < len(self.sessions):
            try:
                i, x = await self._run_from(i, x, pos)
            except _Silent:  # a linked route went quiet: ask hop by hop who it is
                count_delivered(self.sessions, pos)  # any hop may have run it: pay, at most once
                await self._stop_pushing()
            except HopFailed as exc:
                if self.pushing and exc.session in self.sessions:  # the hops before it ran it
                    count_delivered(self.sessions[: self.sessions.index(exc.session)], pos)
                await self._stop_pushing()
                i, x = await self._fail_over(self.sessions.index(exc.session), exc, pos)
        self.note_outputs(pos, x)
        return x

    def note_outputs(self, pos: int, y: torch.Tensor) -> None:
        """Keep the route's final outputs ``y`` at ``pos..`` (those after ``pos`` are dropped)."""
        held = sum(o.shape[1] for o in self.outputs)
        if held > pos:
            self.outputs = [torch.cat(self.outputs, dim=1)[:, :pos]] if pos else []
        elif held < pos:  # cannot happen: every step's outputs pass through ``forward``
            self.outputs = []
            return
        self.outputs.append(y)

    def routed(self) -> torch.Tensor | None:
        """The route's final outputs since position 0 (None: none kept)."""
        return torch.cat(self.outputs, dim=1) if self.outputs else None

    def _pieces(self, x: torch.Tensor) -> list[torch.Tensor]:
        """``x`` (1, T, C) as the forward calls it goes in: chunks of at most ``chunk``."""
        return list(torch.split(x, self.chunk, dim=1))

    async def _run_from(self, i: int, x: torch.Tensor, pos: int) -> tuple[int, torch.Tensor]:
        """Send the step to hop ``i``; returns (the hop after the one that answered, its output).

        Linked, the answer comes from the last hop, or from an earlier one
        whose push failed (which unlinked it): the client unlinks the rest
        and goes on from the hop after it.
        """
        session = self.sessions[i]
        pieces = self._pieces(x)  # a long prompt: several calls, each within every hop's cap
        self.widest = max(self.widest, pieces[0].shape[1])
        self._record(session, pieces, pos)
        last = len(self.sessions) - 1 if self.pushing else i
        for pushed in self.sessions[i + 1: last + 1]:  # they run it too, if the chain holds
            pushed.sent[pos] = x.shape[1]
        chunks = tuple(p.shape[1] for p in pieces) if len(pieces) > 1 else ()
        for before, pushed in zip(self.sessions[i: last], self.sessions[i + 1: last + 1]):
            pushed.log.pushed(pos, chunks, before)  # its input: the hop before's output
        began = trio.current_time()
        timeout, sent = await self._send(session, x, pos, chunks, self.sessions[i + 1: last + 1])
        timeout += sum(chained_timeout(self.config, self.directory.throughput(s.hop.peer_id),
                                       x.shape[1]) for s in self.sessions[i + 1: last + 1])
        answered, out = await self._await(self.sessions[: last + 1],
                                          self.sessions[i: last + 1], x, pos, timeout, sent)
        if answered is session and x.shape[1] == 1:  # one hop's own decode step: time it
            self.directory.record_step(session.hop.peer_id, session.hop.end - session.hop.start,
                                       trio.current_time() - began)
        j = self.sessions.index(answered)
        if j < last:
            await self._stop_pushing()
        return j + 1, out

    async def _stop_pushing(self) -> None:
        if self.pushing:
            self.pushing = False
            await self._unlink_all()

    async def _link_all(self) -> bool:
        """Link each hop to the next; False (and nothing linked) if any hop could not."""
        try:
            with trio.fail_after(self.config.open_timeout):
                pairs = list(zip(self.sessions, self.sessions[1:]))
                for a, b in pairs:  # every hop dials its next at once, then the answers
                    await write_frame(a.stream, encode(Link(
                        b.hop.peer_id, self.directory.addrs(b.hop.peer_id), b.token)))
                waiting = {a: b for a, b in pairs}
                while waiting:  # the answers, in whatever order they come
                    a, reply = await self._receive(
                        list(waiting), lambda s, m: s in waiting and isinstance(m, Linked))
                    b = waiting.pop(a)
                    if not reply.ok:
                        raise HopFailed(f"{a.hop.peer_id} cannot reach {b.hop.peer_id}: "
                                        f"{reply.reason}", a)
            return True
        except (trio.TooSlowError, FramingError, HopFailed):
            await self._unlink_all()  # a hop that fails for real shows at the first step
            return False

    async def _unlink_all(self) -> None:
        for session in self.sessions:
            with trio.move_on_after(1.0):
                try:
                    await write_frame(session.stream, encode(Link("", (), bytes(32))))
                except Exception:  # a dead hop: failover sees to it
                    pass

    def _record(self, session: HopSession, pieces: list[torch.Tensor], pos: int) -> None:
        """Keep a step's ``pieces`` (its chunks), sent to ``session`` at ``pos``, unless held.

        Kept chunk by chunk: a replay repeats the original forward calls.
        """
        if session.hop.start not in self.kept:
            return
        kept = self.inputs.setdefault(session.hop.start, [])
        held = sum(c.shape[1] for c in kept)
        if held == pos:
            kept.extend(pieces)
        elif held != pos + sum(p.shape[1] for p in pieces):  # cannot happen; never replay gaps
            self.kept.discard(session.hop.start)

    def _keep(self, session: HopSession, history: list[torch.Tensor]) -> None:
        self.inputs[session.hop.start] = list(history)
        self.kept.add(session.hop.start)

    async def _replay(self, session: HopSession, history: list[torch.Tensor]
                      ) -> list[torch.Tensor]:
        """``history`` through ``session`` from position 0, in its chunks; the outputs, chunked."""
        lengths = tuple(c.shape[1] for c in history)
        x = torch.cat(history, dim=1)
        timeout, sent = await self._send(session, x, 0, lengths)
        _, out = await self._await([session], [session], x, 0, timeout, sent)
        return list(torch.split(out, list(lengths), dim=1))

    async def _open_span(self, start: int, end: int) -> list[HopSession]:
        """Sessions covering [start, end): planned, opened, replanned around busy or dead servers.

        Only servers that take ``max_len`` positions per session and run
        forward calls as wide as the widest sent so far are planned (a
        replacement replays the kept chunks as they went); the run's
        ``chunk`` shrinks to the smallest cap of the servers opened.

        Raises:
            SessionTooLong: a layer's servers all have smaller caps (waiting
                would not help).
            RouteBusy: servers cover the span, but the usable ones stayed busy for
                ``busy_wait``.
            NoRoute: no usable servers cover the span.
            RemoteError: too many failures.
        """
        directory = self.directory
        busy: dict[str, int] = {}
        give_up_at = trio.current_time() + self.config.busy_wait
        while True:
            try:
                hops = self._plan(start, end, busy)
            except SessionTooLong:
                raise
            except NoRoute as exc:
                waiting = busy or directory.announced_full(start, end)
                if not waiting:
                    raise
                if trio.current_time() >= give_up_at:  # busy, not absent: say so
                    raise RouteBusy(exc.first, min(busy.values(), default=1000)) from None
                # The servers' own hint, or a second for servers that announced themselves full.
                await trio.sleep(min(busy.values(), default=1000) / 1000)
                busy.clear()
                await directory.refresh()
                continue
            tab = None
            if self.payer is not None:
                await self.payer.date()  # dated now: the tab's life starts as it opens
                tab = self.payer.open_tab(hops, directory.server_map(), self.max_len)
            try:
                opened = await open_all(hops, lambda hop: self._open(hop, tab))
                caps = {s.peer_id: s.max_chunk_positions for s in directory.servers()}
                self.chunk = min([self.chunk, *(caps.get(h.peer_id, 1) for h in hops)])
                return opened
            except ServerBusy as exc:
                if self.payer is not None:
                    self.payer.retract(tab)
                    if self.payer.outbid(exc.peer, exc.min_bid):
                        continue  # full: ask again at once, bidding what it would admit
                busy[exc.peer] = max(exc.retry_after_ms, 50)
            except HopFailed as exc:
                if self.payer is not None:
                    self.payer.retract(tab)
                self._count_failure(exc)
                directory.exclude(exc.peer)

    def _plan(self, start: int, end: int, busy: dict[str, int]) -> list[Hop]:
        """`SwarmDirectory.plan` around ``busy``; a paying client also plans over full
        servers (a full server seats paid requests in its waiting room, by bid)."""
        directory = self.directory
        try:
            return directory.plan(start, end, also_exclude=busy, positions=self.max_len,
                                  chunk=self.widest)
        except NoRoute as exc:
            if (self.payer is None or type(exc) is not NoRoute
                    or not directory.announced_full(start, end)):
                raise
            return directory.plan(start, end, also_exclude=busy, positions=self.max_len,
                                  chunk=self.widest, ignore_load=True)

    async def _open(self, hop: Hop, tab: ClientTab | None = None) -> HopSession:
        """A session on ``hop`` (paid from ``tab``, else from a tab of its own when the
        run pays), its reader started. Raises as `wallet.client.hop.open_hop`."""
        own = self.payer is not None and tab is None
        if own:
            await self.payer.date()
            tab = self.payer.open_tab([hop], self.directory.server_map(), self.max_len)
        try:
            session = await open_hop(self.host, self.directory, hop, self.config, self.max_len,
                                     tab)
        except BaseException:
            if own:  # no server took it: its nonce is the next tab's (no gap)
                self.payer.retract(tab)
            raise
        if self.payer is not None:
            self.payer.saw_height(session.height)
        self.nursery.start_soon(self._read, session)
        return session

    async def _send(self, session: HopSession, x: torch.Tensor, pos: int,
                    chunks: tuple[int, ...], pushed: list[HopSession] = ()
                    ) -> tuple[float, int]:
        """Send a step to ``session`` (and the ``pushed`` hops after it); returns (its
        answer's timeout, payload bytes)."""
        cfg = self.config
        payload = await tensor_work(encode_tensor, x, cfg.codec, rows=x.shape[1])
        timeout = step_timeout(self.config, self.directory.throughput(session.hop.peer_id),
                               x.shape[1], max(len(chunks), 1))
        if session.error is not None:  # its server ended it already (e.g. `TAB_ENDS`)
            raise session.error
        session.sent[pos] = x.shape[1]
        session.log.sent(Step(pos, chunks, payload))
        try:
            through = [(h.hop, x.shape[1]) for h in (session, *pushed) if h.tab is session.tab]
            message = encode(Step(pos, chunks, payload, session.voucher(through)))
        except EncodeError as exc:
            raise RemoteError(f"a step of {x.shape[1]} positions is too large for one frame "
                              f"({exc}); use a shorter prompt or --wire fp16") from None
        try:
            with trio.fail_after(timeout):
                await write_frame(session.stream, message)
        except trio.TooSlowError:
            raise HopFailed(f"{session.hop.peer_id} stalled: a step unsent in {timeout:.1f} s",
                            session) from None
        except FramingError as exc:
            with trio.move_on_after(1.0):  # the server may have said why it closed
                while session.error is None:
                    await trio.sleep(0.01)
            raise session.error or HopFailed(f"{session.hop.peer_id} failed: {exc}",
                                             session) from None
        return timeout, len(payload)

    async def _await(self, watch: list[HopSession], answering: list[HopSession],
                     x: torch.Tensor, pos: int, timeout: float, sent: int
                     ) -> tuple[HopSession, torch.Tensor]:
        """The outputs for the step at ``pos`` (inputs ``x``) from one of ``answering``.

        Returns (the answering session, its outputs). Results for other
        positions are skipped: a step sent again after a failure may be
        answered twice.

        Raises:
            HopFailed: a session in ``watch`` broke or refused; or nothing
                came in ``timeout`` and ``answering`` is one session.
            _Silent: nothing came in ``timeout`` from a linked chain.
        """
        try:
            with trio.fail_after(timeout):
                session, reply = await self._receive(
                    watch, lambda s, m: s in answering and isinstance(m, StepResult)
                    and m.pos == pos)
        except trio.TooSlowError:
            if len(answering) > 1:
                raise _Silent() from None
            raise HopFailed(f"{answering[0].hop.peer_id} stalled: no answer in {timeout:.1f} s",
                            answering[0]) from None
        try:
            out = await tensor_work(decode_tensor, reply.hidden, rows=x.shape[1])
        except WireTensorError as exc:
            raise HopFailed(f"{session.hop.peer_id} sent bad hidden states: {exc}",
                            session) from None
        if out.shape != x.shape:
            raise HopFailed(f"{session.hop.peer_id} answered shape {tuple(out.shape)} "
                            f"for {tuple(x.shape)}", session)
        session.last_reply = reply
        session.log.answered(reply.pos, reply.hidden, reply.signature)
        self.result.wire_bytes += sent + len(reply.hidden)
        for done in answering[: answering.index(session) + 1]:
            if not done.steps:  # the route lists servers that actually served
                self.result.route.append(done.served)
            done.steps += 1
        return session, out.to(x.dtype)

    async def _receive(self, watch: list[HopSession], wanted) -> tuple[HopSession, object]:
        """The next frame ``wanted(session, message)`` accepts; frames it does not are dropped.

        Raises:
            HopFailed: a session in ``watch`` broke (now or earlier) or sent `SessionError`.
        """
        while True:
            for session in watch:
                if session.error is not None:
                    raise session.error
            session, message = await self._inbox.receive()
            if session.error is None and wanted(session, message):
                return session, message

    async def _read(self, session: HopSession) -> None:
        """Every frame ``session``'s server sends, into the inbox, until it breaks or closes."""
        with session.reading:
            try:
                while True:
                    message = decode(await session.reader.read_frame(MAX_INFERENCE_FRAME),
                                     (StepResult, StepCopy, SessionError, Linked, Settled))
                    if isinstance(message, StepCopy):  # a linked hop's answer, for the log
                        session.log.answered(message.pos, message.hidden, message.signature)
                        continue
                    if isinstance(message, StepResult) and session.tab is not None:
                        self._delivered(session, message.pos)
                    if isinstance(message, SessionError):  # the server ends the session
                        raise HopFailed(f"{session.hop.peer_id} refused a step: "
                                        f"{message.reason}", session,
                                        tab_ended=message.reason.startswith(TAB_ENDS))
                    await self._inbox_in.send((session, message))
            except Exception as exc:  # refused, framing, decoding, whatever the stream raised
                session.error = exc if isinstance(exc, HopFailed) else HopFailed(
                    f"{session.hop.peer_id} failed: {exc}", session)
                await self._inbox_in.send((session, None))  # wakes a waiting client


    def _delivered(self, session: HopSession, pos: int) -> None:
        """``session`` answered the step at ``pos``: it, and the hops before it that pushed
        the step there, delivered it (`wallet.client.hop.count_delivered`), awaited or not."""
        count_delivered(self.sessions[: self.sessions.index(session) + 1]
                        if session in self.sessions else [session], pos)


class _Silent(RemoteError):
    """A linked route gave no answer in time (which hop is silent is not known yet)."""
