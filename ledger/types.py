"""Every object the ledger signs, hashes, stores or sends.

Frozen, slotted dataclasses registered with the codec (``@wire(tag)``); the
field order is the encoding order. Signed objects end in ``signature``, which
covers ``encode_unsigned(obj)`` under the object's signature domain; every
signed object carries the chain id, so a signature from one chain means
nothing on another. Amounts are integers in base units (``COIN`` per coin).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Sequence, Union

from ledger import crypto, spot
from ledger.codec import (
    U8, U32, U64, ChainId, Hash32, Key32, MaxLen, Proof80, Sig64, concat_array, encode, encode_from_parts,
    encode_unsigned, wire,
)
from ledger.tab import Claim, OpenTab

COIN = 1_000_000
#: Most bytes of encoded transactions in one block (the header adds < 1 KiB;
#: well under the codec's 32 MiB decode limit).
MAX_BLOCK_BYTES = 16 * 1024 * 1024


def format_coins(units: int) -> str:
    """Base units as coins, without trailing zeros: 2_500_000 -> '2.5'."""
    whole, frac = divmod(units, COIN)
    return f"{whole}.{frac:06d}".rstrip("0").rstrip(".")
PeerId = Annotated[bytes, MaxLen(64)]

# Compute-block kinds (ARCHITECTURE.md, compute).
FORWARD, BACKWARD, ATTENTION_HEADS = 0, 1, 2
UNIT_KINDS = (FORWARD, BACKWARD, ATTENTION_HEADS)


# -- transactions -------------------------------------------------------------


@wire(1)
@dataclass(frozen=True, slots=True)
class Transfer:
    """Move ``amount`` from ``sender`` to ``recipient``."""

    chain_id: ChainId
    sender: Key32
    recipient: Key32
    amount: U64
    nonce: U64
    signature: Sig64


@wire(2)
@dataclass(frozen=True, slots=True)
class Register:
    """Bind a node key and libp2p peer id to an account, and lock a bond.

    The account (wallet key) signs the whole; the node key proves it agrees
    with ``node_signature`` over a ``Binding``, and the peer key (the Ed25519
    key inside ``peer_id``) with ``peer_signature`` over the same ``Binding``
    under its own domain. Re-registering the same account updates its layers
    / peer id and adds ``bond`` to the bond.

    Attack note: clients route inference only through peer ids bound on the
    chain. Were the peer id signed by the node key alone, any bonded account
    could bind another node's peer id and pass as it (or vouch for a peer it
    does not run); with the peer key's signature, only the holder of the
    peer key can bind its peer id.
    """

    chain_id: ChainId
    account: Key32
    node_key: Key32
    peer_id: PeerId
    layer_start: U32
    layer_end: U32
    bond: U64
    nonce: U64
    node_signature: Sig64
    peer_signature: Sig64
    signature: Sig64


@wire(3, 2)
@dataclass(frozen=True, slots=True)
class Receipt:
    """A node's signed claim that it executed one compute block (specs/pol.md).

    weights_hash: digest of every parameter tensor the unit read at its step;
    input_hash, output_hash: what it consumed and produced (chained between
    neighbouring units); cert_hash: the hash of its `UnitCert`, everything a
    verifier re-executing the unit compares (version 2 added weights_hash).
    """

    chain_id: ChainId
    node_key: Key32
    job_id: Hash32
    unit_id: Hash32
    weights_hash: Hash32
    input_hash: Hash32
    output_hash: Hash32
    cert_hash: Hash32
    signature: Sig64


#: Verdict reasons (specs/pol.md): PASS, or why the re-execution failed, or
#: UNAVAILABLE when the verifier could not fetch what it needed (no one is
#: slashed for that: the worker just goes unpaid).
PASS, OUTPUT_MISMATCH, GRADIENT_MISMATCH, UNCHAINED_INPUT, WRONG_DATA, UNAVAILABLE, MALFORMED = \
    range(7)
VERDICT_REASONS = ("pass", "output mismatch", "gradient mismatch", "unchained input",
                   "wrong data", "unavailable", "malformed")
#: The reasons that fail the worker (and need evidence).
FAILING_REASONS = frozenset({OUTPUT_MISMATCH, GRADIENT_MISMATCH, UNCHAINED_INPUT, WRONG_DATA,
                             MALFORMED})


@wire(4, 2)
@dataclass(frozen=True, slots=True)
class Verdict:
    """The assigned verifier's finding on a sampled receipt (version 2: a reason, not a bool).

    reason: one of `VERDICT_REASONS` by index; evidence_hash: the hash of the
    verifier's `proof_of_learning` Evidence, required (non-zero) for a
    failing reason.
    """

    chain_id: ChainId
    verifier: Key32
    receipt_hash: Hash32
    reason: U8
    evidence_hash: Hash32
    signature: Sig64

    @property
    def passed(self) -> bool:
        return self.reason == PASS


@wire(38)
@dataclass(frozen=True, slots=True)
class Appeal:
    """A worker's appeal against the failing verdict on its receipt (specs/pol.md 6.6).

    Signed by the node key that signed the receipt; fresh verifiers are
    drawn two blocks on, and the loser of the appeal is slashed.
    """

    chain_id: ChainId
    node_key: Key32
    receipt_hash: Hash32
    signature: Sig64


@wire(7, 2)
@dataclass(frozen=True, slots=True)
class UnitTemplate:
    """One compute block of every step: kind, layers [start, end), slots [start, end), replica.

    ``head_start == head_end == 0`` means whole layers. Otherwise the unit is
    a piece of one layer: a range of its slots, query heads first, then MLP
    column slices (see compute/partition.py; the ledger only needs the range).
    ``replica`` is the data-parallel shard of the step's batch the unit works
    on (0 when the job has one).
    """

    kind: U8
    layer_start: U32
    layer_end: U32
    head_start: U32
    head_end: U32
    replica: U32 = 0


#: Most bytes of a job's spec (its canonical config JSON).
MAX_JOB_SPEC = 16 * 1024


@wire(8, 2)
@dataclass(frozen=True, slots=True)
class Job:
    """A training job: what to train, on what, how, its per-step units, and who pays.

    ``spec`` is the job's description (the node's canonical config JSON;
    ``hyper_hash`` is its SHA-256), so any node can mine the job from the
    chain alone (version 2). ``deposit`` is what the creator locks to pay
    the job's miners and verifiers (specs/consensus.md 5.2): 0 only for the
    chain's job authority, whose jobs are paid by minting.
    """

    chain_id: ChainId
    creator: Key32
    model_hash: Hash32
    data_hash: Hash32
    hyper_hash: Hash32
    spec: Annotated[bytes, MaxLen(MAX_JOB_SPEC)]
    steps: U64
    units: Annotated[tuple[UnitTemplate, ...], MaxLen(4096)]
    deposit: U64
    nonce: U64
    signature: Sig64


#: Most bytes of one encoded `SpotFraud`: half a block, so an accusation never fills one
#: (a SmolLM2 history of about 1,700 positions in raw float32 with three answers fits).
MAX_SPOT_FRAUD_BYTES = MAX_BLOCK_BYTES // 2


@wire(42)
@dataclass(frozen=True, slots=True)
class SpotFraud:
    """A client's accusation that a server answered a step wrong (specs/ledger.md 5.2).

    evidence: the `ledger.spot.SpotEvidence` a spot check settled; its
        ``loser`` answer is the accused (its peer key must be a registered,
        bonded node's). The whole transaction is at most `MAX_SPOT_FRAUD_BYTES`.
    deposit: base units locked until the case is judged: returned when the
        verifiers uphold it or cannot decide, given to the accused when they
        find its answer right (at least `ledger.spotrules.min_deposit`).
    """

    chain_id: ChainId
    accuser: Key32
    evidence: spot.SpotEvidence
    deposit: U64
    nonce: U64
    signature: Sig64


#: `SpotVote.vote`: the accused answer agrees with the verifier's re-execution (it was
#: right), disagrees (it lied), or the verifier cannot judge (another model, no weights).
SPOT_AGREES, SPOT_DISAGREES, SPOT_UNABLE = range(3)
SPOT_VOTES = ("agrees", "disagrees", "unable")


@wire(43)
@dataclass(frozen=True, slots=True)
class SpotVote:
    """A drawn verifier's finding on a spot case, signed by its node key.

    case_id: the case (`ledger.spotrules.case_id` of the accused answer);
    vote: one of `SPOT_VOTES` by index.
    """

    chain_id: ChainId
    verifier: Key32
    case_id: Hash32
    vote: U8
    signature: Sig64


# Tags 5 (Charge), 6 (InferencePayment) and 10 (Usage) are retired: tabs replace them.
Tx = Union[Transfer, Register, Receipt, Verdict, Job, OpenTab, Claim, Appeal, SpotFraud,
           SpotVote]
TX_TYPES = (Transfer, Register, Receipt, Verdict, Job, OpenTab, Claim, Appeal, SpotFraud,
            SpotVote)


# -- signing helpers ------------------------------------------------------------


@wire(9)
@dataclass(frozen=True, slots=True)
class Binding:
    """What a node key and a peer key sign to agree to serve an account (``Register``)."""

    chain_id: ChainId
    account: Key32
    node_key: Key32
    peer_id: PeerId


@wire(11, 2)
@dataclass(frozen=True, slots=True)
class UnitId:
    """The fields a compute block's id is the hash of."""

    job_id: Hash32
    step: U64
    kind: U8
    layer_start: U32
    layer_end: U32
    head_start: U32
    head_end: U32
    replica: U32


# -- blocks ---------------------------------------------------------------------


@wire(12, 2)
@dataclass(frozen=True, slots=True)
class Header:
    """A block header; its hash (over the full encoding) names the block.

    vrf_proof (version 2): the producer's ECVRF proof over the parent's
    beacon and this height (`ledger.beacon`); its output is the block's
    beacon, which seeds the audit draw and the next producer ranking and
    which the producer cannot choose (80 zero bytes in block 0).
    """

    chain_id: ChainId
    height: U64
    prev_hash: Hash32
    time_ms: U64
    producer: Key32
    vrf_proof: Proof80
    txs_root: Hash32
    log_root: Hash32
    log_size: U64
    state_root: Hash32
    signature: Sig64


@wire(13)
@dataclass(frozen=True, slots=True)
class Block:
    header: Header
    txs: Annotated[tuple[Tx, ...], MaxLen(100_000)]


@wire(14, 4)
@dataclass(frozen=True, slots=True)
class Params:
    """Chain-wide constants, fixed at genesis and committed in the state root."""

    slot_ms: U32
    max_future_ms: U32
    min_bond: U64
    reward: U64
    challenge_window: U32
    unit_timeout: U32
    max_block_txs: U32
    slash_bps: U32  # of the bond, burned for a failing verdict (version 2: no bounty)
    audit_bps: U32  # receipts sampled for re-execution (specs/pol.md 5)
    verify_fee: U64  # minted to the verifier of a sampled receipt, pass or fail
    verdict_window: U32  # blocks a drawn verifier has for its verdict
    recheck_bps: U32  # passes re-checked by a second verifier (version 3, specs/pol.md 6.5)
    cartel_bps: U32  # the colluding share of nodes the economics must withstand (version 4)
    job_authority: Key32


@wire(15)
@dataclass(frozen=True, slots=True)
class Allocation:
    account: Key32
    amount: U64


@wire(16)
@dataclass(frozen=True, slots=True)
class Genesis:
    """Everything a chain starts from; block 0 is derived from it."""

    chain_id: ChainId
    time_ms: U64
    params: Params
    allocations: tuple[Allocation, ...]
    registrations: tuple[Register, ...]
    jobs: tuple[Job, ...]


# -- hashes and signatures ----------------------------------------------------------

_SIGN_DOMAIN = {Header: crypto.S_HEADER, **{t: crypto.S_TX for t in TX_TYPES}}


def tx_hash(tx: Tx, encoded: bytes | None = None) -> bytes:
    """The id of a transaction (also of a receipt in the log)."""
    return crypto.domain_hash(crypto.H_TX, encode(tx) if encoded is None else encoded)


def encode_block(header: Header, encoded_txs: Sequence[bytes]) -> bytes:
    """``encode(Block(header, txs))`` from the txs' encodings, without re-encoding them."""
    return encode_from_parts(Block, [encode(header), concat_array(list(encoded_txs))])


def block_hash(header: Header) -> bytes:
    return crypto.domain_hash(crypto.H_HEADER, encode(header))


def unit_id(job_id: bytes, step: int, t: UnitTemplate) -> bytes:
    """Deterministic id of one compute block: (job, step, kind, layers, heads, replica)."""
    uid = UnitId(job_id, step, t.kind, t.layer_start, t.layer_end, t.head_start, t.head_end,
                 t.replica)
    return crypto.domain_hash(crypto.H_UNIT, encode(uid))


def signer_of(obj: Tx | Header) -> bytes:
    """The public key whose signature ``obj`` must carry."""
    if isinstance(obj, Transfer):
        return obj.sender
    if isinstance(obj, Register):
        return obj.account
    if isinstance(obj, (Receipt, Appeal)):
        return obj.node_key
    if isinstance(obj, (Verdict, SpotVote)):
        return obj.verifier
    if isinstance(obj, SpotFraud):
        return obj.accuser
    if isinstance(obj, OpenTab):
        return obj.client
    if isinstance(obj, Claim):
        return obj.node_key
    if isinstance(obj, Job):
        return obj.creator
    return obj.producer


def nonce_owner(tx: Tx) -> bytes | None:
    """The account whose nonce ``tx`` uses (None: a transaction with no nonce: a receipt,
    a verdict, a claim, a spot vote)."""
    return signer_of(tx) if hasattr(tx, "nonce") else None


def sign(obj, key: crypto.SigningKey):
    """Return ``obj`` with its signature filled in by ``key``."""
    return replace(obj, signature=key.sign(_SIGN_DOMAIN[type(obj)], encode_unsigned(obj)))


def signature_ok(obj: Tx | Header, encoded: bytes | None = None) -> bool:
    """Whether ``obj.signature`` is the right key's signature of ``obj``.

    Args:
        obj: a signed transaction or header.
        encoded: ``encode(obj)``, if the caller has it already.
    """
    message = encode_unsigned(obj, encoded)
    return crypto.verify(signer_of(obj), _SIGN_DOMAIN[type(obj)], message, obj.signature)


def binding_signature(key: crypto.SigningKey, chain_id: str, account: bytes, peer_id: bytes) -> bytes:
    """``Register.node_signature``: node key ``key`` binds itself and ``peer_id`` to ``account``."""
    return key.sign(crypto.S_BIND, encode(Binding(chain_id, account, key.public, peer_id)))


def binding_ok(reg: Register) -> bool:
    """Whether ``reg.node_signature`` is the node key's signature of the binding."""
    binding = Binding(reg.chain_id, reg.account, reg.node_key, reg.peer_id)
    return crypto.verify(reg.node_key, crypto.S_BIND, encode(binding), reg.node_signature)


def peer_binding_signature(peer_key: crypto.SigningKey, chain_id: str, account: bytes,
                           node_key: bytes) -> bytes:
    """The peer key's ``Register.peer_signature``: its peer id agrees to serve ``account``.

    Args:
        peer_key: the libp2p identity key; the peer id bound is
            ``crypto.libp2p_peer_id(peer_key.public)``.
        chain_id, account, node_key: the rest of the ``Binding``.
    """
    peer_id = crypto.libp2p_peer_id(peer_key.public)
    return peer_key.sign(crypto.S_BIND_PEER, encode(Binding(chain_id, account, node_key, peer_id)))


def peer_binding_ok(reg: Register) -> bool:
    """Whether ``reg.peer_signature`` is the binding's signature by the key inside ``peer_id``.

    False (never raises) for a peer id with no inlined Ed25519 key.
    """
    try:
        peer_key = crypto.peer_public_key(reg.peer_id)
    except ValueError:
        return False
    binding = Binding(reg.chain_id, reg.account, reg.node_key, reg.peer_id)
    return crypto.verify(peer_key, crypto.S_BIND_PEER, encode(binding), reg.peer_signature)


ZERO_SIG = bytes(64)
