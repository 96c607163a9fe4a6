"""The node's libp2p host: identity, transport security, streams and gossip.

Owns all use of py-libp2p 0.8.1 (ARCHITECTURE.md, the network; its traps are
listed in specs/network.md) but the identity (`node.net.identity.PeerIdentity`,
re-exported here): `open_host`, a `Host` with TCP, Noise the *only* security
protocol, pnode's yamux (`node.net.yamux.conn`), pubsub + gossipsub started
before any connection; one-frame request/response streams (`node.net.framing`)
where an error closes only that stream and scores its peer (`Host.penalize`)
unless it only shows the peer slow (a timeout: dropped, never scored).
Two parts of the host live in their own modules: gossip (`node.net.gossip`:
a size limit checked at publish, the rate limit raised, per-topic validators
that run before gossipsub relays a message) and misbehaviour
(`node.net.bans`: a peer whose score reaches ``HostConfig.ban_threshold`` is
disconnected and refused, inbound and outbound, streams and gossip, for
``ban_seconds``).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import multiaddr
import trio
from libp2p import new_host
from libp2p.abc import INetStream
from libp2p.crypto.x25519 import create_new_key_pair as create_noise_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, PROTOCOL_ID_V12, GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE, Transport as NoiseTransport
from libp2p.stream_muxer.exceptions import MuxedStreamError
from libp2p.tools.anyio_service import background_trio_service

from node.net import yamux
from node.net.framing import (
    DEFAULT_MAX_FRAME_SIZE as MAX_FRAME, FrameStreamError, FrameTimeout, FrameTooLarge,
    FramingError, frame_deadline, read_frame, write_frame,
)
from node.net.bans import BanGate, BanMixin
from node.net.gossip import GossipError, GossipMixin
from node.net.identity import HostError, PeerIdentity
from node.net.listen import check_port_free, keep_addrs_while_closing

__all__ = ["DialError", "GossipError", "Host", "HostConfig", "HostError", "LocalFault",
           "PeerIdentity", "RequestError", "RequestTimeout", "ResponseTooLarge", "open_host"]

log = logging.getLogger(__name__)

StreamHandler = Callable[[INetStream, ID], Awaitable[None]]
RequestHandler = Callable[[ID, bytes], Awaitable[bytes]]


class DialError(HostError):
    """A peer address that is malformed or could not be connected to."""


class RequestError(HostError):
    """A request that failed: no stream, a broken one, or no valid answer."""


class RequestTimeout(RequestError):
    """A request that got no answer within its timeout."""


class ResponseTooLarge(RequestError):
    """An answer longer than the requester allows (the answering peer is at fault)."""


async def _no_auto_connect() -> None:
    """Stands in for py-libp2p's `AutoConnector.maybe_connect` (see `Host.run`)."""


class LocalFault(HostError):
    """Raised by a stream handler for a fault of this node's own (a damaged store).

    The stream is reset and the peer is not scored: an honest peer asking a
    node with a broken disk must not be banned for it.
    """


@dataclass(frozen=True)
class HostConfig:
    """Tunables of the host; the defaults suit a devnet and a small swarm."""

    gossip_max_message: int = 1_000_000  # under gossipsub's 1 MiB RPC, with headroom
    redial_first_s: float = 1.0  # backoff after a failed dial in open_stream, doubling
    redial_max_s: float = 60.0
    gossip_rate_limit: float = 1000.0  # msgs/s per peer and topic (py-libp2p: 10)
    gossip_degree: tuple[int, int, int] = (6, 4, 12)  # D, D_low, D_high
    heartbeat_interval: int = 1  # seconds (py-libp2p default 120: meshes form slowly)
    dial_timeout: float = 10.0
    max_request_size: int = MAX_FRAME
    handler_timeout: float = 30.0  # base s for a request to come (+ its size at 1 MiB/s)
    subscription_buffer: int = 256  # per subscriber; a full one drops messages
    publish_backpressure: float = 5.0  # most seconds publish waits for full peer queues
    validation_timeout: float = 30.0  # for a topic validator (py-libp2p: 5 s); late = dropped
    ban_threshold: int = 10  # misbehaviour points that get a peer banned
    ban_seconds: float = 600.0  # how long a banned peer stays disconnected and refused


