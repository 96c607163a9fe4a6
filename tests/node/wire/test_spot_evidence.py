"""Signed step claims and spot-check evidence (specs/network.md 9.5): the rules, pure.

Real Ed25519 keys (the peers' libp2p identities) sign real claims over real
wire tensors; nothing runs a model.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from compute.wiretensor import encode_tensor
from ledger.codec import decode, encode
from node.wire import (
    EMPTY_HISTORY, S_STEP, InputHistory, SignedAnswer, SpotEvidence, Step, check_evidence,
    history_of, input_hash, step_claim, step_positions,
)
from tests.node.netkit import ident


def steps(lengths=(5, 1, 1), seed=0) -> list[Step]:
    """Contiguous steps from position 0 of the given lengths (random hidden states)."""
    g, out, pos = torch.Generator().manual_seed(seed), [], 0
    for t in lengths:
        out.append(Step(pos, (), encode_tensor(torch.randn(1, t, 8, generator=g))))
        pos += t
    return out


def answer(n: int, history: list[Step], output: torch.Tensor, token=b"t" * 32) -> SignedAnswer:
    """Peer ``n``'s signed answer ``output`` to the last of ``history``, as a server signs it."""
    key = ident(n).key_pair
    hidden = encode_tensor(output)
    claim = step_claim(token, "m", 10, 20, history[-1], hidden, history_of(history))
    return SignedAnswer(key.public_key.to_bytes(), claim, hidden,
                        key.private_key.sign(S_STEP + encode(claim)))


def test_the_running_hash_follows_the_steps_and_rolls_back_with_the_cache():
    a, b, c = steps()
    h = InputHistory()
    assert h.advance(a, 5) == history_of([a]) != EMPTY_HISTORY
    assert h.advance(b, 1) == history_of([a, b])
    assert h.advance(c, 1) == history_of([a, b, c])
    other = Step(5, (), encode_tensor(torch.ones(1, 1, 8)))
    assert h.advance(other, 1) == history_of([a, other])  # rolled back to position 5
    replay = Step(0, (5, 1), encode_tensor(torch.ones(1, 6, 8)))
    assert h.advance(replay, 6) == history_of([replay])  # a replay: from nothing
    # A cut inside a step gives a hash no list of steps gives.
    cut = Step(3, (), encode_tensor(torch.ones(1, 2, 8)))
    assert h.advance(cut, 2) not in {history_of([cut]), history_of([replay, cut])}
    # The voucher pays; it is not computed on, so it is not in the input hash.
    assert input_hash(replace(b, voucher=b"v")) == input_hash(b)
    assert [step_positions(s) for s in (a, b, replay)] == [5, 1, 6]


def test_evidence_holds_when_the_answers_sign_the_steps_and_not_otherwise():
    history = steps()
    out = torch.randn(1, 1, 8)
    liar, checker, third = (answer(n, history, o) for n, o in
                            ((1, out + 1), (2, out), (3, out)))
    good = SpotEvidence(tuple(history), (liar, checker, third), 0, 1)
    assert check_evidence(good) is None and good.verified()
    assert decode(encode(good), SpotEvidence) == good
    # A forged answer: the liar's claim and bytes under another key's signature.
    forged = replace(liar, signature=checker.signature)
    assert "signature" in check_evidence(replace(good, answers=(forged, checker)))
    # Bytes the claim does not name (the liar cannot disown its output).
    disowned = replace(liar, hidden=checker.hidden)
    assert "signature or output" in check_evidence(replace(good, answers=(disowned, checker)))
    # Another history: a step dropped, a step changed, steps out of order.
    assert check_evidence(replace(good, steps=tuple(history[1:]))) is not None
    changed = replace(history[1], hidden=encode_tensor(torch.zeros(1, 1, 8)))
    assert "another history" in check_evidence(
        replace(good, steps=(history[0], changed, history[2])))
    assert "position" in check_evidence(replace(good, steps=(history[1], history[0],
                                                             history[2])))
    # A voucher in a step, an answer to another step, another layer span.
    assert "voucher" in check_evidence(
        replace(good, steps=(replace(history[0], voucher=b"x"), *history[1:])))
    early = answer(2, history[:2], out)
    assert "another step" in check_evidence(replace(good, answers=(liar, early)))
    span = replace(checker, claim=replace(checker.claim, layer_end=21))
    assert "different computations" in check_evidence(replace(good, answers=(liar, span)))
    assert check_evidence(replace(good, loser=4)) == "loser out of range"
    assert check_evidence(replace(good, answers=())) is not None
