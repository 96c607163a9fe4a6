"""Proof-of-Learning certificates and evidence: what a compute block read and produced.

Owns the four PoL wire objects of specs/pol.md (tags 33-36, encoded by the
ledger codec like every other object):

- `Digest`: one named 32-byte tensor digest;
- `UnitCert`: one compute block's certificate: the weights and data it
  read, its inputs and outputs by name, the digest of its weight
  gradients, its loss and gradient norm as float32 bits. A receipt's
  ``cert_hash`` is `cert_hash` of it;
- `Distance`: one tensor's relative max error between the committed and
  the recomputed value;
- `Evidence`: what a verifier recomputed and measured, named by a
  verdict's ``evidence_hash`` (`evidence_hash`).

Decoding is the codec's (wrong tags, versions, arity, sizes: `DecodeError`);
`check_cert` and `check_evidence` add the rules the codec cannot express
(canonical name order, float bit patterns, the pairings of section 3.4 and
4.3 of specs/pol.md), and `decode_cert` / `decode_evidence` do both. Pure
core: no torch, no clock, no file; numpy only for the distance of section 7.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Annotated, Iterable, Mapping

import numpy as np

from ledger import crypto
from ledger.codec import U8, U32, U64, Hash32, MaxLen, decode, encode, wire
from ledger.errors import DecodeError
from ledger.types import (  # noqa: F401 (the reason codes, re-exported: see constants)
    FAILING_REASONS as FAILING, GRADIENT_MISMATCH, MALFORMED, OUTPUT_MISMATCH, PASS,
    UNAVAILABLE, UNCHAINED_INPUT, VERDICT_REASONS as REASONS, WRONG_DATA,
)
from proof_of_learning.errors import MalformedCertificate, MalformedEvidence

# -- constants ------------------------------------------------------------------

#: `Verdict.reason` / `Evidence.reason` codes (specs/pol.md section 4.1): one definition,
#: the ledger's, which the chain's rules read (the ledger may not import this package).
#: ``FAILING``: the reasons that fail the worker (the verdict slashes and needs evidence).

#: Reasons decided by comparing digests only, never by a tolerance.
_DIGEST_REASONS = frozenset({UNCHAINED_INPUT, WRONG_DATA, UNAVAILABLE, MALFORMED})

#: `Evidence.mode`: every digest compared bit for bit / tensors compared by distance.
EXACT, TOLERANCE = 0, 1

#: A float32 field holding no value (a unit with no loss, no gradients).
NONE_BITS = 0xFFFF_FFFF
#: The one NaN pattern a committed float may hold (any other NaN is malformed).
NAN_BITS = 0x7FC0_0000
#: +infinity: the distance of tensors that cannot be compared (section 7.2).
INF_BITS = 0x7F80_0000

#: The relative max error under which a recomputed tensor passes (section 7.3).
THRESHOLD = 1e-4

#: Limits: one name; named digests per list; distances per evidence.
MAX_NAME = 128
MAX_DIGESTS = 1024
MAX_DISTANCES = 4096

Name = Annotated[str, MaxLen(MAX_NAME)]


# -- float32 bits -----------------------------------------------------------------


def float32_bits(x: float | None) -> int:
    """The float32 bit pattern a certificate commits for ``x``.

    Args:
        x: a float (rounded to the nearest float32; beyond its range it becomes
            an infinity), or None for "no value".

    Returns:
        `NONE_BITS` for None, `NAN_BITS` for any NaN, else the IEEE 754
        binary32 pattern as an unsigned int.
    """
    if x is None:
        return NONE_BITS
    if x != x:  # NaN: one pattern, so it never collides with NONE_BITS (also a NaN)
        return NAN_BITS
    with np.errstate(over="ignore"):
        return int(np.array(x, dtype=np.float32).view(np.uint32))


def bits_float(bits: int) -> float | None:
    """The value of a committed float32 pattern (None for `NONE_BITS`).

    Raises:
        ValueError: ``bits`` is not a U32.
    """
    if not 0 <= bits <= 0xFFFF_FFFF:
        raise ValueError(f"{bits} is not a float32 bit pattern")
    if bits == NONE_BITS:
        return None
    return struct.unpack(">f", bits.to_bytes(4, "big"))[0]


def _is_nan(bits: int) -> bool:
    return (bits & 0x7F80_0000) == 0x7F80_0000 and (bits & 0x007F_FFFF) != 0


# -- the objects ------------------------------------------------------------------


@wire(33)
@dataclass(frozen=True, slots=True)
class Digest:
    """One named digest: a tensor's `tensor_digest`, or a named-tensors digest."""

    name: Name
    digest: Hash32


Digests = Annotated[tuple[Digest, ...], MaxLen(MAX_DIGESTS)]


