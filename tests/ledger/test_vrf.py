"""ECVRF-EDWARDS25519-SHA512-TAI against RFC 9381 Appendix B.3, and its refusals."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from ledger import vrf
from ledger.crypto import SigningKey
from ledger.errors import BadBeacon

# RFC 9381 B.3, Examples 16-18 (keys of RFC 8032 7.1, tests 1-3).
VECTORS = [
    ("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
     "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
     "8657106690b5526245a92b003bb079ccd1a92130477671f6fc01ad16f26f723f26f8a57ccaed74ee1b190bed1f4"
     "79d9727d2d0f9b005a6e456a35d4fb0daab1268a1b0db10836d9826a528ca76567805",
     "90cf1df3b703cce59e2a35b925d411164068269d7b2d29f3301c03dd757876ff66b71dda49d2de59d03450451af"
     "026798e8f81cd2e333de5cdf4f3e140fdd8ae"),
    ("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
     "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
     "f3141cd382dc42909d19ec5110469e4feae18300e94f304590abdced48aed5933bf0864a62558b3ed7f2fea45c9"
     "2a465301b3bbf5e3e54ddf2d935be3b67926da3ef39226bbc355bdc9850112c8f4b02",
     "eb4440665d3891d668e7e0fcaf587f1b4bd7fbfe99d0eb2211ccec90496310eb5e33821bc613efb94db5e5b54c7"
     "0a848a0bef4553a41befc57663b56373a5031"),
    ("c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
     "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025", "af82",
     "9bc0f79119cc5604bf02d23b4caede71393cedfbb191434dd016d30177ccbf8096bb474e53895c362d8628ee9f9"
     "ea3c0e52c7a5c691b6c18c9979866568add7a2d41b00b05081ed0f58ee5e31b3a970e",
     "645427e5d00c62a23fb703732fa5d892940935942101e456ecca7bb217c61c452118fec1219202a0edcf038bb63"
     "73241578be7217ba85a2687f7a0310b2df19f"),
]


@pytest.mark.parametrize("sk, pk, alpha, pi, beta", VECTORS)
def test_rfc_9381_vectors(sk, pk, alpha, pi, beta):
    seed, alpha = bytes.fromhex(sk), bytes.fromhex(alpha)
    assert SigningKey(seed).public.hex() == pk  # the VRF key is the node's Ed25519 key
    assert vrf.prove(seed, alpha).hex() == pi
    assert vrf.proof_to_hash(bytes.fromhex(pi)).hex() == beta
    assert vrf.verify(bytes.fromhex(pk), alpha, bytes.fromhex(pi)).hex() == beta


@pytest.mark.parametrize("sk, pk, alpha, pi, beta", VECTORS[:1])
def test_any_flipped_bit_is_refused(sk, pk, alpha, pi, beta):
    pi = bytes.fromhex(pi)
    for i in range(len(pi) * 8):
        bad = bytearray(pi)
        bad[i // 8] ^= 1 << (i % 8)
        with pytest.raises(BadBeacon):
            vrf.verify(bytes.fromhex(pk), bytes.fromhex(alpha), bytes(bad))


def test_another_key_or_input_is_refused():
    seed, other = bytes(range(32)), bytes(range(1, 33))
    pi = vrf.prove(seed, b"block 7")
    with pytest.raises(BadBeacon, match="challenge"):
        vrf.verify(SigningKey(seed).public, b"block 8", pi)
    with pytest.raises(BadBeacon):
        vrf.verify(SigningKey(other).public, b"block 7", pi)
    with pytest.raises(BadBeacon, match="80 bytes"):
        vrf.verify(SigningKey(seed).public, b"block 7", pi[:79])
    small_order = bytes.fromhex("0100000000000000000000000000000000000000000000000000000000000000")
    with pytest.raises(BadBeacon):
        vrf.verify(small_order, b"block 7", pi)


@settings(max_examples=25, deadline=None)
@given(seed=st.binary(min_size=32, max_size=32), alpha=st.binary(max_size=64))
def test_prove_then_verify_is_unique(seed, alpha):
    """Every proof made verifies, and gives the one output for (key, alpha)."""
    pi = vrf.prove(seed, alpha)
    assert vrf.verify(SigningKey(seed).public, alpha, pi) == vrf.proof_to_hash(pi)
    assert vrf.prove(seed, alpha) == pi


@settings(max_examples=50, deadline=None)
@given(junk=st.binary(min_size=80, max_size=80), alpha=st.binary(max_size=8))
def test_junk_proofs_never_verify_and_never_crash(junk, alpha):
    with pytest.raises(BadBeacon):
        vrf.verify(SigningKey(bytes(32)).public, alpha, junk)
