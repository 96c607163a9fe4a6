"""One hop's inference stream: opening it (free or paid) and closing it.

Owns `HopSession` (one open session on one server for one hop of a route)
and `open_hop`, which dials the server, sends `OpenSession` (with the
tab and bid when the hop is paid, specs/network.md section 9.6) and reads
its answer: accepted, busy (with the least bid it would admit) or refused.
`wallet.client.session.RouteRun` drives the steps; it reads every hop's frames.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
from libp2p.abc import INetStream
from libp2p.peer.id import ID

from ledger.codec import decode, encode
from ledger.errors import DecodeError
from node.net import DialError, FrameReader, FramingError, Host, RequestError, read_frame, write_frame
from node.wire import (
    INFERENCE_PROTOCOL, TAB_REFUSED, Busy, OpenSession, SessionAccepted, SessionError, Settle,
    StepResult,
)
from wallet.client.directory import SwarmDirectory
from wallet.errors import HopFailed, ServerBusy
from wallet.client.generation import ClientConfig, Served
from wallet.payer import ClientTab, PaymentRefused
from wallet.client.route import Hop
from wallet.client.steplog import StepLog


class HopSession:
    """One open inference stream to one server for one hop.

    A reader task (`RouteRun._read`) takes every frame the server sends and
    hands it to the run's inbox; a broken stream is kept in ``error``.
    ``tab``: the tab paying this hop (None: a free session).
    """

    def __init__(self, hop: Hop, stream: INetStream, served: Served, token: bytes = b"",
                 tab: ClientTab | None = None):
        self.hop, self.stream, self.served, self.token = hop, stream, served, token
        self.tab = tab
        self.reader = FrameReader(stream)
        self.reading = trio.CancelScope()  # the reader task's
        self.error: HopFailed | None = None
        self.steps = 0
        self.settled = False  # the final voucher went out (`Settle`)
        self.height = 0  # the server's chain height when it accepted (0: none said)
        self.sent: dict[int, int] = {}  # positions of each step sent, by pos, until answered
        self.last_reply: StepResult | None = None  # signed: a spot check's evidence
        self.log = StepLog()  # every step it ran and its signed answer (spot checks, 9.5)

    @property
    def paid(self) -> bool:
        return self.tab is not None

    def voucher(self, through=()) -> bytes:
        """The voucher a step to this hop carries (b"": a free session); ``through``: the
        (hop, positions) the step runs on (`wallet.payer.ClientTab.voucher`)."""
        return self.tab.voucher(through) if self.tab is not None else b""

    async def close(self) -> None:
        """Close the stream; a paid session not settled yet is first sent the voucher it
        has (even all zero: its server closes the lane and its cap comes back at once)."""
        self.reading.cancel()
        if self.tab is not None and not self.settled and self.error is None:
            self.settled = True
            with trio.move_on_after(1.0, shield=True):
                try:
                    await write_frame(self.stream, encode(Settle(self.voucher())))
                except Exception:  # a dead server's stream: it claims what it holds
                    pass
        with trio.move_on_after(2.0, shield=True):
            try:
                await self.stream.close()
            except Exception:  # a dead server's stream: nothing to close
                pass


async def open_hop(host: Host, directory: SwarmDirectory, hop: Hop, config: ClientConfig,
                   max_len: int, tab: ClientTab | None = None) -> HopSession:
    """Open a session of ``max_len`` positions on ``hop``'s server; paid from ``tab`` if given.

    Raises:
        ServerBusy: the server is full (its retry hint and least bid with it).
        PaymentRefused: the server's chain refuses the tab (funds, nonce...).
        HopFailed: unreachable, or it refused the session (its reason: a
            moved span, a bid below its ask...).
    """
    served = Served(hop.peer_id, hop.start, hop.end)
    paid = tab is not None and hop.peer_id in tab.lane_of
    request = OpenSession(directory.model_id, hop.start, hop.end, max_len, config.codec,
                          tab.bids[hop.peer_id] if paid else 0, encode(tab.tab) if paid else b"")
    stream = None
    try:
        with trio.fail_after(config.open_timeout):
            peer = ID.from_base58(hop.peer_id)
            if peer not in host.connected_peers():
                for addr in directory.addrs(hop.peer_id):
                    try:
                        await host.connect(addr)
                        break
                    except DialError:
                        continue
            stream = await host.open_stream(peer, INFERENCE_PROTOCOL)
            await write_frame(stream, encode(request))
            reply = decode(await read_frame(stream, 4096), (SessionAccepted, Busy, SessionError))
    except (trio.TooSlowError, RequestError, FramingError, DecodeError, ValueError) as exc:
        if stream is not None:
            await HopSession(hop, stream, served).close()
        raise HopFailed(f"cannot open a session on {hop.peer_id}: {exc!r}") from None
    session = HopSession(hop, stream, served,
                         reply.token if isinstance(reply, SessionAccepted) else b"",
                         tab if paid else None)
    session.height = reply.height if isinstance(reply, SessionAccepted) else 0
    if paid and isinstance(reply, SessionAccepted):
        tab.accepted = True  # in the server's mempool now: a later tab takes the next nonce
    if isinstance(reply, Busy):
        await session.close()
        raise ServerBusy(hop.peer_id, reply.retry_after_ms, reply.reason, reply.min_bid)
    if isinstance(reply, SessionError):
        await session.close()
        if paid and reply.reason.startswith(TAB_REFUSED):  # the wire says it in text only
            # Every server's chain would: no other route helps (e.g. a stale balance).
            raise PaymentRefused(f"{hop.peer_id}: {reply.reason}")
        # E.g. it moved to other layers since it announced: plan around it.
        raise HopFailed(f"{hop.peer_id} refused the session: {reply.reason}")
    return session


def count_delivered(sessions: list[HopSession], pos: int) -> None:
    """Count the step at ``pos`` as delivered by each of ``sessions`` still waiting on it.

    A step's positions are owed once its server sent its outputs on: to the
    client, or pushed to the next hop. The client sees only the chain's last
    answer, or an earlier hop's after its push failed; on a failure inside
    a pushed chain it pays the hops before the failed one for the step in
    flight (they ran it), so its vouchers stay level with their counts.
    """
    for s in sessions:
        positions = s.sent.pop(pos, None)
        if positions is not None and s.tab is not None:
            s.tab.deliver(s.hop, positions)


def step_timeout(config: ClientConfig, throughput: float, positions: int, calls: int) -> float:
    """Seconds a server of ``throughput`` tokens/s may take for a step of ``positions`` in
    ``calls`` forward calls.

    A replay makes one forward call per chunk: allow each about twice the
    server's announced time for one token through its layers.
    """
    return (config.step_timeout + config.step_timeout_per_token * positions
            + 2.0 * (calls - 1) / throughput)


def chained_timeout(config: ClientConfig, throughput: float, positions: int) -> float:
    """Seconds a linked chain's wait grows by for a further hop of ``throughput`` tokens/s.

    0.02 s per position and twice the server's announced time for one
    step: a chain of slow servers is not taken for a silent one.
    """
    return config.step_timeout_per_token * positions + 2.0 / throughput


async def open_all(hops: list[Hop], open_one: Callable[[Hop], Awaitable[HopSession]]
                   ) -> list[HopSession]:
    """Sessions on all ``hops`` at once (``open_one`` each): one round trip before the
    first step, not one per hop.

    Raises:
        The first hop's error when any failed (every session opened is then
        closed), with ``peer`` set to that hop's peer id (whom to exclude).
    """
    opened: list[HopSession | None] = [None] * len(hops)
    errors: dict[int, Exception] = {}

    async def one(k: int) -> None:
        try:
            opened[k] = await open_one(hops[k])
        except Exception as exc:  # raised below, as itself, not in a group
            errors[k] = exc
    try:
        async with trio.open_nursery() as nursery:
            for k in range(len(hops)):
                nursery.start_soon(one, k)
    finally:
        if errors or None in opened:  # failed part way (or cancelled): free them
            for session in opened:
                if session is not None:
                    await session.close()
    if errors:
        k = min(errors)
        errors[k].peer = hops[k].peer_id
        raise errors[k]
    return opened