@wire(34, 2)
@dataclass(frozen=True, slots=True)
class UnitCert:
    """What one compute block read and produced (specs/pol.md section 3.3).

    ``inputs`` and ``outputs`` are in strictly ascending name order;
    ``loss_bits`` and ``grad_norm_bits`` are float32 patterns, `NONE_BITS`
    where the unit has none; ``device`` (version 2) the compute class it
    ran in (`compute.device.compute_class`): a verifier of the same class
    passes only bit-exact results.
    """

    job_id: Hash32
    unit_id: Hash32
    step: U64
    index: U32
    weights_hash: Hash32
    data_hash: Hash32
    inputs: Digests
    outputs: Digests
    grads_hash: Hash32
    loss_bits: U32
    grad_norm_bits: U32
    device: Name


@wire(35)
@dataclass(frozen=True, slots=True)
class Distance:
    """One tensor's relative max error (float32 bits; `INF_BITS`: not comparable)."""

    name: Name
    rel_max_err_bits: U32


@wire(36)
@dataclass(frozen=True, slots=True)
class Evidence:
    """A verifier's account of one receipt's re-execution (specs/pol.md section 4.3)."""

    receipt_hash: Hash32
    cert_hash: Hash32
    reason: U8
    mode: U8
    threshold_bits: U32
    recomputed: Digests
    distances: Annotated[tuple[Distance, ...], MaxLen(MAX_DISTANCES)]


# -- hashes -----------------------------------------------------------------------


def cert_hash(cert: UnitCert) -> bytes:
    """A receipt's ``cert_hash``: ``H("pnode:cert:" || encode(cert))``.

    Raises:
        EncodeError: a field is out of its range (nothing unencodable is hashed).
    """
    return crypto.domain_hash(crypto.H_CERT, encode(cert))


def evidence_hash(evidence: Evidence) -> bytes:
    """A verdict's ``evidence_hash``: ``H("pnode:evidence:" || encode(evidence))``.

    Raises:
        EncodeError: a field is out of its range.
    """
    return crypto.domain_hash(crypto.H_EVIDENCE, encode(evidence))


# -- named digests ----------------------------------------------------------------


def digests(named: Mapping[str, bytes]) -> tuple[Digest, ...]:
    """``named`` as a canonical digest list: ascending by the names' UTF-8 bytes."""
    return tuple(Digest(n, named[n]) for n in sorted(named, key=lambda n: n.encode("utf-8")))


def digest_map(items: Iterable[Digest]) -> dict[str, bytes]:
    """A digest list as a name -> digest dict."""
    return {d.name: d.digest for d in items}


def _check_names(names: list[str], where: str, error: type[Exception]) -> None:
    """Names are printable ASCII, non-empty, strictly ascending (so unique).

    Attack note: a name is part of what is hashed, so a list must have one
    encoding per meaning. Were order free, the same unit would have many
    certificate hashes and a worker could make its hash collide with nothing
    anyone recomputes; were non-ASCII allowed, two names could look equal in
    a verifier's printout (a Cyrillic "у" for "y") and differ on the wire.
    """
    previous = None
    for name in names:
        if not name or not all(" " <= c <= "~" for c in name):
            raise error(f"{where}: name {name!r} is not non-empty printable ASCII")
        if previous is not None and name.encode() <= previous.encode():
            raise error(f"{where}: {name!r} after {previous!r}: names must strictly ascend")
        previous = name


# -- well-formedness ----------------------------------------------------------------


def check_cert(cert: UnitCert) -> None:
    """Refuse a certificate that breaks the rules of specs/pol.md section 3.4.

    Raises:
        MalformedCertificate: says which rule, in one line.
    """
    _check_names([d.name for d in cert.inputs], "inputs", MalformedCertificate)
    _check_names([d.name for d in cert.outputs], "outputs", MalformedCertificate)
    _check_names([cert.device], "device", MalformedCertificate)
    inputs, outputs = digest_map(cert.inputs), digest_map(cert.outputs)
    if "h" not in inputs:
        raise MalformedCertificate("inputs: no 'h' (every unit reads its stage's states)")
    if not outputs:
        raise MalformedCertificate("outputs: none (every unit passes something on)")
    for field in ("loss_bits", "grad_norm_bits"):
        bits = getattr(cert, field)
        if bits != NONE_BITS and _is_nan(bits) and bits != NAN_BITS:
            raise MalformedCertificate(f"{field}: NaN {bits:#010x} is not the canonical "
                                       f"{NAN_BITS:#010x}")
    if (cert.loss_bits != NONE_BITS) != ("g" in outputs):
        raise MalformedCertificate("a loss goes with an output 'g' (dL/dy of the last forward) "
                                   "and only with it")
    if (cert.grads_hash == crypto.ZERO32) != (cert.grad_norm_bits == NONE_BITS):
        raise MalformedCertificate("grads_hash is zero exactly when grad_norm_bits is none")
    if cert.grad_norm_bits != NONE_BITS and cert.grad_norm_bits & 0x8000_0000 \
            and cert.grad_norm_bits != NAN_BITS:
        raise MalformedCertificate("grad_norm_bits: a norm is never negative")


