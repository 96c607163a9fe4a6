"""Protocol ids, gossip topic and messages of model serving (specs/network.md section 9).

Owns what servers and clients of the swarm say to each other: signed
announcements of who serves which layers (gossip topic ``pnode/announce/3``
and the ``/pnode/swarm/3.0.0`` request that returns a node's view of them),
the inference session stream ``/pnode/inference/3.0.0`` and the
server-to-server push stream ``/pnode/inference-push/2.0.0`` that carries a
hop's outputs straight into the next hop's session. Version 3 pays: an
announcement names the node key a tab's lane pays and its price per
position per layer; a session opens with a bid and an `OpenTab`, every step
carries the client's latest `Voucher`, and `Settle` ends it with the final
one (specs/network.md section 9.6). Messages are frozen,
slotted dataclasses on the ledger codec (tags in `node.wire`'s table), so
decode refuses anything unexpected.

Announcements are signed by the announcing peer's libp2p Ed25519 key (the
key its peer id is made of), so any node may relay them in a `SwarmResponse`
without being able to forge or alter one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Annotated

from ledger.codec import U32, U64, Key32, MaxLen, Range, Sig64, encode, encode_unsigned, wire
from ledger.crypto import verify

#: Request/response protocol: a node's current view of the swarm's servers.
SWARM_PROTOCOL = "/pnode/swarm/3.0.0"  # 3: `Announce` version 3 (its node key)
#: Stream protocol of one inference session (many frames each way).
INFERENCE_PROTOCOL = "/pnode/inference/3.0.0"  # 3: paid sessions (bid, tab, vouchers)
#: Stream protocol on which a server pushes its outputs into the next hop's session.
PUSH_PROTOCOL = "/pnode/inference-push/2.0.0"  # 2: a pushed `Step` forwards the voucher
#: Gossip topic of `Announce` messages.
ANNOUNCE_TOPIC = "pnode/announce/3"
#: Signature domain of announcements (a peer key signs nothing else with it).
S_ANNOUNCE = b"pnode:sign:announce:"
#: Signature domain of a server's answers to steps (`StepClaim`).
S_STEP = b"pnode:sign:step:"

#: Largest hidden-state payload of one `Step` (2,048 float32 rows of 2,048).
MAX_HIDDEN_BYTES = 16 * 1024 * 1024
#: Largest frame on an inference stream: a `Step` with a maximal payload.
MAX_INFERENCE_FRAME = MAX_HIDDEN_BYTES + 64 * 1024
#: Most announcements in one `SwarmResponse`.
MAX_ANNOUNCES = 512
#: Largest `SwarmResponse` frame: a server trims its answer to fit, a client reads this much.
MAX_SWARM_FRAME = 2 * 1024 * 1024
#: Most chunks one replaying `Step` may carry.
MAX_CHUNKS = 4096
#: Largest position count the protocol can express (a session budget, a chunk, a cap).
MAX_POSITIONS = 1 << 20
#: Largest encoded `OpenTab` an `OpenSession` carries (64 lanes fit with room to spare).
MAX_TAB_BYTES = 8192
#: Largest encoded `Voucher` a `Step` or `Settle` carries (64 amounts fit).
MAX_VOUCHER_BYTES = 1024
#: Largest first frame of an inference stream (an `OpenSession` with a maximal tab).
MAX_OPEN_FRAME = MAX_TAB_BYTES + 1024

Text = Annotated[str, MaxLen(256)]
ModelId = Annotated[str, MaxLen(64)]
Addrs = Annotated[tuple[Text, ...], MaxLen(8)]


@wire(57, 3)
@dataclass(frozen=True, slots=True)
class Announce:
    """A server says what it serves, how fast, how loaded and at what price.

    public_key: the raw Ed25519 key of the peer (its peer id is derived).
    node_key: the node key its tab lanes pay (the chain's NODE record of
        this peer; all zero: a server of a private swarm, free only).
    addrs: multiaddrs to dial it at (each with ``/p2p/<peer id>``).
    model_id: `compute.gguf.model_id` of the weights it serves.
    layer_start, layer_end: the span of layers held, [start, end).
    throughput_milli: measured decode tokens/s through the whole span, x1000.
    load: open sessions; max_sessions: the most it accepts.
    max_chunk_positions: the most positions of one forward call it runs (a
        step without chunks, or each chunk of one); a longer one is refused.
    max_session_positions: the most positions one session may hold (the
        largest ``OpenSession.max_len`` it accepts).
    price: asked per position per layer, in base coin units (0: free); a
        session's bid must be at least this.
    time_ms: the server's clock when signed; a later one replaces an earlier.
    """

    public_key: Key32
    node_key: Key32
    addrs: Addrs
    model_id: ModelId
    layer_start: U32
    layer_end: U32
    throughput_milli: U64
    load: U32
    max_sessions: U32
    max_chunk_positions: Annotated[int, Range(1, MAX_POSITIONS)]
    max_session_positions: Annotated[int, Range(1, MAX_POSITIONS)]
    price: U64
    time_ms: U64
    signature: Sig64

    @property
    def throughput(self) -> float:
        return self.throughput_milli / 1000.0

    def verified(self) -> bool:
        """True when the signature is the peer key's and the span is well formed."""
        return self.layer_start < self.layer_end and verify(
            self.public_key, S_ANNOUNCE, encode_unsigned(self), self.signature)


