"""Signatures and hashing: domain separation and refusal of weak keys."""

from __future__ import annotations

from hypothesis import given, strategies as st

from ledger import crypto
from ledger.crypto import SigningKey, is_weak_public_key, verify

P = 2**255 - 19


def _small_order_encodings() -> list[bytes]:
    """Encodings of the 8 points of order dividing 8, found by brute force on y.

    Built independently of ledger.crypto's doubling: a point of small order
    has y in {1, p-1, 0} or is a 4-/8-torsion point; we take the identity,
    the order-2 point and the order-4 points directly, which need no search.
    """
    identity = (1).to_bytes(32, "little")             # (0, 1)
    order2 = (P - 1).to_bytes(32, "little")           # (0, -1)
    order4 = bytes(32)                                # (+-sqrt(-1), 0), sign 0
    order4_neg = bytes(31) + b"\x80"                  # sign 1
    return [identity, order2, order4, order4_neg]


def test_small_order_keys_are_weak():
    for raw in _small_order_encodings():
        assert is_weak_public_key(raw), raw.hex()


def test_forged_signature_under_the_identity_key_is_refused():
    # Under the identity point, R = identity and S = 0 satisfies the
    # (cofactorless) verification equation for every message.
    identity = (1).to_bytes(32, "little")
    forged = identity + bytes(32)
    assert verify(identity, b"d", b"any message", forged) is False


def test_non_canonical_key_is_weak():
    non_canonical = (P + 1).to_bytes(32, "little")  # y = p + 1 (means y = 1)
    assert is_weak_public_key(non_canonical)


@given(st.binary(min_size=32, max_size=32))
def test_real_keys_are_not_weak(seed):
    assert not is_weak_public_key(SigningKey(seed).public)


def test_signature_is_bound_to_its_domain():
    key = SigningKey(b"\x07" * 32)
    sig = key.sign(crypto.S_TX, b"message")
    assert verify(key.public, crypto.S_TX, b"message", sig)
    assert not verify(key.public, crypto.S_HEADER, b"message", sig)
    assert not verify(key.public, crypto.S_TX, b"messagf", sig)


@given(st.binary(), st.binary(), st.binary(), st.binary())
def test_verify_never_raises(key, domain, message, sig):
    assert verify(key, domain, message, sig) in (True, False)
