"""Mining: moving a step's tensors between the nodes that compute and consume them.

Owns `Transfer`: the inbox of the step tensors this node has (computed here
or pushed by others, by `Key`), the pushes of what a phase produced to
every node that could need it (`TRAIN_PROTOCOL`, retried in the background
while the consumer is down or not yet mining), and the checks on what other
nodes push here (`node.wire.train`'s `StepTensors`: job, step, replica,
names, shapes), which raise `BadPush` so that the host scores the pusher.

What it needs of the miner comes in through its constructor: the job's id,
replica count and expected shapes are fixed once the miner is set up; the
registered nodes and the miner's version change and are read through
callables.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence

import torch
import trio
from libp2p.abc import INetStream
from libp2p.peer.id import ID

from compute.wiretensor import WireTensorError, decode_tensor, encode_tensor
from ledger.codec import decode, encode
from node.errors import BadPush
from proof_of_learning.errors import NoSuchPush
from proof_of_learning.phases import Key, Push, Tensors
from node.net import Host, read_frame, write_frame
from node.wire import CLIENT, MAX_TRAIN_FRAME, TRAIN_PROTOCOL, WHATS, NamedTensor, StepTensors

log = logging.getLogger(__name__)

__all__ = ["Transfer"]


class Transfer:
    """The step tensors of one job: kept, pushed and received (module docstring).

    Args:
        host: this node's host (its peer id; the streams of the pushes).
        background: where pushes still being retried run (outlives a phase).
        job_id: the job whose tensors are accepted.
        replicas: the job's data-parallel replicas.
        expected: ``(what, section) -> {name: shape}`` a push must carry
            exactly (`StepPlan.expected`; raises `BadPush` for no such push).
        registered: the peer ids of the registered nodes as the miner's
            current chain view has them, or None before its first look.
        producer: the peer id the chain assigned the unit that pushes a
            message (by its key), or None when the chain no longer (or not
            yet) says: only that node's push of the key is taken.
        version: the updates the miner has applied (what steps it may use).
        wait_tip_change: returns once the chain's tip is no longer the one given.
        device: where the kept tensors live.
        wait_s: most seconds to wait for tensors, or for a pushed frame.
        push_wait_s: most seconds a phase waits for its pushes' first attempts
            (and one attempt's limit).
        push_retry_s: how long a push goes on being retried.
    """

    def __init__(self, host: Host, background: trio.Nursery, *, job_id: bytes, replicas: int,
                 expected: Callable[[int, int], dict[str, tuple[int, ...]]],
                 registered: Callable[[], Collection[str] | None],
                 version: Callable[[], int],
                 producer: Callable[[Key], str | None] = lambda key: None,
                 wait_tip_change: Callable[[bytes], Awaitable[None]],
                 device: torch.device | str = "cpu", wait_s: float = 20.0,
                 push_wait_s: float = 5.0, push_retry_s: float = 60.0):
        self.host, self.background = host, background
        self.me = str(host.peer_id)
        self.job_id, self.replicas, self.expected = job_id, replicas, expected
        self.registered, self.version, self.wait_tip_change = registered, version, wait_tip_change
        self.producer = producer
        self.device, self.wait_s = torch.device(device), wait_s
        self.push_wait_s, self.push_retry_s = push_wait_s, push_retry_s
        self._inbox: dict[Key, dict[str, Tensors]] = {}  # key -> sender -> its tensors
        self.refused = 0  # pushes dropped so far: of the open step, not from its assignee
        self._arrived = trio.Event()

    # -- the inbox ----------------------------------------------------------------------

    def __contains__(self, key: Key) -> bool:
        return key in self._inbox

    async def wait(self, keys: list[Key], tip: bytes | None = None,
                   producers: Mapping[Key, str] | None = None) -> list[Tensors] | None:
        """The tensors of ``keys`` once all are here, each from its unit's assignee.

        Args:
            keys: what to wait for.
            tip: given, stop waiting as soon as the chain's tip is another one
                while some are still missing: a unit waiting for inputs must not
                keep this node from the units the new tip hands it.
            producers: the peer whose push of a key is taken (a closed step's
                workers, as its receipts name them); default: ``producer``,
                the open step's current assignees. A key neither names takes
                the first push that came.

        Returns:
            Their tensors in the order of ``keys``; None after ``wait_s`` or
            once the tip moved.
        """
        def pick(key: Key) -> Tensors | None:
            senders = self._inbox.get(key)
            if not senders:
                return None
            want = producers.get(key) if producers is not None else self.producer(key)
            return next(iter(senders.values())) if want is None else senders.get(want)

        async def tip_moved(cancel_scope: trio.CancelScope) -> None:
            await self.wait_tip_change(tip)
            cancel_scope.cancel()

        with trio.move_on_after(self.wait_s):
            async with trio.open_nursery() as nursery:
                if tip is not None:
                    nursery.start_soon(tip_moved, nursery.cancel_scope)
                while any(pick(key) is None for key in keys):
                    self._arrived = trio.Event()
                    await self._arrived.wait()
                nursery.cancel_scope.cancel()
        got = [pick(key) for key in keys]
        return None if any(t is None for t in got) else got

    def deliver(self, key: Key, tensors: Tensors, sender: str) -> None:
        """Keep ``tensors`` under ``key`` as ``sender``'s (on ``device``; its first push wins).

        Each sender's push is kept apart: a unit reassigned after a timeout is
        pushed by its former assignee and by its new one, which may differ
        (a cheat), and only the chain's receipt says whose is the step's.
        """
        self._inbox.setdefault(key, {}).setdefault(
            sender, {n: v.to(self.device) for n, v in tensors.items()})
        self._arrived.set()

    def drop_through(self, step: int) -> None:
        """Forget the tensors of every step up to ``step`` (its update is applied)."""
        for key in [key for key in self._inbox if key[0] <= step]:
            del self._inbox[key]

    # -- pushes -------------------------------------------------------------------------

    async def push_all(self, pushes: Iterable[Push], *, job_id: bytes,
                       miners: Sequence[str], holders: Sequence[Sequence[str]]) -> None:
        """Deliver each push to its group: this node at once, the others over the network.

        Waits for every push's first attempt, ``push_wait_s`` at most: a push
        to a node that is down or not yet mining goes on being retried in the
        background for ``push_retry_s``, and a dead holder (its dial refused
        at once) costs the others no wait.

        Args:
            pushes: (group, key, tensors), the group some sections (their
                holders) or `CLIENT` (every miner), the key (step, replica,
                what, section).
            job_id, miners, holders: the chain view the pushes were computed
                under: the job, every registered node, each section's holders.

        Raises:
            WireTensorError: a tensor is not finite (nothing more is pushed).
        """
        sent: list[trio.Event] = []
        for group, key, tensors in pushes:
            t, replica, what, section = key
            peers = miners if group == CLIENT else sorted(
                {p for s in group for p in holders[s]})
            msg = None
            for peer in peers:
                if peer == self.me:
                    self.deliver(key, tensors, self.me)
                    continue
                if msg is None:
                    msg = encode(StepTensors(job_id, t, replica, what, section, tuple(
                        NamedTensor(n, encode_tensor(v.detach().contiguous()))
                        for n, v in sorted(tensors.items()))))
                sent.append(trio.Event())
                self.background.start_soon(self._push, peer, msg, WHATS[what], t, sent[-1])
        with trio.move_on_after(self.push_wait_s):
            for event in sent:
                await event.wait()

    async def _push(self, peer: str, msg: bytes, what: str, step: int, sent: trio.Event
                    ) -> None:
        """Push one frame to ``peer``, trying again until ``push_retry_s`` has passed.

        ``sent`` is set once the first attempt has ended, delivered or not.
        """
        with trio.move_on_after(self.push_retry_s):
            while True:
                try:
                    with trio.fail_after(self.push_wait_s):
                        stream = await self.host.open_stream(peer, TRAIN_PROTOCOL)
                        await write_frame(stream, msg)
                        await stream.close()
                    sent.set()
                    return
                except Exception as exc:
                    # Anything a dying or reset stream raises: a push never stops the miner.
                    log.debug("push of %s (step %d) to %s: %s; trying again", what, step,
                              peer, exc)
                sent.set()
                await trio.sleep(0.5)
        log.info("push of %s (step %d) to %s given up", what, step, peer)

    # -- what others push ---------------------------------------------------------------

    async def receive(self, stream: INetStream, peer: ID) -> None:
        """The `TRAIN_PROTOCOL` handler: a pushed `StepTensors`, checked, then kept until used.

        Raises:
            BadPush, DecodeError, FramingError: the host resets the stream and
                scores the peer.
        """
        registered = self.registered()
        if registered is None or str(peer) not in registered:
            # Not a holder as far as this node's (possibly stale) view goes: read
            # nothing, score nothing; the stream closes and the sender retries.
            return
        msg = decode(await read_frame(stream, MAX_TRAIN_FRAME, timeout=self.wait_s), StepTensors,
                     max_size=MAX_TRAIN_FRAME)
        if msg.job_id != self.job_id:
            return  # not mining that job: nothing to keep
        version = self.version()
        if msg.step < version or msg.step > version + 2:
            return  # stale or far ahead: dropped, not an offence
        key = (msg.step, msg.replica, msg.what, msg.section)
        tensors = self.check(msg)
        sender = self.producer(key)
        if sender is not None and sender != str(peer):
            # Attack note: the first push of a key wins, so a registered node that
            # pushed another's message first would poison its consumers. Only the
            # assignee's is taken; not scored, as the sender may be a former
            # assignee whose unit was reassigned after a timeout.
            log.info("push of %s from %s dropped: the chain assigned its unit to %s",
                     key, peer, sender)
            self.refused += 1
            return
        self.deliver(key, tensors, str(peer))

    def check(self, msg: StepTensors) -> Tensors:
        """The tensors of a push of this job, decoded.

        Raises:
            BadPush: a replica the job lacks, a tensor the push should not
                carry (or twice), one that does not decode or has another
                shape or dtype, or one missing.
        """
        if msg.replica >= self.replicas:
            raise BadPush(f"replica {msg.replica} of a job with {self.replicas}")
        try:
            expect = self.expected(msg.what, msg.section)
        except NoSuchPush as exc:
            raise BadPush(str(exc)) from None
        tensors = {}
        for item in msg.tensors:
            shape = expect.get(item.name)
            if shape is None or item.name in tensors:
                raise BadPush(f"unexpected tensor {item.name!r} in a {WHATS[msg.what]} push")
            try:
                value = decode_tensor(item.data, max(1, math.prod(shape)))
            except WireTensorError as exc:
                raise BadPush(f"bad tensor {item.name!r}: {exc}") from None
            if tuple(value.shape) != shape or value.dtype != torch.float32:
                raise BadPush(f"{item.name!r}: expected {shape} float32, got "
                              f"{tuple(value.shape)} {value.dtype}")
            tensors[item.name] = value
        if set(tensors) != set(expect):
            raise BadPush(f"{WHATS[msg.what]} lacks {sorted(set(expect) - set(tensors))}")
        return tensors
