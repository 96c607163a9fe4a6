"""node.mine.state_sync: fetching and serving the held parts' state, without a network.

The optimizers are a small job's real `SliceAdamW`s; a stub host answers
each state request as the test's peers would.
"""

from __future__ import annotations

import pytest
import torch
import trio

from compute.data import make_model
from compute.train import make_sections
from compute.wiretensor import encode_tensor
from ledger.codec import decode, encode
from node.mine.devnet import devnet_job
from node.mine.state_sync import StateSync
from node.net import RequestError
from node.wire import CLIENT, STATE_PROTOCOL, NamedTensor, StateReply, StateRequest

JOB = b"\x07" * 32


def sections():
    config = devnet_job(2, 3, batch_size=2, seq_len=16, k=2)
    return make_sections(make_model(config), config)


def optimizers():
    secs = sections()
    return lambda s: secs.client if s == CLIENT else secs.optimizers[s]


def stepped(optimizer, s: int) -> dict[str, torch.Tensor]:
    """Part ``s`` one AdamW step on (its weights and both moments differ from a fresh one)."""
    opt = optimizer(s)
    opt.step({sl.name: torch.ones_like(t) for sl, t in zip(opt.slices, opt.targets)})
    return opt.state_dict()


def reply(version: int, tensors: dict[str, torch.Tensor]) -> bytes:
    return encode(StateReply(version, tuple(
        NamedTensor(n, encode_tensor(t)) for n, t in sorted(tensors.items()))))


class Host:
    """Peer id "me"; ``answers[(peer, section)]``: the reply bytes, or an exception."""

    def __init__(self, answers):
        self.peer_id, self.answers, self.asked = "me", answers, []

    async def request(self, peer, protocol, payload, timeout, max_response_size):
        assert protocol == STATE_PROTOCOL
        req = decode(payload, StateRequest)
        assert req.job_id == JOB
        self.asked.append((peer, req.section))
        answer = self.answers.get((peer, req.section), RequestError("no stream"))
        if isinstance(answer, Exception):
            raise answer
        return answer


def make(host, optimizer, *, registered=("a", "me"), version=3) -> StateSync:
    return StateSync(host, job_id=JOB, held=[0], optimizer=optimizer,
                     registered=lambda: registered, version=lambda: version)


def test_fits_takes_a_state_of_our_shapes_and_refuses_any_other():
    optimizer = optimizers()
    sync = make(Host({}), optimizer)
    state = stepped(optimizer, 0)
    assert sync.fits(0, state)
    assert sync.fits(0, {n: t for n, t in state.items() if "#" not in n})  # no AdamW state yet
    name = next(iter(state))
    assert not sync.fits(0, {**state, name: torch.zeros(3, 3)})  # another shape
    assert not sync.fits(0, {n: t for n, t in state.items() if n != name})  # a weight missing
    assert not sync.fits(0, {**state, "layers.9.x": torch.zeros(1)})  # not one of ours
    assert not sync.fits(1, state)  # another section's state


def test_fetch_takes_each_part_from_the_first_holder_with_a_fitting_state_at_the_step():
    source = optimizers()
    states = {s: stepped(source, s) for s in (0, CLIENT)}
    wrong = {n: t[..., :1] if t.dim() else t for n, t in states[0].items()}
    host = Host({("a", 0): reply(4, states[0]),  # another version
                 ("b", 0): reply(5, wrong),  # not our shapes
                 ("c", 0): reply(5, states[0]),
                 ("d", 0): reply(5, states[0]),  # not asked: c had it
                 ("b", CLIENT): reply(5, states[CLIENT])})  # a: no stream
    optimizer = optimizers()
    sync = make(host, optimizer)
    assert trio.run(lambda: sync.fetch(job_id=JOB, step=5, miners=("a", "b", "me"),
                                       holders=(("a", "b", "c", "me", "d"), ("c",))))
    assert host.asked == [("a", 0), ("b", 0), ("c", 0), ("a", CLIENT), ("b", CLIENT)]
    assert sync.weights_version == 5
    for s in (0, CLIENT):
        got = optimizer(s).state_dict()
        assert got.keys() == states[s].keys()
        assert all(torch.equal(got[n], states[s][n]) for n in got)


def test_fetch_changes_nothing_when_a_part_has_no_holder_to_send_it():
    source = optimizers()
    host = Host({("a", 0): reply(5, stepped(source, 0))})  # nobody sends the client part
    optimizer = optimizers()
    before = {s: optimizer(s).state_dict() for s in (0, CLIENT)}
    sync = make(host, optimizer)
    assert not trio.run(lambda: sync.fetch(job_id=JOB, step=5, miners=("a", "me"),
                                           holders=(("a", "me"), ())))
    assert sync.weights_version == 0
    for s in (0, CLIENT):
        assert all(torch.equal(optimizer(s).state_dict()[n], t) for n, t in before[s].items())


@pytest.mark.parametrize("peer, job, section, gets_state", [
    ("a", JOB, 0, True),
    ("a", JOB, CLIENT, True),
    ("a", JOB, 1, False),  # not held here
    ("a", b"\x01" * 32, 0, False),  # another job
    ("z", JOB, 0, False),  # not registered
])
def test_serve_sends_a_held_part_to_registered_nodes_only(peer, job, section, gets_state):
    optimizer = optimizers()
    sync = make(Host({}), optimizer, version=3)
    sync.weights_version = 2  # the compute thread's: a served state is at this version
    answer = decode(trio.run(sync.serve, peer, encode(StateRequest(job, section))), StateReply)
    if not gets_state:
        assert answer == StateReply(3, ())
        return
    assert answer.version == 2
    assert [t.name for t in answer.tensors] == sorted(optimizer(section).state_dict())