def sign_announce(announce: Announce, sign) -> Announce:
    """``announce`` with its signature made by ``sign(domain || message) -> 64 bytes``."""
    unsigned = replace(announce, signature=bytes(64))
    return replace(unsigned, signature=sign(S_ANNOUNCE + encode_unsigned(unsigned)))


@wire(58)
@dataclass(frozen=True, slots=True)
class SwarmRequest:
    """Ask a node for the announcements it holds as fresh."""


@wire(59)
@dataclass(frozen=True, slots=True)
class SwarmResponse:
    """The fresh announcements a node holds, its own included."""

    announces: Annotated[tuple[Announce, ...], MaxLen(MAX_ANNOUNCES)]


@wire(60)
@dataclass(frozen=True, slots=True)
class OpenSession:
    """First frame of an inference stream: run layers [start, end) for me.

    max_len: the session's token budget (KV cache positions).
    codec: how the server encodes its outputs (the inputs say their own).
    bid: what the client pays per position per layer (at least the ask).
    tab: the encoded `ledger.tab.OpenTab` that pays, with a lane for this
        server's node key (b"": a free session, refused where the ask is
        above 0). The server admits it to its node's mempool and gossips it
        before it accepts.
    """

    model_id: ModelId
    layer_start: U32
    layer_end: U32
    max_len: Annotated[int, Range(1, 1 << 20)]
    codec: Annotated[str, MaxLen(8)]
    bid: U64 = 0
    tab: Annotated[bytes, MaxLen(MAX_TAB_BYTES)] = b""


@wire(61, 3)
@dataclass(frozen=True, slots=True)
class SessionAccepted:
    """The server holds a KV cache of ``max_len`` positions for this session.

    token: a random secret naming the session; whoever holds it (the
        previous hop, once the client sends it a `Link`) may push steps
        into the session (`PUSH_PROTOCOL`).
    height: the height of the server's chain (0: it follows none), so a
        client without a node of its own dates its next tab's expiry.
    """

    max_len: U32
    token: Key32
    height: U64 = 0


@wire(62, 2)
@dataclass(frozen=True, slots=True)
class Busy:
    """The server is full: try another server, or this one after the hint.

    min_bid: the least bid its waiting room would admit now (0: any bid;
        a client may raise its bid to it and ask again).
    """

    retry_after_ms: U32
    reason: Text
    min_bid: U64 = 0


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


@wire(64, 3)
@dataclass(frozen=True, slots=True)
class StepResult:
    """Hidden states leaving the session's last layer, (1, T, dim), as a wire tensor.

    pos: the position of the step it answers (a pushed step's result comes
        unasked, so the client matches results to steps by it).
    signature: the server's peer key over `S_STEP` and the `StepClaim` of
        this answer (`step_claim`): the answer is attributable, so a wrong
        one is evidence against its server (spot checks, specs/network.md 9.5).
    """

    pos: U32
    hidden: Annotated[bytes, MaxLen(MAX_HIDDEN_BYTES)]
    signature: Sig64


@wire(65)
@dataclass(frozen=True, slots=True)
class SessionError:
    """The server refused a request of the session and closes the stream.

    reason: free text for a person, but for two prefixes a client acts on:
        `TAB_REFUSED` (the session's tab is one no chain will take) and
        `TAB_ENDS` (the tab is too near its expiry to serve: a new one goes on).
    """

    reason: Text


