"""Protocol ids, gossip topic and messages of model serving (specs/network.md section 9).

Owns what servers and clients of the swarm say to each other: signed
announcements of who serves which layers (gossip topic ``pnode/announce/3``
and the ``/pnode/swarm/3.0.0`` request that returns a node's view of them),
the inference session stream ``/pnode/inference/3.1.0`` and the
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

from dataclasses import dataclass, replace
from typing import Annotated

from ledger.codec import U32, U64, Key32, MaxLen, Range, Sig64, encode_unsigned, wire
from ledger.crypto import verify
# The spot-check evidence lives in the ledger (a `SpotFraud` carries it); re-exported here.
from ledger.spot import (
    EMPTY_HISTORY, MAX_CHUNKS, MAX_EVIDENCE_BYTES, MAX_EVIDENCE_STEPS, MAX_HIDDEN_BYTES,
    MAX_VOUCHER_BYTES, S_STEP, InputHistory, ModelId, SignedAnswer, SpotEvidence, Step,
    StepClaim, check_evidence, history_of, input_hash, next_history, session_id, step_claim,
    step_positions,
)

__all__ = [
    "ANNOUNCE_TOPIC", "Addrs", "Announce", "Busy", "ClientMessage", "EMPTY_HISTORY",
    "INFERENCE_PROTOCOL", "InputHistory", "Link", "Linked", "MAX_ANNOUNCES", "MAX_CHUNKS",
    "MAX_EVIDENCE_BYTES", "MAX_EVIDENCE_STEPS", "MAX_HIDDEN_BYTES", "MAX_INFERENCE_FRAME",
    "MAX_OPEN_FRAME", "MAX_POSITIONS", "MAX_SWARM_FRAME", "MAX_TAB_BYTES",
    "MAX_VOUCHER_BYTES", "ModelId", "OpenSession", "PUSH_PROTOCOL", "PushOpen",
    "SWARM_PROTOCOL", "S_ANNOUNCE", "S_STEP", "SessionAccepted", "SessionError", "Settle",
    "Settled", "SignedAnswer", "SpotEvidence", "Step", "StepClaim", "StepCopy",
    "StepResult", "SwarmRequest", "SwarmResponse", "TAB_ENDS", "TAB_REFUSED", "Text",
    "check_evidence", "history_of", "input_hash", "next_history", "session_id",
    "sign_announce", "step_claim", "step_positions",
]

#: Request/response protocol: a node's current view of the swarm's servers.
SWARM_PROTOCOL = "/pnode/swarm/3.0.0"  # 3: `Announce` version 3 (its node key)
#: Stream protocol of one inference session (many frames each way).
INFERENCE_PROTOCOL = "/pnode/inference/3.1.0"  # 3: paid sessions; 3.1: `StepCopy`, claims v2
#: Stream protocol on which a server pushes its outputs into the next hop's session.
PUSH_PROTOCOL = "/pnode/inference-push/2.0.0"  # 2: a pushed `Step` forwards the voucher
#: Gossip topic of `Announce` messages.
ANNOUNCE_TOPIC = "pnode/announce/3"
#: Signature domain of announcements (a peer key signs nothing else with it).
S_ANNOUNCE = b"pnode:sign:announce:"

#: Largest frame on an inference stream: a `Step` with a maximal payload.
MAX_INFERENCE_FRAME = MAX_HIDDEN_BYTES + 64 * 1024
#: Most announcements in one `SwarmResponse`.
MAX_ANNOUNCES = 512
#: Largest `SwarmResponse` frame: a server trims its answer to fit, a client reads this much.
MAX_SWARM_FRAME = 2 * 1024 * 1024
#: Largest position count the protocol can express (a session budget, a chunk, a cap).
MAX_POSITIONS = 1 << 20
#: Largest encoded `OpenTab` an `OpenSession` carries (64 lanes fit with room to spare).
MAX_TAB_BYTES = 8192
#: Largest first frame of an inference stream (an `OpenSession` with a maximal tab).
MAX_OPEN_FRAME = MAX_TAB_BYTES + 1024

Text = Annotated[str, MaxLen(256)]
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


@wire(94)
@dataclass(frozen=True, slots=True)
class StepCopy:
    """A linked hop's signed answer to a step it pushed on, sent to the client after the push.

    The same fields as `StepResult`: the client keeps every hop's signed
    answers (and so every hop's inputs: hop i's are hop i-1's outputs), so
    a spot check can localise a wrong answer without asking the route's
    hops anything (specs/network.md 9.5). Not an answer the client waits for.
    """

    pos: U32
    hidden: Annotated[bytes, MaxLen(MAX_HIDDEN_BYTES)]
    signature: Sig64


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