class Host(BanMixin, GossipMixin):
    """A running libp2p node; made by `open_host` (or `run` in a nursery)."""

    def __init__(self, identity: PeerIdentity, listen: str = "/ip4/127.0.0.1/tcp/0", *,
                 gossip_topics: Iterable[str] = (), config: HostConfig = HostConfig(),
                 trusted: Iterable[ID] | None = None):
        """
        Args:
            trusted: when given, the only peers this host dials, takes gossip
                from or serves non-public protocols to (``--trusted-peers``);
                others may still use the protocols registered ``public``.
        """
        self.identity, self.config = identity, config
        self.trusted = None if trusted is None else frozenset(trusted)
        self._listen = multiaddr.Multiaddr(listen)
        self._topics = tuple(gossip_topics)
        kp = identity.key_pair
        noise = NoiseTransport(kp, noise_privkey=create_noise_key_pair().private_key)
        # Only Noise (new_host's default adds TLS, SECIO and /plaintext/2.0.0); only
        # yamux, pnode's own (`node.net.yamux.conn`: py-libp2p's costs ~1 ms per message).
        self._host = new_host(key_pair=kp, sec_opt={NOISE: noise},
                              muxer_opt={yamux.PROTOCOL_ID: yamux.YamuxConnection})
        yamux.install(self._host)
        keep_addrs_while_closing(self._host)
        self._gossipsub = GossipSub(  # positional: degree, degree_low, degree_high
            [PROTOCOL_ID_V12, PROTOCOL_ID_V11, PROTOCOL_ID], *config.gossip_degree,
            heartbeat_interval=config.heartbeat_interval,
            max_messages_per_topic_per_second=config.gossip_rate_limit,
        )
        # Pubsub registers its notifee and stream handlers on the host here.
        self._pubsub = Pubsub(self._host, self._gossipsub,
                              validation_timeout=config.validation_timeout)
        self._host.get_network().register_notifee(BanGate(self))
        self.connections_made = 0  # connections of unbanned peers so far, both ways
        self.misbehaving: dict[ID, int] = {}  # points per peer, see `penalize`
        self._banned: dict[ID, float] = {}  # peer -> trio time its ban ends
        self._listeners: dict[str, set[trio.MemorySendChannel[tuple[ID, bytes]]]] = defaultdict(set)
        self._joined: dict[str, trio.Event] = {}
        self._validated: set[str] = set()  # topics with a validator
        self._nursery: trio.Nursery | None = None
        self._stop = trio.Event()
        self._stopped = trio.Event()
        # One scope per running stream handler: `stop` cancels them at once,
        # so a stopped host answers nothing more while its connections close.
        self._serving: set[trio.CancelScope] = set()
        # peer -> (trio time before which it is not dialled again, its current backoff)
        self._redial: dict[ID, tuple[float, float]] = {}

    async def run(self, *, task_status: trio.TaskStatus[Host] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen, serve and gossip until `stop`; reports itself started when ready.

        Pubsub and gossipsub start before the host listens, so every
        connection (inbound or outbound) finds them running.
        """
        async with background_trio_service(self._pubsub), background_trio_service(self._gossipsub):
            await self._pubsub.wait_until_ready()
            async with self._host.run([self._listen]):
                # py-libp2p's auto-connector keeps 50 to 150 connections by dialling
                # every peer its peerstore ever held, departed ones too, every 10 s
                # and on each disconnect: pnode dials whom it means to (its peers,
                # servers of a route) and backs off from the departed (`open_stream`).
                # (Its start may come after this line, so its entry point goes, not its flag.)
                self._host.get_network().auto_connector.maybe_connect = _no_auto_connect
                try:
                    async with trio.open_nursery() as nursery:
                        self._nursery = nursery
                        for topic in self._topics:
                            await self.join(topic)
                        task_status.started(self)
                        await self._stop.wait()
                        nursery.cancel_scope.cancel()
                finally:
                    self._nursery = None
                    # host.run() leaves the TCP listener (a trio *system* task)
                    # accepting: close connections and listeners explicitly.
                    with trio.move_on_after(5.0, shield=True):
                        await self._host.close()
            for channels in self._listeners.values():
                for ch in list(channels):
                    ch.close()
            self._stopped.set()

    def stop(self) -> None:
        """Ask `run` to shut down (it returns once the host is closed).

        Every stream handler still running is cancelled now (its stream is
        reset), not when the connection closes: peers see a stopped node stop.
        """
        self._stop.set()
        for scope in self._serving:
            scope.cancel()

    async def wait_stopped(self) -> None:
        """Return once `run` has closed the host (after `stop`, or a failure)."""
        await self._stopped.wait()

    @property
    def peer_id(self) -> ID:
        return self._host.get_id()

    @property
    def stopping(self) -> bool:
        """True once `stop` was called (the host is closing or closed)."""
        return self._stop.is_set()

    @property
    def addrs(self) -> list[str]:
        """Listen addresses with ``/p2p/<peer id>`` (empty before `run` and once stopping)."""
        if self.stopping:
            return []
        return [str(a) for a in self._host.get_addrs()]

    @property
    def security_protocols(self) -> list[str]:
        """The security protocol ids this host negotiates (only ``/noise``)."""
        upgrader = self._host.get_network().upgrader
        return [str(p) for p in upgrader.security_multistream.transports]

    def connected_peers(self) -> list[ID]:
        """Peers with an open connection (a banned peer's is on its way out)."""
        return [p for p in self._host.get_connected_peers() if not self.is_banned(p)]

    async def ping(self, peer: ID, timeout: float) -> float | None:
        """Seconds a yamux ping to ``peer`` took to come back; None past ``timeout``.

        A liveness probe that costs a 12-byte frame each way: a stalled peer
        keeps its connection open but does not answer.

        Raises:
            HostError: no open connection to ``peer``, or it broke meanwhile.
        """
        for conn in self._host.get_network().connections.get(peer, ()):
            muxed = conn.muxed_conn
            if isinstance(muxed, yamux.YamuxConnection) and muxed.is_established:
                try:
                    return await muxed.ping(timeout)
                except MuxedStreamError as exc:
                    raise HostError(f"ping to {peer}: {exc}") from None
        raise HostError(f"no open connection to {peer} to ping")

    async def connect(self, addr: str) -> ID:
        """Connect to the peer at a full multiaddr (``.../p2p/<id>``).

        Returns:
            The peer's id, once the connection is ready for streams.

        Raises:
            DialError: malformed address, refused, wrong identity or timeout.
        """
        try:
            info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        except Exception as exc:
            raise DialError(f"bad peer address {addr!r}: {exc}") from None
        if self.is_banned(info.peer_id):
            raise DialError(f"peer {info.peer_id} is banned for misbehaviour")
        if not self.is_trusted(info.peer_id):
            raise DialError(f"peer {info.peer_id} is not a trusted peer")
        try:
            with trio.fail_after(self.config.dial_timeout):
                await self._dial(info)
        except trio.TooSlowError:
            raise DialError(f"no connection to {addr} in {self.config.dial_timeout} s") from None
        except Exception as exc:
            raise DialError(f"cannot connect to {addr}: {exc}") from None
        return info.peer_id

    async def _dial(self, info) -> None:
        """A connection to ``info``'s one address, ready for streams, unless one is open.

        Not `BasicHost.connect`: its swarm (py-libp2p 0.8.1) gives each
        address a 250 ms happy-eyeballs head start and ends that wait early
        only on a failure or at ``max_connections_per_peer`` (3), so a dial
        that succeeds at once still took 250 ms, on the path of every new
        route's first token. One address needs no head start: it is dialled
        directly (`dial_addr`, which registers the connection as a dial does).
        """
        network = self._host.get_network()
        if network.connections.get(info.peer_id):
            await self._host.connect(info)  # waits until the open one is ready
            return
        # The swarm blocks a peer for 60 s after a failed dial, and dials the
        # first addresses it knows: drop stale ones, keep this one.
        store = self._host.get_peerstore()
        store.clear_addrs(info.peer_id)
        network.unblock_peer(info.peer_id)
        store.add_addrs(info.peer_id, info.addrs, 120)
        conn = await network.dial_addr(info.addrs[0], info.peer_id)
        started = getattr(conn, "event_started", None)
        if started is not None:
            await started.wait()

    async def open_stream(self, peer_id: ID | str, protocol_id: str) -> INetStream:
        """Open a stream to a connected (or known) peer on ``protocol_id``.

        A peer that is not connected is dialled at its known addresses; after
        a failed dial it is not dialled again for a backoff that starts at
        ``config.redial_first_s`` and doubles with each failure up to
        ``config.redial_max_s`` (a departed peer would otherwise be redialled
        by every caller, every time); a connection to it clears the backoff.

        Raises:
            RequestError: no connection (or one backing off), or the peer
                does not speak the protocol.
        """
        try:
            peer = peer_id if isinstance(peer_id, ID) else ID.from_base58(peer_id)
        except Exception as exc:
            raise RequestError(f"cannot open {protocol_id} to {peer_id}: {exc}") from None
        dialling = peer not in self._host.get_connected_peers()
        if dialling and (wait := self._redial_wait(peer)) > 0:
            raise RequestError(f"cannot open {protocol_id} to {peer}: unreachable at the last "
                               f"dial; not dialled again for {wait:.1f} s")
        try:
            stream = await self._host.new_stream(peer, [TProtocol(protocol_id)])
        except Exception as exc:
            if dialling and peer not in self._host.get_connected_peers():
                self._dial_failed(peer)
            raise RequestError(f"cannot open {protocol_id} to {peer_id}: {exc}") from None
        self._redial.pop(peer, None)
        return stream

    def _redial_wait(self, peer: ID) -> float:
        """Seconds before ``peer`` may be dialled again (0: now)."""
        at = self._redial.get(peer)
        return 0.0 if at is None else max(at[0] - trio.current_time(), 0.0)

    def _dial_failed(self, peer: ID) -> None:
        _, backoff = self._redial.get(peer, (0.0, self.config.redial_first_s / 2))
        backoff = min(2 * backoff, self.config.redial_max_s)
        self._redial[peer] = (trio.current_time() + backoff, backoff)

    def set_handler(self, protocol_id: str, handler: StreamHandler, *,
                    public: bool = False) -> None:
        """Serve ``protocol_id`` with ``handler(stream, peer_id)``.

        The stream is closed when the handler returns. If it raises, the stream
        is reset and the peer scores a point in `misbehaving` (unless the peer
        broke the stream, as a client that gave up does; or it was too slow, a
        `FrameTimeout`, ``trio.TooSlowError`` or `RequestTimeout`: slowness is
        not misbehaviour; or the handler raised `LocalFault`: the fault is this
        node's); all else carries on.
        A banned peer's stream is reset at once; so is an untrusted peer's
        unless the protocol is ``public`` (what clients use).
        """
        async def dispatch(stream: INetStream) -> None:
            peer = stream.muxed_conn.peer_id
            if (self._stop.is_set() or self.is_banned(peer)
                    or not (public or self.is_trusted(peer))):
                await _quietly(stream.reset)
                return
            with trio.CancelScope() as scope:
                self._serving.add(scope)
                try:
                    await handle(stream, peer)
                finally:
                    self._serving.discard(scope)
            if scope.cancelled_caught:  # the host is stopping
                await _quietly(stream.reset)

        async def handle(stream: INetStream, peer: ID) -> None:
            try:
                await handler(stream, peer)
            except FrameStreamError as exc:
                log.debug("%s stream from %s broke: %s", protocol_id, peer, exc)
                await _quietly(stream.reset)
            except LocalFault as exc:
                log.debug("%s stream from %s not served: %s", protocol_id, peer, exc)
                await _quietly(stream.reset)
            except (FrameTimeout, trio.TooSlowError, RequestTimeout) as exc:
                # Attack note: not scoring a stall lets a peer hold a stream for the
                # frame's time limit, which its max size bounds; scoring it banned honest
                # peers on a loaded machine (issue 28 item 11). It loses the stream.
                log.info("%s stream from %s dropped, too slow: %s", protocol_id, peer, exc)
                await _quietly(stream.reset)
            except Exception as exc:
                self.penalize(peer, 1, f"{protocol_id} stream: {type(exc).__name__}: {exc}")
                await _quietly(stream.reset)
            else:
                await _quietly(stream.close)

        self._host.set_stream_handler(TProtocol(protocol_id), dispatch)

    def set_request_handler(self, protocol_id: str, handler: RequestHandler, *,
                            max_request_size: int | None = None, public: bool = False) -> None:
        """Serve one-frame requests with ``await handler(peer_id, request) -> response``.

        Malformed, oversize or truncated requests reset the stream and count
        as misbehaviour (see `set_handler`); a late one (``config.handler_timeout``
        plus its size at `MIN_TRANSFER_RATE`) resets it unscored.
        """
        limit = max_request_size or self.config.max_request_size

        async def serve(stream: INetStream, peer: ID) -> None:
            request = await read_frame(stream, limit, timeout=self.config.handler_timeout)
            await write_frame(stream, await handler(peer, request),
                              timeout=self.config.handler_timeout)

        self.set_handler(protocol_id, serve, public=public)

    async def request(self, peer_id: ID | str, protocol_id: str, payload: bytes,
                      timeout: float = 30.0, *, max_response_size: int = MAX_FRAME) -> bytes:
        """Send one frame on a new stream and return the one frame answered.

        Args:
            timeout: base seconds for it all (dial, request, answer); the
                request's and the answer's sizes each add their time at
                `MIN_TRANSFER_RATE` (`frame_deadline`), so a large answer over
                a slow link is not cut at a flat limit.

        Raises:
            RequestTimeout: no answer within that time.
            ResponseTooLarge: an answer over ``max_response_size``.
            RequestError: no stream, the peer closed it without an answer, or a
                malformed answer.
        """
        stream: INetStream | None = None
        deadline = trio.current_time() + frame_deadline(timeout, len(payload))
        try:
            with trio.fail_after(deadline - trio.current_time()):
                stream = await self.open_stream(peer_id, protocol_id)
                await write_frame(stream, payload)
            # Outside that scope: read_frame extends the time left by the answer's size.
            response = await read_frame(stream, max_response_size,
                                        timeout=max(deadline - trio.current_time(), 0.0))
        except (trio.TooSlowError, FrameTimeout) as exc:
            if stream is not None:
                await _quietly(stream.reset)
            raise RequestTimeout(f"{protocol_id} to {peer_id}: no answer in time (base "
                                 f"{timeout} s): {exc or 'request not sent'}") from None
        except FramingError as exc:
            if stream is not None:
                await _quietly(stream.reset)
            error = ResponseTooLarge if isinstance(exc, FrameTooLarge) else RequestError
            raise error(f"{protocol_id} to {peer_id}: {exc}") from None
        await _quietly(stream.close)
        return response


@asynccontextmanager
async def open_host(identity: PeerIdentity, listen: str = "/ip4/127.0.0.1/tcp/0", *,
                    gossip_topics: Iterable[str] = (), config: HostConfig = HostConfig(),
                    trusted: Iterable[ID] | None = None) -> AsyncIterator[Host]:
    """Run a `Host` for the duration of the block (arguments as `Host`).

    Yields:
        The host, listening, with pubsub running and ``gossip_topics`` joined.

    Raises:
        AddressInUse: the listen port is taken (checked before anything starts:
            py-libp2p's listener would share it).
    """
    host = Host(identity, listen, gossip_topics=gossip_topics, config=config, trusted=trusted)
    check_port_free(host._listen)
    failure: Exception | None = None
    async with trio.open_nursery() as nursery:
        await nursery.start(host.run)
        try:
            yield host
        except Exception as exc:  # re-raised below, not wrapped in an ExceptionGroup
            failure = exc
        finally:
            host.stop()
            nursery.cancel_scope.deadline = trio.current_time() + 10.0  # a stuck close
    if failure is not None:
        raise failure


async def _quietly(action: Callable[[], Awaitable[None]]) -> None:
    """Close or reset a stream, ignoring a stream that is already gone."""
    with trio.move_on_after(2.0, shield=True):
        try:
            await action()
        except Exception as exc:
            log.debug("stream cleanup: %s", exc)
