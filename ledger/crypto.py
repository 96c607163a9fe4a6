"""Hashing and Ed25519 signatures, with domain separation.

Every hash and signature in pnode is taken over ``domain || bytes``, where the
domain names what is being hashed or signed. Two objects of different kinds
can therefore never share a hash or a signature even if their encodings
collide. Domains are ASCII and start with ``pnode:``, so they never collide
with the RFC 6962 Merkle prefixes 0x00 and 0x01 either.

Keys are raw 32-byte Ed25519 public keys; an account id is its public key.
This module draws no randomness: callers hand it a 32-byte seed.
"""

from __future__ import annotations

import functools
import hashlib

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ledger.errors import PeerIdError

# Hash domains.
H_TX = b"pnode:tx:"
H_HEADER = b"pnode:header:"
H_UNIT = b"pnode:unit:"
H_CERT = b"pnode:cert:"  # a compute block's PoL certificate (specs/pol.md)
H_EVIDENCE = b"pnode:evidence:"  # a verifier's PoL evidence (specs/pol.md)
H_AUDIT = b"pnode:audit:"  # the audit draw's seed per receipt (specs/pol.md)
H_SPOT = b"pnode:spot:"  # a spot case's id: the accused key and claim (specs/ledger.md 5.2)
H_STATE = b"pnode:state:"
H_POL_STATE = b"pnode:pol-state:"  # a held part's full state at a step (specs/pol.md 8)
H_TIEBREAK = b"pnode:tiebreak:"
H_BEACON = b"pnode:beacon:"  # a block's VRF beacon (specs/ledger.md 5.1)
H_GENESIS = b"pnode:genesis:"

# Signature domains.
S_TX = b"pnode:sign:tx:"
S_HEADER = b"pnode:sign:header:"
S_BIND = b"pnode:sign:bind:"
S_BIND_PEER = b"pnode:sign:bind-peer:"
S_USAGE = b"pnode:sign:usage:"  # retired with InferencePayment (specs/ledger.md 2.1)
S_VOUCHER = b"pnode:sign:voucher:"  # a tab's voucher, signed by its client (specs/ledger.md 4.5)
S_CERT = b"pnode:sign:cert:"

ZERO32 = bytes(32)


def sha256(data: bytes) -> bytes:
    """Plain SHA-256; prefer ``domain_hash`` for anything with a meaning."""
    return hashlib.sha256(data).digest()


def domain_hash(domain: bytes, data: bytes) -> bytes:
    """SHA-256 of ``domain || data``."""
    return hashlib.sha256(domain + data).digest()


class SigningKey:
    """An Ed25519 private key made from a 32-byte seed the caller supplies."""

    __slots__ = ("_key", "public")

    def __init__(self, seed: bytes):
        """
        Args:
            seed: 32 secret bytes (from os.urandom at the edge, or a test seed).

        Raises:
            ValueError: the seed is not 32 bytes.
        """
        if not isinstance(seed, bytes) or len(seed) != 32:
            raise ValueError("an Ed25519 seed is 32 bytes")
        self._key = Ed25519PrivateKey.from_private_bytes(seed)
        self.public: bytes = self._key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    def sign(self, domain: bytes, message: bytes) -> bytes:
        """Sign ``domain || message``; returns 64 bytes."""
        return self._key.sign(domain + message)

    def seed(self) -> bytes:
        """The 32-byte secret seed (for writing a key file)."""
        return self._key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )


_P = 2**255 - 19

# The 8 points of small order (8P = identity), canonically encoded, and the two
# x = 0 points with the sign bit set (non-canonical, yet some verifiers decode
# them). Derived and checked against curve arithmetic in tests/ledger/test_crypto.py.
_SMALL_ORDER = frozenset(bytes.fromhex(h) for h in (
    "0100000000000000000000000000000000000000000000000000000000000000",  # identity
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",  # order 2
    "0000000000000000000000000000000000000000000000000000000000000000",  # order 4
    "0000000000000000000000000000000000000000000000000000000000000080",  # order 4
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",  # order 8
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",  # order 8
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",  # order 8
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",  # order 8
    "0100000000000000000000000000000000000000000000000000000000000080",  # identity, x=0 signed
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",  # order 2, x=0 signed
))


def is_weak_public_key(raw: bytes) -> bool:
    """True for keys a signature must never be accepted under.

    Attack note: OpenSSL's Ed25519 verify accepts public keys of small order
    (8P = identity), for which signatures can be forged without a secret,
    and non-canonical encodings (y >= p). An account, node key or verifier
    with such a key could be impersonated by anyone; a strict verifier
    (libsodium) would also disagree with OpenSSL on them and split
    consensus. So pnode refuses them everywhere. (Off-curve keys need no
    rule: no verifier accepts a signature under them.)
    """
    y = int.from_bytes(raw, "little") & ((1 << 255) - 1)
    return y >= _P or raw in _SMALL_ORDER


@functools.lru_cache(maxsize=65536)
def _public_key(raw: bytes) -> Ed25519PublicKey | None:
    if is_weak_public_key(raw):
        return None
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        return None


def verify(public_key: bytes, domain: bytes, message: bytes, signature: bytes) -> bool:
    """Check an Ed25519 signature over ``domain || message``.

    Returns False (never raises) for a malformed key or signature, and for
    weak public keys (see ``is_weak_public_key``).
    """
    if not isinstance(public_key, bytes) or len(public_key) != 32:
        return False
    if not isinstance(signature, bytes) or len(signature) != 64:
        return False
    key = _public_key(public_key)
    if key is None:
        return False
    try:
        key.verify(signature, domain + message)
    except InvalidSignature:
        return False
    return True


# PublicKey{Type: Ed25519, Data: 32 bytes}, and the identity-multihash prefix of it.
_ED25519_PROTO = b"\x08\x01\x12\x20"
_PEER_ID_PREFIX = b"\x00\x24" + _ED25519_PROTO


def libp2p_peer_id(public_key: bytes) -> bytes:
    """The libp2p peer id of an Ed25519 key: identity multihash of its protobuf form.

    PublicKey{Type: Ed25519 (1), Data: key} is 0x08 0x01 0x12 0x20 || key
    (36 bytes, under the 42-byte inlining limit), so the multihash is
    0x00 (identity) 0x24 (length) || that.
    """
    proto = _ED25519_PROTO + public_key
    return b"\x00" + bytes([len(proto)]) + proto


def peer_public_key(peer_id: bytes) -> bytes:
    """The Ed25519 public key inside a libp2p peer id (the inverse of `libp2p_peer_id`).

    Args:
        peer_id: peer id bytes, as a `Register` carries them.

    Returns:
        The raw 32-byte key.

    Raises:
        PeerIdError: not the identity multihash of an Ed25519 key: e.g. a
            sha2-256 peer id (RSA, secp256k1 keys), whose key cannot be
            recovered from the id and so can sign nothing the ledger checks.
    """
    if not isinstance(peer_id, bytes) or len(peer_id) != len(_PEER_ID_PREFIX) + 32 \
            or not peer_id.startswith(_PEER_ID_PREFIX):
        shown = peer_id[:8].hex() if isinstance(peer_id, bytes) else type(peer_id).__name__
        raise PeerIdError(f"peer id {shown}.. is not a libp2p peer id with an inlined Ed25519 "
                          "key (identity multihash 0024 080112 20 || 32-byte key)")
    return peer_id[len(_PEER_ID_PREFIX):]
