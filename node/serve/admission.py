"""Who may open a session on a server, and in which order sessions get the compute thread.

Owns the pure parts of an inference server's defence against being held or
slowed for free (specs/network.md section 9.3, "Limits, caps and metering"):

- `address_key`: the bucket a client's remote IP falls in for the
  per-address limit (an IPv4 address; an IPv6 /64, which one subscriber
  usually holds whole; an IPv4-mapped IPv6 address as its IPv4);
- `SessionConfig` (a server's session limits, caps and timeouts),
  `SessionLimits` and `refusal`: at most ``per_peer`` open sessions per
  client peer id and ``per_address`` per address bucket, on top of the
  server's ``max_sessions``; a refusal is a `SessionBusy` (`ServerFull`,
  or `ClientAtLimit`), its text the `Busy` reason; `remote_ip` reads a
  stream's remote IP;
- `Meter`: the compute one session used (positions run, forward seconds,
  steps), what `pnode status` shows of it, and its fair-queueing tag;
- `FairScheduler`: start-time fair queueing of the server's forward calls,
  one flow per client (`flow_key`), so that when several clients wait for
  the torch thread the one that used less compute since it arrived goes
  first, and one client's stream of large chunks, over however many
  sessions, cannot starve another's decode steps. ``Meter.priority`` is
  the hook for paid sessions (a higher priority always goes first);
- `Seat` and `reclaim_choice`: which open session a full server closes to
  seat a new request (one idle for ``reclaim_idle_s``, or one of an
  address holding more than its share), so that a session that steps now
  and then cannot hold a slot against clients that arrive.

Pure except `FairScheduler`, which waits with trio; no libp2p import (a
stream is only asked for its connection's remote address), no torch.
"""

from __future__ import annotations

import ipaddress
import itertools
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from node.errors import NodeError


class InferenceError(NodeError):
    """Root of the inference-serving errors."""


class SessionRefused(InferenceError):
    """A session request the server will not serve (its reason goes to the client)."""


class SessionBusy(InferenceError):
    """A session the server would serve, but not now: answered `Busy`, its text the reason.

    The text travels as it always did (other implementations read it); the
    server decides on the subclass.
    """


class ServerFull(SessionBusy):
    """Every one of the server's ``max_sessions`` is open (a paid request may wait).

    Attributes:
        open_sessions: the sessions open (slots held by admitted waiters included).
    """

    def __init__(self, open_sessions: int):
        super().__init__(f"{open_sessions} sessions open")
        self.open_sessions = open_sessions


class ClientAtLimit(SessionBusy):
    """This client holds its share: ``held`` sessions, at most ``limit``.

    Attributes:
        held, limit: its open sessions and the most it may hold.
        address: the address bucket that holds them (None: its peer id or
            account does).
    """

    def __init__(self, held: int, limit: int, address: str | None = None):
        if address is None:
            text = (f"this client's limit: it holds {held} sessions here, at most "
                    f"{limit} per client")
        else:
            text = (f"this client's limit: {held} sessions are open from its address "
                    f"{address}, at most {limit} per address")
        super().__init__(text)
        self.held, self.limit, self.address = held, limit, address


class SessionConfigError(NodeError, ValueError):
    """A session limit or cap that makes no sense (below 1)."""


def address_key(ip: str | None) -> str | None:
    """The per-address bucket of a client at remote IP ``ip``.

    IPv6 is grouped by /64: a subscriber (or a cloud VM) is usually given a
    whole /64, so counting single IPv6 addresses would let one client open
    2^64 "addresses" worth of sessions.

    Args:
        ip: the remote IP of the client's connection, as text; None when
            the transport does not say.

    Returns:
        The bucket's name ("203.0.113.7", "2001:db8:1:2::/64"), or None for
        an unknown or unparseable address (not limited by address).
    """
    if ip is None:
        return None
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])  # drop an IPv6 zone id
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if isinstance(addr, ipaddress.IPv4Address) or addr.is_loopback:  # ::1 is no /64
        return str(addr)
    return str(ipaddress.IPv6Network(f"{addr}/64", strict=False))


