"""The host's gossip: topics joined, subscribed, published and validated (gossipsub).

Owns `GossipMixin`, the gossip half of `node.net.Host`: py-libp2p's pubsub
and gossipsub are made and run by the host (they must start before any
connection); this part joins topics, fans each subscription out to
`subscribe` channels, bounds what a publish may send and how fast, and
runs a topic's validator before gossipsub delivers or relays a message.
Trust and bans are the host's (`Host.is_trusted`, `Host.is_banned`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import trio
from libp2p.peer.id import ID

from node.net.identity import HostError

__all__ = ["GossipError", "GossipMixin", "GossipValidator"]

log = logging.getLogger(__name__)
_QUEUE_HIGH_WATER = 8  # of py-libp2p's 32-RPC per-peer outbound gossip queue

#: ``await validator(origin, data, forwarder) -> relay?`` of one gossip topic.
GossipValidator = Callable[[ID, bytes, ID], Awaitable[bool]]


class GossipError(HostError):
    """A publish refused: too large for gossipsub, or the host not running."""


class GossipMixin:
    """Gossip methods of `node.net.Host`, on the pubsub the host made and runs.

    Uses the host's ``_pubsub``, ``_gossipsub``, ``_nursery``, ``config``,
    ``trusted``, ``peer_id``, ``is_trusted`` and ``is_banned``, and keeps
    ``_listeners`` (topic -> subscribe channels), ``_joined`` (topic -> set
    once joined) and ``_validated`` (topics with a validator), which the
    host initialises.
    """

    async def join(self, topic: str) -> None:
        """Subscribe this host to ``topic`` (idempotent)."""
        if topic in self._joined:
            await self._joined[topic].wait()
            return
        if self._nursery is None:
            raise GossipError("the host is not running")
        self._joined[topic] = joined = trio.Event()
        if self.trusted is not None and topic not in self._validated:
            self.set_validator(topic, _accept)  # its wrapper drops untrusted gossip
        subscription = await self._pubsub.subscribe(topic)
        self._nursery.start_soon(self._pump, topic, subscription)
        joined.set()

    def subscribe(self, topic: str) -> trio.MemoryReceiveChannel[tuple[ID, bytes]]:
        """A new channel of ``topic``'s messages as ``(origin peer id, data)``.

        Joins the topic (in the background) if need be. Messages this host
        published are left out; a subscriber ``config.subscription_buffer``
        messages behind loses the next ones. Close the channel when done.

        Raises:
            GossipError: the host is not running.
        """
        if self._nursery is None:
            raise GossipError("the host is not running")
        send, receive = trio.open_memory_channel[tuple[ID, bytes]](self.config.subscription_buffer)
        self._listeners[topic].add(send)
        if topic not in self._joined:
            self._nursery.start_soon(self.join, topic)
        return receive

    async def publish(self, topic: str, data: bytes) -> None:
        """Gossip ``data`` on ``topic`` (subscribed or not).

        Waits (up to ``config.publish_backpressure`` s) while a peer's outbound
        queue fills: py-libp2p's holds 32 RPCs and silently drops the rest.

        Raises:
            GossipError: ``data`` is over ``config.gossip_max_message`` bytes
                (send it over a stream instead), or the host is not running.
        """
        if len(data) > self.config.gossip_max_message:
            raise GossipError(f"{len(data)}-byte gossip message exceeds "
                              f"{self.config.gossip_max_message} bytes: use a stream")
        if self._nursery is None:
            raise GossipError("the host is not running")
        with trio.move_on_after(self.config.publish_backpressure):
            while any(len(q) >= _QUEUE_HIGH_WATER for q in self._pubsub.peer_queues.values()):
                await trio.sleep(0.001)
        await self._pubsub.publish(topic, bytes(data))

    def set_validator(self, topic: str, validator: GossipValidator | None) -> None:
        """Check ``topic``'s messages before gossipsub delivers or relays them.

        ``await validator(origin, data, forwarder)`` runs for every message
        heard on the topic (``origin``: its signed author; ``forwarder``: the
        neighbour it came from); only if it returns True is the message
        relayed to the mesh and handed to `subscribe` channels. It is not run
        for this host's own publishes (the publisher checked them). A message
        from or through a banned peer, a validator that raises, or one slower
        than ``config.validation_timeout`` counts as False. One validator per
        topic; None removes it.
        """
        if validator is None:
            self._validated.discard(topic)
            self._pubsub.remove_topic_validator(topic)
            return
        self._validated.add(topic)
        me = self.peer_id

        async def check(forwarder: ID, msg) -> bool:
            if forwarder == me:
                return True
            origin = ID(msg.from_id)
            if self.is_banned(origin) or self.is_banned(forwarder):
                return False
            if not (self.is_trusted(origin) and self.is_trusted(forwarder)):
                return False
            try:
                return bool(await validator(origin, bytes(msg.data), forwarder))
            except Exception as exc:
                log.warning("validator of %s failed on a message from %s: %s: %s",
                            topic, origin, type(exc).__name__, exc)
                return False

        self._pubsub.set_topic_validator(topic, check, True)

    def mesh_peers(self, topic: str) -> set[ID]:
        """The peers in this host's gossipsub mesh for ``topic``."""
        return set(self._gossipsub.mesh.get(topic, ()))

    def topic_peers(self, topic: str) -> set[ID]:
        """The connected peers known to be subscribed to ``topic``."""
        return set(self._pubsub.peer_topics.get(topic, ()))

    async def _pump(self, topic: str, subscription: AsyncIterator) -> None:
        """Fan one pubsub subscription out to every `subscribe` channel of the topic."""
        me = self.peer_id.to_bytes()
        async for msg in subscription:
            if msg.from_id == me:
                continue
            item = (ID(msg.from_id), msg.data)
            for ch in list(self._listeners[topic]):
                try:
                    ch.send_nowait(item)
                except trio.WouldBlock:
                    log.warning("subscriber of %s is full: dropped a message", topic)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._listeners[topic].discard(ch)


async def _accept(origin: ID, data: bytes, forwarder: ID) -> bool:
    return True
