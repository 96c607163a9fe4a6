"""node.mine.transfer: the step tensors' inbox, pushes and checks, without a network.

A stub host (its peer id, streams that record what is written) and a stub
chain tip stand in for the node; trio's MockClock runs the waits and the
retries in no real time.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import trio
import trio.testing

from compute.wiretensor import encode_tensor
from ledger.codec import decode, encode
from node.errors import BadPush
from node.mine.transfer import Transfer
from node.net import write_frame
from node.wire import (
    ACTIVATION, CLIENT, GRADIENT, HEAD_GRADS, SECTION_GRADS, NamedTensor, StepTensors,
)

JOB = b"\x07" * 32
SHAPE = (2, 3)


class Stream:
    """A byte stream in memory: what is written can be read back."""

    def __init__(self, data: bytes = b""):
        self.data = bytearray(data)
        self.closed = False

    async def write(self, data: bytes) -> None:
        self.data += data

    async def read(self, n: int) -> bytes:
        chunk, self.data = bytes(self.data[:n]), self.data[n:]
        return chunk

    async def close(self) -> None:
        self.closed = True


class Unread:
    """A stream that must not be read."""

    async def read(self, n: int) -> bytes:
        raise AssertionError("read")


class Host:
    """Peer id "me"; a stream per push, or ``refuse`` set: every dial fails."""

    def __init__(self, refuse: bool = False):
        self.peer_id, self.refuse = "me", refuse
        self.opened: list[tuple[str, Stream]] = []

    async def open_stream(self, peer: str, protocol: str) -> Stream:
        if self.refuse:
            raise OSError("connection refused")
        self.opened.append((peer, Stream()))
        return self.opened[-1][1]


class Tip:
    """The chain's tip, moved by hand."""

    def __init__(self):
        self.tip, self._moved = b"a", trio.Event()

    async def wait_tip_change(self, tip: bytes) -> None:
        while self.tip == tip:
            await self._moved.wait()

    def move(self, tip: bytes) -> None:
        self.tip = tip
        self._moved.set()
        self._moved = trio.Event()


def run(test, **kw):
    """``test(transfer, tip, host)`` in a trio run with an autojumping clock."""
    clock = trio.testing.MockClock(autojump_threshold=0)

    async def main():
        tip, host = Tip(), kw.pop("host", Host())
        state = SimpleNamespace(registered=("a", "me"), version=0)
        async with trio.open_nursery() as nursery:
            transfer = Transfer(
                host, nursery, job_id=JOB, replicas=2,
                expected=lambda what, section: {"h": SHAPE},
                registered=lambda: state.registered, version=lambda: state.version,
                wait_tip_change=tip.wait_tip_change, wait_s=10.0, **kw)
            transfer.state = state  # the test's handle on what the callables read
            await test(transfer, tip, host)
    trio.run(main, clock=clock)


def key(step: int, section: int = 1) -> tuple[int, int, int, int]:
    return (step, 0, ACTIVATION, section)


def test_wait_returns_the_tensors_in_order_once_all_are_delivered():
    async def test(transfer, tip, host):
        async def deliver_later():
            await trio.sleep(1)
            transfer.deliver(key(0, 2), {"h": torch.full(SHAPE, 2.0)}, "a")
            await trio.sleep(1)
            transfer.deliver(key(0, 1), {"h": torch.ones(SHAPE)}, "a")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(deliver_later)
            got = await transfer.wait([key(0, 1), key(0, 2)], tip.tip)
        assert trio.current_time() == 2
        assert [float(g["h"][0, 0]) for g in got] == [1.0, 2.0]
    run(test)


def test_wait_takes_the_push_of_the_unit_s_worker_when_two_nodes_pushed_it():
    """A unit reassigned after a timeout is pushed by both assignees; a closed step's
    update takes the push of the worker whose receipt the chain holds, whichever came
    first, and waits for it when only the other's is here."""
    assignee = {}

    async def test(transfer, tip, host):
        transfer.deliver(key(0), {"h": torch.full(SHAPE, 9.0)}, "a")  # the former assignee
        transfer.deliver(key(0), {"h": torch.full(SHAPE, 7.0)}, "a")  # its first push stays
        first, = await transfer.wait([key(0)])  # nobody named: the first push that came
        assert float(first["h"][0, 0]) == 9.0 and trio.current_time() == 0
        assert await transfer.wait([key(0)], producers={key(0): "b"}) is None
        assert trio.current_time() == 10  # b's push is not here: no other taken instead
        transfer.deliver(key(0), {"h": torch.ones(SHAPE)}, "b")  # the receipt's worker
        assignee[key(0)] = "a"  # the open step's assignee, by default
        got, = await transfer.wait([key(0)])
        assert float(got["h"][0, 0]) == 9.0
        got, = await transfer.wait([key(0)], producers={key(0): "b"})
        assert float(got["h"][0, 0]) == 1.0
    run(test, producer=lambda k: assignee.get(k))


