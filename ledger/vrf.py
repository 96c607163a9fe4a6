"""ECVRF-EDWARDS25519-SHA512-TAI (RFC 9381, suite 0x03) over a node's Ed25519 key.

A verifiable random function: ``prove(seed, alpha)`` gives an 80-byte proof
``pi`` whose output ``proof_to_hash(pi)`` (64 bytes) anyone can check
against the public key (``verify``), and for a given key and ``alpha``
exactly one output verifies. The block beacon (specs/ledger.md §5.1 step
4b, specs/pol.md 5) is this output, so a producer cannot grind it: its only
choice is to publish its block or not.

The group arithmetic is libsodium's (PyNaCl's ``crypto_*_ed25519``); only
the try-and-increment hash to the curve, which must accept any point on the
curve before clearing the cofactor, is done here, in affine coordinates
(three doublings per hash). Checked against RFC 9381 Appendix B.3 in
``tests/ledger/test_vrf.py``.

Departure from the RFC, stricter only: libsodium refuses a public key or a
``Gamma`` that is not in the prime-order subgroup (the RFC refuses only
small-order keys). An honest prover's key and ``Gamma`` always are, so
only proofs nobody honest makes are refused, and uniqueness is unchanged.
"""

from __future__ import annotations

import hashlib

from nacl import bindings as _na
from nacl.exceptions import CryptoError

from ledger.errors import BadBeacon as BadProof

SUITE = b"\x03"  # ECVRF-EDWARDS25519-SHA512-TAI
PROOF_BYTES, OUTPUT_BYTES = 80, 64
_P = 2**255 - 19
_Q = 2**252 + 27742317777372353535851937790883648493  # the prime subgroup's order
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)
_C_LEN = 16


def prove(seed: bytes, alpha: bytes) -> bytes:
    """The 80-byte proof ``Gamma || c || s`` of the key made from ``seed`` over ``alpha``.

    Args:
        seed: the 32-byte Ed25519 secret seed (RFC 8032 SK).
        alpha: the VRF input.

    Returns:
        pi (RFC 9381 5.1), deterministic in (seed, alpha).
    """
    digest = hashlib.sha512(seed).digest()
    x = _clamp(digest[:32]) % _Q
    y = _na.crypto_scalarmult_ed25519_base_noclamp(_scalar(x))
    h = _encode_to_curve(y, alpha)
    gamma = _na.crypto_scalarmult_ed25519_noclamp(_scalar(x), h)
    k = int.from_bytes(hashlib.sha512(digest[32:] + h).digest(), "little") % _Q
    c = _challenge(y, h, gamma, _na.crypto_scalarmult_ed25519_base_noclamp(_scalar(k)),
                   _na.crypto_scalarmult_ed25519_noclamp(_scalar(k), h))
    s = (k + c * x) % _Q
    return gamma + c.to_bytes(_C_LEN, "little") + s.to_bytes(32, "little")


def proof_to_hash(pi: bytes) -> bytes:
    """The 64-byte VRF output of a proof (RFC 9381 5.2); check the proof with `verify`.

    Raises:
        BadProof: ``pi`` is not 80 bytes or its ``Gamma`` is no usable point.
    """
    if len(pi) != PROOF_BYTES:
        raise BadProof(f"a VRF proof is {PROOF_BYTES} bytes, not {len(pi)}")
    try:
        cleared = _na.crypto_scalarmult_ed25519_noclamp(_scalar(8), pi[:32])
    except CryptoError:
        raise BadProof("the proof's Gamma is not a point of the prime-order group") from None
    return hashlib.sha512(SUITE + b"\x03" + cleared + b"\x00").digest()


def verify(public: bytes, alpha: bytes, pi: bytes) -> bytes:
    """Check ``pi`` under ``public`` over ``alpha`` (RFC 9381 5.3); returns the output.

    Raises:
        BadProof: the proof does not verify (a wrong length, a point that
            does not decode, ``s`` not below the group order, or the
            challenge does not match).
    """
    beta = proof_to_hash(pi)
    gamma, c, s = pi[:32], int.from_bytes(pi[32:48], "little"), int.from_bytes(pi[48:], "little")
    if s >= _Q:
        raise BadProof("the proof's s is not below the group order")
    if len(public) != 32:
        raise BadProof("a VRF public key is 32 bytes")
    try:
        h = _encode_to_curve(public, alpha)
        u = _na.crypto_core_ed25519_sub(_na.crypto_scalarmult_ed25519_base_noclamp(_scalar(s)),
                                        _na.crypto_scalarmult_ed25519_noclamp(_scalar(c), public))
        v = _na.crypto_core_ed25519_sub(_na.crypto_scalarmult_ed25519_noclamp(_scalar(s), h),
                                        _na.crypto_scalarmult_ed25519_noclamp(_scalar(c), gamma))
    except CryptoError:
        raise BadProof("the key or the proof holds a point outside the prime-order group") \
            from None
    if _challenge(public, h, gamma, u, v) != c:
        raise BadProof("the proof's challenge does not match: not this key's output for this "
                       "input")
    return beta


# -- RFC 9381 5.4 helpers --------------------------------------------------------------


def _challenge(*points: bytes) -> int:
    digest = hashlib.sha512(SUITE + b"\x02" + b"".join(points) + b"\x00").digest()
    return int.from_bytes(digest[:_C_LEN], "little")


def _encode_to_curve(salt: bytes, alpha: bytes) -> bytes:
    """Try-and-increment (5.4.1.1): the first counter whose hash decodes, times the cofactor."""
    for ctr in range(256):
        digest = hashlib.sha512(SUITE + b"\x01" + salt + alpha + bytes([ctr]) + b"\x00").digest()
        point = _decode(digest[:32])
        if point is not None:
            for _ in range(3):  # the cofactor, 8
                point = _add(point, point)
            if point != (0, 1):
                return _encode(point)
    # Each try succeeds with probability about 1/2: 256 failures do not happen.
    raise BadProof("no counter hashed to a curve point")


def _decode(raw: bytes) -> tuple[int, int] | None:
    """RFC 8032 5.1.3: the point of a 32-byte encoding, or None."""
    y = int.from_bytes(raw, "little")
    sign, y = y >> 255, y & ((1 << 255) - 1)
    if y >= _P:
        return None
    x2 = (y * y - 1) * pow(_D * y * y + 1, _P - 2, _P) % _P
    if x2 == 0:
        return None if sign else (0, y)
    x = pow(x2, (_P + 3) // 8, _P)
    if (x * x - x2) % _P:
        x = x * _SQRT_M1 % _P
    if (x * x - x2) % _P:
        return None
    return (_P - x if (x & 1) != sign else x), y


def _add(p1: tuple[int, int], p2: tuple[int, int]) -> tuple[int, int]:
    (x1, y1), (x2, y2) = p1, p2
    t = _D * x1 * x2 * y1 * y2 % _P
    x3 = (x1 * y2 + y1 * x2) * pow(1 + t, _P - 2, _P) % _P
    y3 = (y1 * y2 + x1 * x2) * pow(1 - t, _P - 2, _P) % _P
    return x3, y3


def _encode(point: tuple[int, int]) -> bytes:
    x, y = point
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


def _clamp(raw: bytes) -> int:
    value = int.from_bytes(raw, "little")
    return (value & ~7 & ((1 << 254) - 1)) | (1 << 254)


def _scalar(value: int) -> bytes:
    return value.to_bytes(32, "little")
