"""The spot voter: a drawn node re-runs a case's steps on its model and votes on chain.

A real (tiny, random) model, real signatures, a real chain service on a
loopback host: the honest answers come from one prefill call, the voter
re-runs the steps in their chunks, as the accused server ran them.
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import torch
import trio

from compute.wiretensor import decode_tensor, encode_tensor
from ledger import spotrules
from ledger.codec import encode
from ledger.crypto import SigningKey
from ledger.spot import S_STEP, SignedAnswer, SpotEvidence, Step, StepClaim, history_of, input_hash
from ledger.state import SPOT
from ledger.types import (
    COIN, SPOT_AGREES, SPOT_DISAGREES, SPOT_UNABLE, ZERO_SIG, SpotFraud, SpotVote, sign,
)
from node.pol.spotvoter import SpotVoter, rerun
from tests.compute.helpers import TINY, tiny_model
from tests.ledger.chainkit import CHAIN, grow, make_net, new_db, peer_key
from tests.node.netkit import chain_node, eventually, run

MODEL = "tiny"
PROMPT, TOKENS = 5, 3  # a prompt of 5 positions, then three decode steps


def _steps(g: torch.Generator, codec: str = "raw") -> tuple[Step, ...]:
    x = torch.randn(1, PROMPT + TOKENS, TINY.dim, generator=g)
    steps = [Step(0, (3, 2), encode_tensor(x[:, :PROMPT], codec))]
    steps += [Step(p, (1,), encode_tensor(x[:, p:p + 1], codec))
              for p in range(PROMPT, PROMPT + TOKENS)]
    return tuple(steps)


def _honest(model, steps, codec: str = "raw") -> bytes:
    """The last step's output by one prefill call over every position (not the steps' calls)."""
    x = torch.cat([decode_tensor(s.hidden) for s in steps], dim=1)
    with torch.inference_mode():
        out = model.run_layers(x, 0, TINY.n_layers)
    return encode_tensor(out[:, steps[-1].pos:], codec)


def _lie(hidden: bytes) -> bytes:
    t = decode_tensor(hidden)
    return encode_tensor(t + 0.5 * t.abs().amax(), "raw")


def _answer(key: SigningKey, steps, hidden: bytes) -> SignedAnswer:
    claim = StepClaim(b"\x09" * 32, MODEL, 0, TINY.n_layers, steps[-1].pos,
                      input_hash(steps[-1]), history_of(steps), hashlib.sha256(hidden).digest())
    return SignedAnswer(key.public, claim, hidden, key.sign(S_STEP, encode(claim)))


def _evidence(accused: SigningKey, steps, accused_says: bytes, others_say: bytes):
    others = [SigningKey(bytes([i]) * 32) for i in (0x71, 0x72)]
    return SpotEvidence(steps, (_answer(accused, steps, accused_says),
                                *(_answer(k, steps, others_say) for k in others)), 0, 1)


def test_rerun_finds_the_lie_the_truth_and_what_it_cannot_judge():
    g = torch.Generator().manual_seed(5)
    model, steps = tiny_model(g), _steps(g)
    truth, accused = _honest(model, steps), SigningKey(b"\x44" * 32)
    lie = _lie(truth)
    layers = range(0, TINY.n_layers)
    assert rerun(model, layers, _evidence(accused, steps, lie, truth)) == SPOT_DISAGREES
    assert rerun(model, layers, _evidence(accused, steps, truth, lie)) == SPOT_AGREES
    assert rerun(model, range(0, 1), _evidence(accused, steps, lie, truth)) == SPOT_UNABLE
    assert rerun(model, layers, _evidence(accused, steps, lie, _lie(lie))) == SPOT_UNABLE


def test_rerun_compares_in_the_answers_codec():
    g = torch.Generator().manual_seed(6)
    model, steps = tiny_model(g), _steps(g, "fp16")
    truth = _honest(model, steps, "fp16")
    evidence = _evidence(SigningKey(b"\x44" * 32), steps, truth, _lie(truth))
    assert rerun(model, range(0, TINY.n_layers), evidence) == SPOT_AGREES


def test_a_drawn_serving_node_votes_on_chain():
    g = torch.Generator().manual_seed(7)
    model, steps = tiny_model(g), _steps(g)
    net = make_net(n_nodes=6)
    db = new_db(net)
    truth = _honest(model, steps)
    evidence = _evidence(peer_key(net.nodes[0]), steps, _lie(truth), truth)
    user = net.users[0]
    fraud = sign(SpotFraud(CHAIN, user.public, evidence, 3 * COIN, 0, ZERO_SIG), user)
    grow(db, net, 3, [fraud])  # accused in block 1, drawn in block 3
    cid = spotrules.case_id(evidence.answers[0])
    case = db.state.get(SPOT + cid)
    assert case.status == spotrules.CASE_OPEN
    served = SimpleNamespace(model=model, layers=range(0, TINY.n_layers), model_id=MODEL,
                             device="cpu")
    other = SimpleNamespace(model=model, layers=served.layers, model_id="another", device="cpu")
    keys = [net.node_key(k) for k in case.verifiers]
    lines: list[str] = []

    async def main():
        async with chain_node(1, db, lambda: 10**13) as node:
            voters = [SpotVoter(node.service, node.txs, keys[0], lambda: served,
                                report=lines.append),
                      SpotVoter(node.service, node.txs, keys[1], lambda: other),
                      SpotVoter(node.service, node.txs, keys[2], lambda: None)]
            async with trio.open_nursery() as nursery:
                for voter in voters:
                    nursery.start_soon(voter.run)
                await eventually(lambda: sum(sum(v.sent.values()) for v in voters) == 3,
                                 "three votes submitted", limit=30)
                nursery.cancel_scope.cancel()
            assert voters[0].sent["disagrees"] == 1

    run(main, deadline=60)
    votes = {v.verifier: v.vote for v in _votes(db)}
    assert votes == {keys[0].public: SPOT_DISAGREES, keys[1].public: SPOT_UNABLE,
                     keys[2].public: SPOT_UNABLE}
    assert lines and "disagrees" in lines[0]
    grow(db, net, 1, _votes(db))
    judged = db.state.get(SPOT + cid)
    assert judged.status == spotrules.UNDECIDED  # one of three drawn found the lie: no majority
    assert judged.votes[case.verifiers.index(keys[0].public)] == SPOT_DISAGREES


def _votes(db) -> list[SpotVote]:
    return [tx for tx in db.mempool() if isinstance(tx, SpotVote)]