def test_wait_gives_up_after_wait_s_or_when_the_tip_moves():
    async def test(transfer, tip, host):
        transfer.deliver(key(0), {"h": torch.ones(SHAPE)}, "a")
        assert await transfer.wait([key(0), key(1)]) is None
        assert trio.current_time() == 10  # wait_s

        async def move_later():
            await trio.sleep(3)
            tip.move(b"b")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(move_later)
            assert await transfer.wait([key(1)], tip.tip) is None
        assert trio.current_time() == 13  # the tip moved: no waiting out wait_s
        assert await transfer.wait([key(0)], tip.tip) is not None  # all here: no wait at all
        assert trio.current_time() == 13
    run(test)


def test_a_senders_first_delivery_of_a_key_wins_and_drop_through_forgets_old_steps():
    async def test(transfer, tip, host):
        transfer.deliver(key(0), {"h": torch.ones(SHAPE)}, "a")
        transfer.deliver(key(0), {"h": torch.zeros(SHAPE)}, "a")
        [got] = await transfer.wait([key(0)], producers={key(0): "a"})
        assert torch.equal(got["h"], torch.ones(SHAPE))
        for step in range(4):
            transfer.deliver(key(step, 2), {"h": torch.ones(SHAPE)}, "b")
        transfer.drop_through(1)
        assert [step for step in range(4) if key(step, 2) in transfer] == [2, 3]
        assert key(0) not in transfer
    run(test)


def test_push_all_delivers_here_at_once_and_frames_the_rest_for_each_peer():
    async def test(transfer, tip, host):
        pushes = [((1,), key(0), {"h": torch.ones(SHAPE)}),
                  (CLIENT, (0, 0, GRADIENT, CLIENT), {"g": torch.zeros(SHAPE)})]
        await transfer.push_all(pushes, job_id=JOB, miners=("b", "c", "me"),
                                holders=(("b",), ("b", "me")))
        assert key(0) in transfer and (0, 0, GRADIENT, CLIENT) in transfer
        assert all(stream.closed for _, stream in host.opened)
        # The pushes run as background tasks, in any order.
        got = sorted((peer, m.what, m.section, [t.name for t in m.tensors], m.job_id, m.step)
                     for peer, m in ((peer, decode(bytes(stream.data[4:]), StepTensors))
                                     for peer, stream in host.opened))
        assert got == [("b", ACTIVATION, 1, ["h"], JOB, 0), ("b", GRADIENT, CLIENT, ["g"], JOB, 0),
                       ("c", GRADIENT, CLIENT, ["g"], JOB, 0)]
    run(test)


def test_a_refused_push_is_retried_in_the_background_until_push_retry_s():
    attempts = []

    async def test(transfer, tip, host):
        async def refuse(peer, protocol):
            attempts.append(trio.current_time())
            raise OSError("connection refused")

        host.open_stream = refuse
        await transfer.push_all([((0,), key(0), {"h": torch.ones(SHAPE)})], job_id=JOB,
                                miners=("b", "me"), holders=(("b",),))
        assert trio.current_time() == 0  # the first attempt ended: no waiting out push_wait_s
    run(test, push_retry_s=2.0)
    assert attempts == [0.0, 0.5, 1.0, 1.5]  # then given up (the run's nursery could end)


async def push_frame(msg: StepTensors) -> Stream:
    stream = Stream()
    await write_frame(stream, encode(msg))
    return stream


def step_tensors(step=0, replica=0, job=JOB, **named) -> StepTensors:
    named = named or {"h": torch.ones(SHAPE)}
    return StepTensors(job, step, replica, ACTIVATION, 1, tuple(
        NamedTensor(n, encode_tensor(v)) for n, v in named.items()))


def test_receive_keeps_a_good_push_and_drops_strangers_other_jobs_and_stale_steps():
    async def test(transfer, tip, host):
        await transfer.receive(Unread(), "z")  # not registered: nothing read
        await transfer.receive(await push_frame(step_tensors(job=b"\x01" * 32)), "a")
        transfer.state.version = 2
        await transfer.receive(await push_frame(step_tensors(step=1)), "a")  # stale
        await transfer.receive(await push_frame(step_tensors(step=5)), "a")  # far ahead
        assert not any(key(step) in transfer for step in range(6))
        await transfer.receive(await push_frame(step_tensors(step=4)), "a")
        assert key(4) in transfer
    run(test)