def is_loopback(key: str | None) -> bool:
    """Whether an `address_key` bucket is this machine's loopback (127.0.0.0/8 or ::1)."""
    if key is None:
        return False
    try:
        return ipaddress.ip_network(key, strict=False).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """The open-session limits of one server.

    max_sessions: sessions open at most, all clients together.
    per_peer: at most this many per client peer id.
    per_address: at most this many per `address_key` bucket.
    limit_loopback: whether loopback clients count against ``per_address``
        (they do not by default: every local wallet and devnet node shares
        127.0.0.1, and a local user can load the machine anyway).
    """

    max_sessions: int
    per_peer: int
    per_address: int
    limit_loopback: bool = False


@dataclass(frozen=True)
class SessionConfig:
    """The limits and timeouts of an inference server's sessions.

    max_sessions: sessions open at most.
    max_sessions_per_peer: at most this many per client peer id (None: a
        quarter of ``max_sessions``, at least 1), so that a few identities
        cannot hold every slot.
    max_sessions_per_address: at most this many per client IP address (an
        IPv6 /64; None: half of ``max_sessions``, at least 1): identities are
        free, addresses are not.
    limit_loopback: whether clients on this machine's loopback count against
        the per-address limit (by default not: every local wallet and devnet
        node shares 127.0.0.1, and a local user can load the machine anyway).
    max_len: most positions one session may hold (announced as
        ``max_session_positions``).
    max_chunk_positions: most positions of one forward call: a step without
        chunks, or each chunk of one (announced): the longest the compute
        thread is held for another session's decode step.
    free_call_positions: while another client has a session open, a free
        session's forward call is run as calls of at most this many
        positions, each its own turn in the fair queue: the longest a
        decode step waits behind free compute (paid calls are not split).
    reclaim_idle_s: when the server is full, a session that ran no forward
        for this long may be closed to seat a new request (the longest
        idle first; a free request never closes a paid session).
    share_idle_s: when the server is full and none is idle that long, a
        request from an address bucket holding at least two sessions fewer
        than the bucket holding the most may close that bucket's longest
        idle free session, if it ran no forward for this long.
    """

    max_sessions: int = 8
    max_sessions_per_peer: int | None = None
    max_sessions_per_address: int | None = None
    limit_loopback: bool = False
    max_len: int = 2048
    max_chunk_positions: int = 128
    free_call_positions: int = 32
    idle_timeout: float = 60.0  # seconds a session may go without a forward
    reclaim_idle_s: float = 10.0  # idle that long, it may make way for a new request
    share_idle_s: float = 2.0  # idle that long and over its address's share: the same
    max_waiting: int | None = None  # paid requests in the waiting room (None: max_sessions)
    queue_timeout: float = 5.0  # seconds one waits there (under a client's open timeout)
    busy_retry_ms: int = 1000  # the hint given with `Busy`
    write_timeout: float = 30.0
    link_timeout: float = 5.0  # dialing the next hop for push routing
    push_timeout: float = 2.0  # one push to the next hop

    def __post_init__(self) -> None:
        for name in ("max_sessions", "max_len", "max_chunk_positions", "free_call_positions"):
            if getattr(self, name) < 1:
                raise SessionConfigError(f"SessionConfig.{name} must be at least 1, not "
                                         f"{getattr(self, name)}")

    def limits(self) -> SessionLimits:
        """The open-session limits, defaults filled in."""
        per_peer, per_address = self.max_sessions_per_peer, self.max_sessions_per_address
        return SessionLimits(
            self.max_sessions,
            max(1, self.max_sessions // 4) if per_peer is None else max(1, per_peer),
            max(1, self.max_sessions // 2) if per_address is None else max(1, per_address),
            self.limit_loopback)


def counted(limits: SessionLimits, address: str | None) -> bool:
    """Whether ``address`` (an `address_key` bucket) counts against ``per_address``.

    An unknown address does not; a loopback one only with ``limit_loopback``.
    """
    return address is not None and (limits.limit_loopback or not is_loopback(address))


def flow_key(limits: SessionLimits, paid: bool, account: str, address: str | None) -> str:
    """The client a session's compute counts for in the fair queue (`FairScheduler`).

    A free session counts for its address bucket when that bucket is
    limited (`counted`), else for its account (peer id): identities are
    free, addresses are not, so a flood over many identities of one
    address gets one client's share. A paid session counts for its
    account (the tab's client): its bid already orders it, and a free
    flood from the same address must not spend its share.
    """
    if not paid and counted(limits, address):
        return f"address {address}"
    return f"account {account}"


def refusal(limits: SessionLimits, open_sessions: Iterable[tuple[str, str | None]],
            peer: str, address: str | None) -> SessionBusy | None:
    """Why a new session of ``peer`` from ``address`` would be refused (None: it is taken).

    Args:
        limits: the server's limits.
        open_sessions: (peer id, address bucket) of every open session.
        peer: the requesting client's peer id.
        address: its `address_key` bucket (None: unknown).

    Returns:
        Why it is busy (the caller raises it): `ServerFull`, or
        `ClientAtLimit` when this client (its peer id, or its address)
        holds its share; None when the session may open.
    """
    total = by_peer = by_address = 0
    for p, a in open_sessions:
        total += 1
        by_peer += p == peer
        by_address += address is not None and a == address
    if total >= limits.max_sessions:
        return ServerFull(total)
    if by_peer >= limits.per_peer:
        return ClientAtLimit(by_peer, limits.per_peer)
    if counted(limits, address) and by_address >= limits.per_address:
        return ClientAtLimit(by_address, limits.per_address, address)
    return None


@dataclass(frozen=True, slots=True)
class Seat:
    """An open session as `reclaim_choice` sees it.

    key: the session's id.
    address: its `address_key` bucket.
    paid: whether a tab pays for it.
    priority: its `Meter.priority` (a paid session's bid).
    idle: seconds since its last forward began or ended (or since it opened).
    stepping: a step (or another frame's work) is under way: never closed then.
    """

    key: int
    address: str | None
    paid: bool
    priority: int
    idle: float
    stepping: bool = False


def reclaim_choice(limits: SessionLimits, config: SessionConfig, seats: Iterable[Seat], *,
                   paid: bool, priority: int, address: str | None) -> tuple[int, str] | None:
    """Which open session a full server closes to seat a new request, and why.

    1. Idle: a session that ran no forward for ``config.reclaim_idle_s``;
       free ones before paid ones, the longest idle first. A free request
       never closes a paid session (it pays for its slot); a paid request
       closes a paid one only of a bid at most its own.
    2. Share: else, when the request's address is limited (`counted`), a
       free session idle for ``config.share_idle_s`` of the limited bucket
       holding the most sessions, if it holds at least two more than the
       request's bucket (after the swap it still holds at least as many):
       the longest idle of it.

    A session in a step is never chosen. Attack note: a client that steps
    every few seconds holds a slot for almost nothing; closing the idle
    ones when someone waits makes it step at least every
    ``reclaim_idle_s`` (and every ``share_idle_s`` beyond its address's
    share), each step then waiting its turn in the fair queue.

    Args:
        limits: the server's limits (which addresses are limited).
        config: its reclaim thresholds.
        seats: the open sessions (none already being closed).
        paid, priority, address: the request's.

    Returns:
        (the session's key, the reason to tell its client), or None: none may go.
    """
    seats = [s for s in seats if not s.stepping]
    idle = [s for s in seats if s.idle >= config.reclaim_idle_s
            and (not s.paid or (paid and s.priority <= priority))]
    if idle:
        s = min(idle, key=lambda s: (s.paid, -s.idle))
        return s.key, (f"session reclaimed: it ran no forward for {s.idle:.1f} s "
                       f"(reclaim_idle_s {config.reclaim_idle_s:g}) while the server was "
                       f"full and a new client asked: open a new session and replay")
    if not counted(limits, address):
        return None
    held: dict[str, int] = {}
    for s in seats:
        if counted(limits, s.address):
            held[s.address] = held.get(s.address, 0) + 1
    mine = held.get(address, 0)
    over = [s for s in seats if not s.paid and counted(limits, s.address)
            and held[s.address] >= mine + 2 and s.idle >= config.share_idle_s]
    if not over:
        return None
    s = min(over, key=lambda s: (-held[s.address], -s.idle))
    return s.key, (f"session reclaimed: its address {s.address} held {held[s.address]} "
                   f"sessions of a full server while a client of an address holding "
                   f"{mine} asked: open a new session and replay")


@dataclass(slots=True)
class Meter:
    """The compute one session used, and its place in the fair queue.

    positions: positions run through the session's layers (a replay's
        positions count again: they cost again).
    forward_s: seconds of forward calls on the torch thread.
    steps: steps run (the client's and pushed ones).
    priority: sessions of a higher priority get the compute thread first
        (0 for all today; the hook for paid sessions).
    finish: the fair-queueing finish tag (`FairScheduler`), in forward seconds.
    """

    positions: int = 0
    forward_s: float = 0.0
    steps: int = 0
    priority: int = 0
    finish: float = 0.0

    def add(self, positions: int = 0, seconds: float = 0.0, steps: int = 0) -> None:
        self.positions += positions
        self.forward_s += seconds
        self.steps += steps

    def as_json(self) -> dict:
        return {"positions": self.positions, "forward_s": round(self.forward_s, 4),
                "steps": self.steps, "priority": self.priority}


@dataclass(eq=False, slots=True)
class _Waiter:
    meter: Meter  # the session's: its priority
    flow: Meter  # its client's: the finish tag and compute used that order it
    order: int  # arrival
    event: trio.Event = field(default_factory=trio.Event)
    granted: bool = False

    def key(self, now: float) -> tuple[int, float, float, int]:
        return (-self.meter.priority, max(self.flow.finish, now), self.flow.forward_s,
                self.order)


class FairScheduler:
    """Start-time fair queueing of one server's forward calls, one call at a time.

    A call waits its turn in `turn`. Each call belongs to a flow: its
    client's `Meter` (`flow_key`; a session's own meter when none is
    given). When the turn passes, among waiting calls the one with the
    highest ``Meter.priority`` goes first, then the one with the smallest
    start tag: ``max(its flow's finish tag, the tag now in service)``
    (read when the turn passes, so a flow that ran meanwhile is seen to
    have), then the one whose flow used fewer forward seconds (a decode
    step level with a heavy client's next call goes before it), then the
    earliest.
    A call's finish tag is its start tag plus the forward seconds it used,
    so a client that ran a 1 s call waits until the others have had 1 s
    too, while a client that just arrived starts level with the ones being
    served (it cannot jump the queue by being new, as it could if the key
    were the compute used since opening). With every client decoding one
    position a step, this is round robin over clients, however many
    sessions each holds.

    Holding the turn over one call only (never over a whole step) is what
    lets a long replay or chunked prefill take turns with decode steps.
    """

    def __init__(self) -> None:
        self._busy = False
        self._waiting: list[_Waiter] = []
        self._now = 0.0  # the start tag of the call in service (the virtual time)
        self._order = itertools.count()

    @property
    def waiting(self) -> int:
        """Calls waiting for their turn."""
        return len(self._waiting)

    @asynccontextmanager
    async def turn(self, meter: Meter, flow: Meter | None = None) -> AsyncIterator[None]:
        """Hold the server's compute turn for one forward call of ``meter``'s session.

        Args:
            meter: the session's meter (its priority).
            flow: its client's meter, whose finish tag and compute used
                order the call (None: ``meter`` itself).

        The caller adds the call's forward seconds to ``flow.forward_s``
        inside the block; on leaving, the flow's finish tag advances by
        them and the next waiter gets the turn.
        """
        flow = meter if flow is None else flow
        if self._busy or self._waiting:
            waiter = _Waiter(meter, flow, next(self._order))
            self._waiting.append(waiter)
            try:
                await waiter.event.wait()
            except BaseException:
                if waiter.granted:  # cancelled as the turn came: pass it on
                    self._release()
                else:
                    self._waiting.remove(waiter)
                raise
        else:
            self._busy = True
        start = self._now = max(flow.finish, self._now)
        used = flow.forward_s
        try:
            yield
        finally:
            flow.finish = start + max(flow.forward_s - used, 0.0)
            self._release()

    def _release(self) -> None:
        if not self._waiting:
            self._busy = False
            return
        waiter = min(self._waiting, key=lambda w: w.key(self._now))  # a few: a scan will do
        self._waiting.remove(waiter)  # the turn passes straight on: still busy
        waiter.granted = True
        waiter.event.set()


def remote_ip(stream: object) -> str | None:
    """The IP the client's connection comes from (None when the transport does not say).

    The muxed connection (our yamux, `node.net.yamux`) asks the secured
    connection, which asks the raw TCP socket: ``(ip, port)``.
    """
    try:
        remote = stream.muxed_conn.get_remote_address()
    except Exception:  # a transport without the call: no per-address limit for it
        return None
    return remote[0] if remote else None
