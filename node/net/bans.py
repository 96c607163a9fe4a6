"""Misbehaving peers: points scored against them, bans, and the gate that refuses them.

Owns `BanMixin`, the misbehaviour half of `node.net.Host` (`penalize`,
`is_banned`, `is_trusted`), and `BanGate`, the network notifee that closes
every new connection of a banned peer (py-libp2p has no peer gate). A
banned peer is disconnected, its gossip dropped (pubsub's blacklist), its
streams reset and its connections refused for ``HostConfig.ban_seconds``.
"""

from __future__ import annotations

import logging

import trio
from libp2p.abc import INetConn, INetStream, INetwork, INotifee
from libp2p.peer.id import ID

__all__ = ["BanGate", "BanMixin"]

log = logging.getLogger(__name__)


class BanMixin:
    """Misbehaviour methods of `node.net.Host`.

    Uses the host's ``config``, ``trusted``, ``_host``, ``_pubsub`` and
    ``_nursery``, and keeps ``misbehaving`` (points per peer) and
    ``_banned`` (peer -> trio time its ban ends), which the host initialises;
    `BanGate` also counts the host's ``connections_made`` (unbanned ones).
    """

    def penalize(self, peer: ID, points: int = 1, reason: str = "") -> None:
        """Score ``points`` of misbehaviour against ``peer`` (`misbehaving`).

        At ``config.ban_threshold`` points the peer is banned: disconnected,
        its gossip dropped, its streams reset and its connections refused for
        ``config.ban_seconds``. When the ban ends its score starts from 0.
        """
        score = self.misbehaving.get(peer, 0) + points
        self.misbehaving[peer] = score
        log.warning("peer %s misbehaved (%d points): %s", peer, score, reason or "no reason given")
        if score >= self.config.ban_threshold and not self.is_banned(peer):
            self._banned[peer] = trio.current_time() + self.config.ban_seconds
            log.warning("peer %s banned for %s s", peer, self.config.ban_seconds)
            self._pubsub.blacklisted_peers.add(peer)  # drops its messages and relays
            self._drop_soon(peer)

    def is_trusted(self, peer: ID) -> bool:
        """Whether ``peer`` is on the allow-list (every peer is, without one)."""
        return self.trusted is None or peer in self.trusted

    def is_banned(self, peer: ID) -> bool:
        """Whether ``peer`` is banned now (an ended ban is lifted here)."""
        until = self._banned.get(peer)
        if until is None:
            return False
        if trio.current_time() < until:
            return True
        del self._banned[peer]
        self.misbehaving.pop(peer, None)
        self._pubsub.remove_from_blacklist(peer)
        return False

    def _drop_soon(self, peer: ID) -> None:
        """Close every connection to ``peer`` in the background."""
        if self._nursery is not None:
            self._nursery.start_soon(self._drop, peer)

    async def _drop(self, peer: ID) -> None:
        with trio.move_on_after(5.0):
            try:
                await self._host.get_network().close_peer(peer)
            except Exception as exc:
                log.debug("closing banned peer %s: %s", peer, exc)


class BanGate(INotifee):
    """Closes every new connection of a banned peer (py-libp2p has no peer gate)."""

    def __init__(self, host: BanMixin):
        self._owner = host

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        peer = conn.muxed_conn.peer_id
        if self._owner.is_banned(peer):
            log.info("refused a connection of banned peer %s", peer)
            self._owner._drop_soon(peer)
        else:  # counted here, not sampled: a short-lived connection counts too
            self._owner.connections_made += 1

    # The other events are of no interest here.
    async def disconnected(self, network: INetwork, conn: INetConn) -> None: ...
    async def opened_stream(self, network: INetwork, stream: INetStream) -> None: ...
    async def closed_stream(self, network: INetwork, stream: INetStream) -> None: ...
    async def listen(self, network: INetwork, multiaddr) -> None: ...
    async def listen_close(self, network: INetwork, multiaddr) -> None: ...