def check_evidence(evidence: Evidence) -> None:
    """Refuse evidence that breaks the rules of specs/pol.md section 4.3.

    Only what the object itself shows is checked (its names, bit patterns
    and that its reason agrees with its own distances); whether the
    recomputation is right takes a re-execution.

    Raises:
        MalformedEvidence: says which rule, in one line.
    """
    ev = evidence
    if ev.reason >= len(REASONS):
        raise MalformedEvidence(f"reason {ev.reason} is not one of 0..{len(REASONS) - 1}")
    if ev.mode not in (EXACT, TOLERANCE):
        raise MalformedEvidence(f"mode {ev.mode} is neither exact (0) nor tolerance (1)")
    _check_names([d.name for d in ev.recomputed], "recomputed", MalformedEvidence)
    _check_names([d.name for d in ev.distances], "distances", MalformedEvidence)
    if ev.mode == EXACT:
        if ev.threshold_bits != 0 or ev.distances:
            raise MalformedEvidence("exact mode has no threshold (0) and no distances")
        return
    if ev.reason in _DIGEST_REASONS:
        raise MalformedEvidence(f"reason {REASONS[ev.reason]!r} is decided on digests: "
                                "exact mode only")
    threshold = bits_float(ev.threshold_bits)
    if threshold is None or not 0 < threshold < float("inf"):
        raise MalformedEvidence(f"threshold {ev.threshold_bits:#010x} is not a finite "
                                "positive float32")
    if not ev.distances:
        raise MalformedEvidence("tolerance mode needs at least one distance")
    worst = 0.0
    for d in ev.distances:
        bits = d.rel_max_err_bits
        if bits & 0x8000_0000 or _is_nan(bits):
            raise MalformedEvidence(f"distance {d.name!r}: {bits:#010x} is not a float32 "
                                    "in [0, +inf]")
        worst = max(worst, bits_float(bits))
    if (ev.reason == PASS) != (worst < threshold):
        raise MalformedEvidence(f"reason {REASONS[ev.reason]!r} contradicts the largest "
                                f"distance {worst:.3g} against the threshold {threshold:.3g}")


def decode_cert(data: bytes) -> UnitCert:
    """Decode and check a certificate's bytes.

    Raises:
        MalformedCertificate: not the canonical encoding of a well-formed
            `UnitCert` (the codec's reason, or the rule broken).
    """
    return _decode_checked(data, UnitCert, check_cert, MalformedCertificate, "a UnitCert")


def decode_evidence(data: bytes) -> Evidence:
    """Decode and check evidence bytes.

    Raises:
        MalformedEvidence: not the canonical encoding of well-formed `Evidence`.
    """
    return _decode_checked(data, Evidence, check_evidence, MalformedEvidence, "Evidence")


def _decode_checked(data: bytes, cls: type, check, error: type[Exception], what: str):
    """``decode(data, cls)``, then ``check`` it; a codec refusal raises ``error`` too."""
    try:
        obj = decode(data, cls)
    except DecodeError as exc:
        raise error(f"not {what}: {exc}") from None
    check(obj)
    return obj


# -- distances (section 7.2) ----------------------------------------------------------


def rel_max_err(committed: np.ndarray, recomputed: np.ndarray) -> float:
    """max |committed - recomputed| / max |recomputed|, in float64.

    The scale is the verifier's own tensor, so a worker cannot shrink its
    error by inflating what it committed.

    Args:
        committed: the tensor the worker committed (fetched by digest).
        recomputed: the verifier's re-execution of it.

    Returns:
        The distance; +inf when shapes differ or either holds a NaN or an
        infinity; 0.0 when both are all zeros.
    """
    a = np.asarray(committed, dtype=np.float64)
    b = np.asarray(recomputed, dtype=np.float64)
    if a.shape != b.shape or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("inf")
    if a.size == 0:
        return 0.0
    err = float(np.abs(a - b).max())
    scale = float(np.abs(b).max())
    if err == 0.0:
        return 0.0
    return err / scale if scale > 0.0 else float("inf")


def distance(name: str, committed: np.ndarray, recomputed: np.ndarray) -> Distance:
    """The `Distance` of one tensor (`rel_max_err` rounded to float32)."""
    return Distance(name, float32_bits(rel_max_err(committed, recomputed)))


def passes(distances: Iterable[Distance], threshold_bits: int = float32_bits(THRESHOLD)) -> bool:
    """Whether every distance is strictly under the threshold (section 7.3)."""
    threshold = bits_float(threshold_bits)
    if threshold is None:
        return False
    values = [bits_float(d.rel_max_err_bits) for d in distances]
    # NONE_BITS (None) and NaN never pass: a distance that is no number is no match.
    return all(v is not None and v < threshold for v in values)