def test_only_the_assignee_of_the_producing_unit_may_push_a_key():
    """A registered node pushing another's message first would poison it (first push wins):
    its push is kept apart, and taken only where the chain names its sender."""
    assignee = {key(0): "a"}  # the chain gave key(0)'s producing unit to "a"; others unknown

    async def test(transfer, tip, host):
        transfer.state.registered = ("a", "b", "me")
        await transfer.receive(await push_frame(step_tensors(h=torch.full(SHAPE, 9.0))), "b")
        assert transfer.refused == 1  # "b" is not its producer: kept apart
        assert await transfer.wait([key(0)]) is None  # the open step's wait: a's, not b's
        assert transfer.lacked == [(key(0), "a")]
        assert await transfer.wait([key(0)], producers={}) is None  # nobody named: not b's
        assert transfer.lacked == [(key(0), None)]
        await transfer.receive(await push_frame(step_tensors()), "a")
        got, = await transfer.wait([key(0)])
        assert torch.equal(got["h"], torch.ones(SHAPE))
        got, = await transfer.wait([key(0)], producers={})  # the first not kept apart: a's
        assert torch.equal(got["h"], torch.ones(SHAPE))
        await transfer.receive(await push_frame(step_tensors(step=1)), "b")
        assert key(1) in transfer  # the chain does not say (not the open step): taken
        assert transfer.refused == 1
    run(test, producer=lambda k: assignee.get(k))


def test_a_new_assignees_push_that_a_stale_view_did_not_name_is_the_steps_update():
    """Issue 27. The unit producing key(0) timed out and the chain gave it to "b", but
    this node's view (read before a long phase or averaging round) still names "a" when
    b's push comes. The chain includes b's receipt and closes the step: its update takes
    b's push. (Dropped, it was lost for good: b never pushes it again, and a node whose
    every fellow holder dropped it too waited for an update nobody could give.)"""
    assignee = {key(0): "a"}

    async def test(transfer, tip, host):
        transfer.state.registered = ("a", "b", "me")
        await transfer.receive(await push_frame(step_tensors(h=torch.full(SHAPE, 3.0))), "b")
        assignee.clear()  # the step closed: the chain no longer lists its assignments
        got = await transfer.wait([key(0)], producers={key(0): "b"})  # b's receipt
        assert got is not None and torch.equal(got[0]["h"], torch.full(SHAPE, 3.0))
        assert trio.current_time() == 0  # no waiting: it was here
    run(test, producer=lambda k: assignee.get(k))


def test_a_wait_that_gave_up_says_what_it_lacks_and_from_whom():
    async def test(transfer, tip, host):
        transfer.deliver(key(0, 1), {"h": torch.ones(SHAPE)}, "a")
        grads = (0, 1, SECTION_GRADS, 0)
        head = (0, 0, HEAD_GRADS, CLIENT)
        assert await transfer.wait([key(0, 1), grads, head], producers={grads: "b"}) is None
        assert transfer.lacked == [(grads, "b"), (head, None)]
        assert transfer.lacking(0, 1) == (
            "step 0's update lacks the section grads of section 0 (replica 1) from b (its "
            "receipt's worker), the head grads of the client part (replica 0) from any node "
            "(no receipt); no holder sent its weights at step 1; waiting for either")
        # Further behind, or the wait was not this update's: a holder's state alone.
        assert transfer.lacking(0, 2) == "no holder sent its weights at step 2; waiting for either"
        assert transfer.lacking(1, 2) == "no holder sent its weights at step 2; waiting for either"
    run(test)


@pytest.mark.parametrize("msg, why", [
    (step_tensors(replica=2), "replica 2"),
    (step_tensors(x=torch.ones(SHAPE)), "unexpected tensor 'x'"),
    (step_tensors(h=torch.ones(3, 2)), "expected (2, 3) float32"),
    (step_tensors(h=torch.ones(SHAPE), g=torch.ones(SHAPE)), "unexpected tensor 'g'"),
    (StepTensors(JOB, 0, 0, ACTIVATION, 1, ()), "lacks ['h']"),
    (StepTensors(JOB, 0, 0, ACTIVATION, 1, (NamedTensor("h", b"junk"),)), "bad tensor 'h'"),
])
def test_receive_raises_bad_push_for_a_malformed_push(msg, why):
    async def test(transfer, tip, host):
        with pytest.raises(BadPush) as info:
            await transfer.receive(await push_frame(msg), "a")
        assert why in str(info.value)
        assert key(0) not in transfer
    run(test)
