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

Whose push of a key is taken is decided when it is used, not when it
comes: the miner's chain view at a push's arrival may lag the sender's (the
block that handed the sender the unit after a timeout may not have reached
this node yet, and the view is re-read only between phases, which with an
averaging round can outlast a unit's timeout), so a push from a peer that
view does not name as the producer is kept apart, not dropped. Dropping it
lost for good the push of a unit's new assignee (the sender does not push
it again), and when every holder of a section had dropped it, none could
apply the step's update or serve the weights after it: the job stalled
until the chain gave it up (issue 27).
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
from node.net import Host, frame_deadline, read_frame, write_frame
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
        wait_s: most seconds to wait for tensors, or for a pushed frame (plus
            its size at `node.net.framing.MIN_TRANSFER_RATE`).
        push_wait_s: most seconds a phase waits for its pushes' first attempts
            (and one attempt's base limit, plus its size at that rate).
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
        # (key, sender) of the pushes kept apart: of the open step, not from its assignee
        # as this node's view had it; taken only where a wait names their sender.
        self._apart: set[tuple[Key, str]] = set()
        self.refused = 0  # pushes kept apart so far (`pnode status`'s pushes_refused)
        self.lacked: list[tuple[Key, str | None]] = []  # `missing` of the last wait that gave up
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
                the first push that came, of those not kept apart.

        Returns:
            Their tensors in the order of ``keys``; None after ``wait_s`` or
            once the tip moved.
        """
        def pick(key: Key) -> Tensors | None:
            senders = self._inbox.get(key)
            if not senders:
                return None
            want = self._wanted(key, producers)
            if want is None:
                return next((t for sender, t in senders.items()
                             if (key, sender) not in self._apart), None)
            return senders.get(want)

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
        if any(t is None for t in got):
            self.lacked = self.missing(keys, producers)
            return None
        return got

    def _wanted(self, key: Key, producers: Mapping[Key, str] | None) -> str | None:
        return producers.get(key) if producers is not None else self.producer(key)

    def missing(self, keys: list[Key], producers: Mapping[Key, str] | None = None
                ) -> list[tuple[Key, str | None]]:
        """Of ``keys``, those `wait` would not take now: (key, the peer whose push it
        waits for, None when any sender's would do)."""
        out = []
        for key in keys:
            want, senders = self._wanted(key, producers), self._inbox.get(key, {})
            if want in senders or (want is None and any(
                    (key, sender) not in self._apart for sender in senders)):
                continue
            out.append((key, want))
        return out

    def lacking(self, version: int, step: int) -> str:
        """What a miner at ``version`` waits for to run the units of ``step``, in words: the
        pushes the last wait lacked (if they are step ``version``'s update, one behind), or
        a holder's weights at ``step``."""
        words = []
        for (t, replica, what, section), peer in self.lacked:
            if t == version == step - 1:
                part = "the client part" if section == CLIENT else f"section {section}"
                sender = f"{peer} (its receipt's worker)" if peer else "any node (no receipt)"
                words.append(f"the {WHATS[what]} of {part} (replica {replica}) from {sender}")
        lacks = f"step {version}'s update lacks {', '.join(words)}; " if words else ""
        return f"{lacks}no holder sent its weights at step {step}; waiting for either"

    def deliver(self, key: Key, tensors: Tensors, sender: str, apart: bool = False) -> None:
        """Keep ``tensors`` under ``key`` as ``sender``'s (on ``device``; its first push wins).

        Each sender's push is kept apart: a unit reassigned after a timeout is
        pushed by its former assignee and by its new one, which may differ
        (a cheat), and only the chain's receipt says whose is the step's.
        ``apart``: the sender was not the key's producer in this node's view
        when it came (`receive`); only a wait that names it takes it.
        """
        senders = self._inbox.setdefault(key, {})
        if sender in senders:
            return
        senders[sender] = {n: v.to(self.device) for n, v in tensors.items()}
        if apart:
            self._apart.add((key, sender))
        self._arrived.set()

    def drop_through(self, step: int) -> None:
        """Forget the tensors of every step up to ``step`` (its update is applied)."""
        for key in [key for key in self._inbox if key[0] <= step]:
            del self._inbox[key]
        self._apart = {(key, sender) for key, sender in self._apart if key[0] > step}

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
                    # The limit scales with the frame (a SmolLM2 push is tens of MB):
                    # a flat one cut every attempt on a loaded link (issue 28 item 11).
                    with trio.fail_after(frame_deadline(self.push_wait_s, len(msg))):
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
                scores the peer (not for a `FrameTimeout`: slow is not hostile).
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
        apart = sender is not None and sender != str(peer)
        if apart:
            # Attack note: the first push of a key wins where nobody is named, so a
            # registered node that pushed another's message first would poison its
            # consumers. Kept apart, taken only where the chain names its sender
            # (module docstring: this view may be stale, and the sender may be the
            # unit's new assignee); not scored, as it may be a former assignee.
            log.info("push of %s from %s kept apart: this node's view assigns its unit "
                     "to %s", key, peer, sender)
            self.refused += 1
        self.deliver(key, tensors, str(peer), apart=apart)

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