#: How a `SessionError` reason starts when the server's chain refuses the session's tab
#: (funds, nonce, lanes, expiry): every server's chain would, so a client stops.
TAB_REFUSED = "the chain refuses the tab"
#: How a `SessionError` reason starts when the session's tab reached its last served height
#: (`node.wire.serve_until`): its server claims it now; the client goes on with a new tab.
TAB_ENDS = "the tab ends"


@wire(72)
@dataclass(frozen=True, slots=True)
class Link:
    """Client to a hop: push the outputs of every later step into this session too.

    The hop dials ``peer_id`` (at ``addrs``), opens `PUSH_PROTOCOL` with
    `PushOpen(token)`, and from then on sends each step's outputs there as a
    `Step` before it answers the client. It answers `Linked`. An empty
    ``peer_id`` unlinks (no answer).
    """

    peer_id: Text
    addrs: Addrs
    token: Key32


@wire(73)
@dataclass(frozen=True, slots=True)
class Linked:
    """Whether a `Link` took (``reason`` says why not)."""

    ok: bool
    reason: Text


@wire(74)
@dataclass(frozen=True, slots=True)
class PushOpen:
    """First frame of a push stream: the token of the session the steps are for."""

    token: Key32


@wire(75)
@dataclass(frozen=True, slots=True)
class StepClaim:
    """What a server's `StepResult` signature says: for this input, this output.

    session: ``session_id(token)`` of the session (the token itself stays secret).
    model_id, layer_start, layer_end: the computation (the session's layers).
    pos: the step's position.
    input_hash: SHA-256 of the encoded `Step` the server ran (pos, chunks, hidden).
    output_hash: SHA-256 of the `StepResult`'s ``hidden`` bytes.
    A claim at ``pos`` 0 is self-contained: the input holds the whole KV history.
    """

    session: Key32
    model_id: ModelId
    layer_start: U32
    layer_end: U32
    pos: U32
    input_hash: Key32
    output_hash: Key32


def session_id(token: bytes) -> bytes:
    """The public name of a session: SHA-256 of its secret token (which authorises pushes)."""
    return hashlib.sha256(b"pnode:session:" + token).digest()


def step_claim(token: bytes, model_id: str, start: int, end: int, step: Step,
               hidden: bytes) -> StepClaim:
    """The claim a server signs when it answers ``step`` with ``hidden`` (see `StepClaim`)."""
    return StepClaim(session_id(token), model_id, start, end, step.pos,
                     hashlib.sha256(encode(step)).digest(), hashlib.sha256(hidden).digest())


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


@wire(77)
@dataclass(frozen=True, slots=True)
class SpotEvidence:
    """Two or three servers' signed answers to the same input, of which they disagree.

    step: the input every answer claims (`Step` at position 0: the whole
        history, in its chunks), so a verifier can re-run it.
    answers: the signed answers (the checked server's first).
    loser: the index of the answer the majority rejected (len(answers): none).
    time_ms: when the client settled it.
    """

    step: Step
    answers: Annotated[tuple[SignedAnswer, ...], MaxLen(3)]
    loser: U32
    time_ms: U64

    def verified(self) -> bool:
        """True when every answer verifies and claims this evidence's step as its input."""
        digest = hashlib.sha256(encode(self.step)).digest()
        return bool(self.answers) and all(
            a.verified() and a.claim.input_hash == digest and a.claim.pos == self.step.pos
            for a in self.answers)


@wire(82)
@dataclass(frozen=True, slots=True)
class Settle:
    """Client to a paid hop: the session is over, here is the voucher for every step.

    voucher: the encoded final `ledger.tab.Voucher` (covering the last step
        too). The server answers `Settled` and ends the session.
    """

    voucher: Annotated[bytes, MaxLen(MAX_VOUCHER_BYTES)]


@wire(83)
@dataclass(frozen=True, slots=True)
class Settled:
    """The server took the final voucher: what it counts as owed, and its claim.

    owed: base units it counts for this session (positions run x layers x bid).
    claim: the id of the closing `Claim` it submitted (all zero: not yet,
        e.g. the tab is not in a block yet; it retries until the tab expires).
    """

    owed: U64
    claim: Key32


ClientMessage = (OpenSession, Step, Link, Settle)
