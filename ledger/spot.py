"""Spot-check evidence: what a server signs for each answer, and what a client keeps against it.

Owns the objects both the swarm (`node.wire.serve`, which re-exports them)
and the chain (`ledger.spotrules`: a `SpotFraud` carries one `SpotEvidence`)
read: the `Step` a server runs, the `StepClaim` its `StepResult` signature
covers (its input and the session's running input hash, `InputHistory`), a
kept `SignedAnswer`, the `SpotEvidence` of a settled mismatch, and the pure
check that evidence holds together (`check_evidence`, no model run).
specs/network.md 9.5 states the formats; the tags are node.wire's table's.
Pure: no clock, socket or file.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, replace
from typing import Annotated

from ledger.codec import U32, U64, Key32, MaxLen, Range, Sig64, encode, wire
from ledger.crypto import verify

#: Signature domain of a server's answers to steps (`StepClaim`).
S_STEP = b"pnode:sign:step:"
#: Largest hidden-state payload of one `Step` (2,048 float32 rows of 2,048).
MAX_HIDDEN_BYTES = 16 * 1024 * 1024
#: Most chunks one replaying `Step` may carry.
MAX_CHUNKS = 4096
#: Largest encoded `Voucher` a `Step` or `Settle` carries (64 amounts fit).
MAX_VOUCHER_BYTES = 1024

ModelId = Annotated[str, MaxLen(64)]


@wire(63, 2)
@dataclass(frozen=True, slots=True)
class Step:
    """Hidden states entering the session's first layer at positions ``pos ..``.

    hidden: a wire tensor (compute/wiretensor.py) of shape (1, T, dim).
    chunks: how the server must split the T positions into consecutive
        forward calls (a replay repeats the original prefill and decode
        steps, so the rebuilt KV cache is bit-identical); () means one call.
    voucher: the client's latest encoded `ledger.tab.Voucher` for the
        session's tab, covering every position delivered before this step
        (b"" in a free session); a pushed step forwards it unchanged.
    The answer is a `StepResult` with the outputs at all T positions.
    """

    pos: U32
    chunks: Annotated[tuple[Annotated[int, Range(1, 1 << 20)], ...], MaxLen(MAX_CHUNKS)]
    hidden: Annotated[bytes, MaxLen(MAX_HIDDEN_BYTES)]
    voucher: Annotated[bytes, MaxLen(MAX_VOUCHER_BYTES)] = b""


#: Most steps one `SpotEvidence` carries (a session's whole input history, step by step).
MAX_EVIDENCE_STEPS = 4096
#: Largest encoded `SpotEvidence` (the input history and up to three answers): what a
#: client writes and what a verifier reads; a generation of SmolLM2's 2,048 positions in
#: raw float32 is about 4.7 MiB of inputs.
MAX_EVIDENCE_BYTES = 32 * 1024 * 1024
#: The running hash of a session's inputs before its first step.
EMPTY_HISTORY = bytes(32)


@wire(75, 2)
@dataclass(frozen=True, slots=True)
class StepClaim:
    """What a server's `StepResult` signature says: for this input, after this history, this output.

    session: ``session_id(token)`` of the session (the token itself stays secret).
    model_id, layer_start, layer_end: the computation (the session's layers).
    pos: the step's position.
    input_hash: `input_hash` of the `Step` the server ran (pos, chunks, hidden; the
        voucher left out: it pays, it is not computed on).
    history: the session's running input hash after this step (`InputHistory`): it
        names every step the KV cache holds, so the claim is self-contained at any
        position: given those steps in order, anyone holding the model can re-run them.
    output_hash: SHA-256 of the `StepResult`'s ``hidden`` bytes.
    (Version 2 added ``history`` and dropped the voucher from ``input_hash``.)
    """

    session: Key32
    model_id: ModelId
    layer_start: U32
    layer_end: U32
    pos: U32
    input_hash: Key32
    history: Key32
    output_hash: Key32


def session_id(token: bytes) -> bytes:
    """The public name of a session: SHA-256 of its secret token (which authorises pushes)."""
    return hashlib.sha256(b"pnode:session:" + token).digest()


def input_hash(step: Step) -> bytes:
    """SHA-256 of the encoded ``step`` without its voucher (what a claim's input names)."""
    return hashlib.sha256(encode(replace(step, voucher=b""))).digest()


def next_history(prev: bytes, step_hash: bytes) -> bytes:
    """The running input hash after a step: SHA-256(domain || prev || the step's input hash)."""
    return hashlib.sha256(b"pnode:history:" + prev + step_hash).digest()


class InputHistory:
    """A session's running input hash, one boundary per step (`StepClaim.history`).

    ``h_0`` is `EMPTY_HISTORY`; a step at ``pos`` with input hash ``x``
    gives ``next_history(h(pos), x)``, where ``h(pos)`` is the hash after
    the steps that end exactly at ``pos`` (a step at a smaller position
    rolls the cache back, and the hash with it). A step that rolls back
    into the middle of an earlier step (no honest client sends one) starts
    from a hash no sequence of steps gives (``next_history`` of a cut
    marker), so such claims are never evidence of anything.
    """

    def __init__(self) -> None:
        self._ends: list[tuple[int, bytes]] = [(0, EMPTY_HISTORY)]  # (positions, hash after)

    def advance(self, step: Step, positions: int) -> bytes:
        """The hash after ``step`` (of ``positions`` positions), which it becomes."""
        while self._ends[-1][0] > step.pos:
            self._ends.pop()
        end, prev = self._ends[-1]
        if end != step.pos:  # a cut inside a step (or a gap, which the server refuses)
            prev = next_history(hashlib.sha256(b"pnode:history-cut:").digest(), prev)
            self._ends = [(0, EMPTY_HISTORY)]
        h = next_history(prev, input_hash(step))
        self._ends.append((step.pos + positions, h))
        return h


def history_of(steps: tuple[Step, ...] | list[Step]) -> bytes:
    """The running input hash after ``steps`` in order (`InputHistory` from empty)."""
    h = EMPTY_HISTORY
    for step in steps:
        h = next_history(h, input_hash(step))
    return h


def step_claim(token: bytes, model_id: str, start: int, end: int, step: Step,
               hidden: bytes, history: bytes) -> StepClaim:
    """The claim a server signs when it answers ``step`` with ``hidden`` after ``history``."""
    return StepClaim(session_id(token), model_id, start, end, step.pos, input_hash(step),
                     history, hashlib.sha256(hidden).digest())


@wire(76)
@dataclass(frozen=True, slots=True)
class SignedAnswer:
    """One server's signed answer to a step, as a client keeps it for evidence.

    public_key: the server's raw Ed25519 peer key (its peer id is derived).
    claim: what it signed; hidden: the output bytes the claim's hash names.
    """

    public_key: Key32
    claim: StepClaim
    hidden: Annotated[bytes, MaxLen(MAX_HIDDEN_BYTES)]
    signature: Sig64

    def verified(self) -> bool:
        """True when the signature is the key's over the claim, and the claim names ``hidden``."""
        return (hashlib.sha256(self.hidden).digest() == self.claim.output_hash
                and verify(self.public_key, S_STEP, encode(self.claim), self.signature))


@wire(77, 2)
@dataclass(frozen=True, slots=True)
class SpotEvidence:
    """Two or three servers' signed answers to the same step after the same history.

    steps: the accused session's input steps since position 0, in order, vouchers
        empty: the last one is the step every answer answers, and together they
        are the history every answer's claim names (`StepClaim.history`), so a
        verifier can re-run them (each step in its chunks, as the servers did).
    answers: the signed answers (the accused server's first).
    loser: the index of the answer the majority rejected (len(answers): none).
    time_ms: when the client settled it.
    (Version 2: the history step by step instead of one replay at position 0, so
    the accused answer is one it gave in its ordinary course, not to a replay.)
    """

    steps: Annotated[tuple[Step, ...], MaxLen(MAX_EVIDENCE_STEPS)]
    answers: Annotated[tuple[SignedAnswer, ...], MaxLen(3)]
    loser: U32
    time_ms: U64

    def verified(self) -> bool:
        """True when the steps are a history and every answer signs it (`check_evidence`)."""
        return check_evidence(self) is None


def check_evidence(evidence: SpotEvidence) -> str | None:
    """Why ``evidence`` does not hold together (None: it does). Pure: no model is run.

    It holds when: there are steps and answers; the steps are contiguous from
    position 0 with empty vouchers; every answer verifies (its key's signature
    over its claim, whose output hash names its bytes); every claim names the
    last step (position and input hash), the steps' running hash, and the same
    model and layers; and ``loser`` is an answer's index or ``len(answers)``.
    """
    steps, answers = evidence.steps, evidence.answers
    if not steps or not answers:
        return "no steps or no answers"
    pos = 0
    for step in steps:
        if step.voucher:
            return "a step carries a voucher"
        if step.pos != pos:
            return f"a step at position {step.pos}, the history holds {pos}"
        pos += step_positions(step)
    history, last = history_of(steps), input_hash(steps[-1])
    first = answers[0].claim
    for a in answers:
        c = a.claim
        if (c.model_id, c.layer_start, c.layer_end) != (first.model_id, first.layer_start,
                                                       first.layer_end):
            return "answers for different computations"
        if c.pos != steps[-1].pos or c.input_hash != last:
            return "an answer to another step"
        if c.history != history:
            return "an answer after another history"
        if not a.verified():
            return "an answer's signature or output hash does not verify"
    if evidence.loser > len(answers):
        return "loser out of range"
    return None


def step_positions(step: Step) -> int:
    """How many positions ``step`` carries: its chunks' sum, else its tensor's rows.

    Read from the wire tensor's header (compute/wiretensor.py: magic, version,
    codec, dtype, ndim, then u32 dims), so this stays free of torch; a
    header that is not (1, T, dim) counts 0 (no history holds such a step).
    """
    if step.chunks:
        return sum(step.chunks)
    if len(step.hidden) < 8 + 12 or step.hidden[:4] != b"PNWT" or step.hidden[7] != 3:
        return 0
    return struct.unpack_from("<3I", step.hidden, 8)[1]
