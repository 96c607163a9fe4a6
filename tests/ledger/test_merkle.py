"""Tests for ledger.merkle against the literal RFC 6962 reference."""

from __future__ import annotations

import dataclasses
import hashlib
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.merkle import (
    EMPTY_ROOT,
    Frontier,
    consistency_proof,
    consistency_proof_from_hashes,
    inclusion_proof,
    inclusion_proof_from_hashes,
    leaf_hash,
    merkle_root,
    node_hash,
    root_from_hashes,
    verify_consistency,
    verify_inclusion,
)
from tests.ledger import merkle_reference as ref


def make_leaves(n: int, salt: bytes = b"") -> list[bytes]:
    """Distinct leaves of varying length, including the empty leaf."""
    return [salt + i.to_bytes((i.bit_length() + 7) // 8, "big") for i in range(n)]


def flip_bit(h: bytes, bit: int = 0) -> bytes:
    """Return ``h`` with one bit flipped."""
    b = bytearray(h)
    b[bit // 8 % len(b)] ^= 1 << (bit % 8)
    return bytes(b)


# --------------------------------------------------------------------------
# Known answers
# --------------------------------------------------------------------------

# The eight leaves used by the certificate-transparency merkle tree tests.
CT_LEAVES = [
    b"",
    b"\x00",
    b"\x10",
    b"\x20\x21",
    b"\x30\x31",
    b"\x40\x41\x42\x43",
    bytes(range(0x50, 0x58)),
    bytes(range(0x60, 0x70)),
]
# Roots of the first 1..8 of those leaves, computed with merkle_reference
# (they match the published certificate-transparency vectors).
CT_ROOTS = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
CT_PATH_0_OF_8 = [
    "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
    "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
    "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
]
CT_CONSISTENCY_6_TO_8 = [
    "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
    "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
]


def test_empty_root_known_answer():
    expected = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert EMPTY_ROOT.hex() == expected
    assert merkle_root([]).hex() == expected
    assert root_from_hashes([]).hex() == expected
    assert Frontier.empty().root().hex() == expected


@pytest.mark.parametrize("n", range(1, 9))
def test_ct_roots(n):
    assert merkle_root(CT_LEAVES[:n]).hex() == CT_ROOTS[n - 1]
    assert ref.mth(CT_LEAVES[:n]).hex() == CT_ROOTS[n - 1]


def test_ct_proofs():
    assert [h.hex() for h in inclusion_proof(CT_LEAVES, 0)] == CT_PATH_0_OF_8
    # PROOF(1, D[8]) is the audit path of leaf 0.
    assert [h.hex() for h in consistency_proof(CT_LEAVES, 1)] == CT_PATH_0_OF_8
    assert [h.hex() for h in consistency_proof(CT_LEAVES, 6)] == CT_CONSISTENCY_6_TO_8
    root6, root8 = bytes.fromhex(CT_ROOTS[5]), bytes.fromhex(CT_ROOTS[7])
    proof = [bytes.fromhex(h) for h in CT_CONSISTENCY_6_TO_8]
    assert verify_consistency(6, 8, root6, root8, proof)


def test_primitives():
    assert leaf_hash(b"abc") == hashlib.sha256(b"\x00abc").digest()
    a, b = leaf_hash(b"a"), leaf_hash(b"b")
    assert node_hash(a, b) == hashlib.sha256(b"\x01" + a + b).digest()
    assert merkle_root([b"abc"]) == leaf_hash(b"abc")


# --------------------------------------------------------------------------
# Exhaustive small trees against the reference
# --------------------------------------------------------------------------


@pytest.mark.parametrize("n", range(0, 65))
def test_small_trees_match_reference(n):
    leaves = make_leaves(n)
    hashes = [leaf_hash(x) for x in leaves]
    root = ref.mth(leaves)
    assert merkle_root(leaves) == root
    assert root_from_hashes(hashes) == root
    for i in range(n):
        proof = inclusion_proof(leaves, i)
        assert proof == ref.path(i, leaves)
        assert inclusion_proof_from_hashes(hashes, i) == proof
        assert verify_inclusion(leaves[i], i, n, proof, root)
    for m in range(n + 1):
        proof = consistency_proof(leaves, m)
        assert proof == ref.proof(m, leaves)
        assert consistency_proof_from_hashes(hashes, m) == proof
        assert verify_consistency(m, n, ref.mth(leaves[:m]), root, proof)


@pytest.mark.parametrize("n", [65, 127, 128, 129, 255, 256, 257, 1000, 1023, 1025, 3000])
def test_larger_trees_match_reference(n):
    rng = random.Random(6962 + n)
    leaves = [rng.randbytes(rng.randrange(0, 40)) for _ in range(n)]
    root = ref.mth(leaves)
    assert merkle_root(leaves) == root
    for i in {0, n - 1, *(rng.randrange(n) for _ in range(6))}:
        proof = inclusion_proof(leaves, i)
        assert proof == ref.path(i, leaves)
        assert verify_inclusion(leaves[i], i, n, proof, root)
    for m in {0, 1, n - 1, n, *(rng.randrange(n) for _ in range(6))}:
        proof = consistency_proof(leaves, m)
        assert proof == ref.proof(m, leaves)
        assert verify_consistency(m, n, ref.mth(leaves[:m]), root, proof)


def test_power_of_two_boundaries_iterative_root():
    # Around powers of two the carried-up lone node is easiest to get wrong.
    for n in (4095, 4096, 4097, 6143, 6144, 6145):
        leaves = make_leaves(n, b"p")
        assert merkle_root(leaves) == ref.mth(leaves)


# --------------------------------------------------------------------------
# Proof generation errors
# --------------------------------------------------------------------------


def test_inclusion_proof_bad_index():
    leaves = make_leaves(5)
    with pytest.raises(IndexError):
        inclusion_proof(leaves, 5)
    with pytest.raises(IndexError):
        inclusion_proof([], 0)
    with pytest.raises(ValueError):
        inclusion_proof(leaves, -1)
    with pytest.raises(TypeError):
        inclusion_proof(leaves, True)
    with pytest.raises(TypeError):
        inclusion_proof(leaves, 1.0)


def test_consistency_proof_bad_size():
    leaves = make_leaves(5)
    with pytest.raises(ValueError):
        consistency_proof(leaves, 6)
    with pytest.raises(ValueError):
        consistency_proof(leaves, -1)
    with pytest.raises(TypeError):
        consistency_proof(leaves, False)
    assert consistency_proof(leaves, 0) == []
    assert consistency_proof(leaves, 5) == []


def test_hash_inputs_validated():
    good = leaf_hash(b"x")
    with pytest.raises(ValueError):
        root_from_hashes([good, good[:31]])
    with pytest.raises(TypeError):
        root_from_hashes([good, "x" * 32])
    with pytest.raises(TypeError):
        root_from_hashes([None])
    with pytest.raises(ValueError):
        inclusion_proof_from_hashes([good, b"short"], 0)
    with pytest.raises(ValueError):
        consistency_proof_from_hashes([good, b"short"], 1)
    with pytest.raises(TypeError):
        merkle_root([b"ok", 7])


# --------------------------------------------------------------------------
# Verification: negative cases
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tree13():
    leaves = make_leaves(13)
    return leaves, merkle_root(leaves)


@pytest.mark.parametrize("i", range(13))
def test_inclusion_tampering_fails(tree13, i):
    leaves, root = tree13
    n = len(leaves)
    proof = inclusion_proof(leaves, i)
    assert verify_inclusion(leaves[i], i, n, proof, root)
    assert not verify_inclusion(leaves[i] + b"!", i, n, proof, root)
    assert not verify_inclusion(leaves[i], (i + 1) % n, n, proof, root)
    for size in range(1, 3 * n):
        # A size whose tree gives this index a different path shape must fail
        # (same-shape sizes cannot be told apart: see test_size_not_committed).
        if size >= i + 1 and len(ref.path(i, leaves[:1] * size)) == len(proof):
            continue
        assert not verify_inclusion(leaves[i], i, size, proof, root), size
    assert not verify_inclusion(leaves[i], i, n, proof[:-1], root)
    assert not verify_inclusion(leaves[i], i, n, proof + [root], root)
    assert not verify_inclusion(leaves[i], i, n, [EMPTY_ROOT] + proof, root)
    assert not verify_inclusion(leaves[i], i, n, proof, flip_bit(root, 255))
    for k in range(len(proof)):
        for bit in (0, 77, 255):
            bad = list(proof)
            bad[k] = flip_bit(bad[k], bit)
            assert not verify_inclusion(leaves[i], i, n, bad, root)


@pytest.mark.parametrize("m", range(1, 13))
def test_consistency_tampering_fails(tree13, m):
    leaves, root = tree13
    n = len(leaves)
    old_root = merkle_root(leaves[:m])
    proof = consistency_proof(leaves, m)
    assert verify_consistency(m, n, old_root, root, proof)
    assert not verify_consistency(m, n, flip_bit(old_root), root, proof)
    assert not verify_consistency(m, n, old_root, flip_bit(root), proof)
    for size in range(m + 1, 3 * n):
        if size != n and len(ref.proof(m, leaves[:1] * size)) != len(proof):
            assert not verify_consistency(m, size, old_root, root, proof), size
    assert not verify_consistency(m + 1, n, old_root, root, proof)
    assert not verify_consistency(m - 1, n, old_root, root, proof)
    assert not verify_consistency(m, n, old_root, root, proof[:-1])
    assert not verify_consistency(m, n, old_root, root, proof + [root])
    assert not verify_consistency(m, n, old_root, root, [old_root] + proof)
    assert not verify_consistency(n, m, root, old_root, proof)
    for k in range(len(proof)):
        bad = list(proof)
        bad[k] = flip_bit(bad[k], 129)
        assert not verify_consistency(m, n, old_root, root, bad)


def test_size_not_committed(tree13):
    """The root does not commit to the tree size by itself.

    Leaf 0 of 13 has the same all-left path shape in a tree of 14, so the
    verifier cannot tell the sizes apart: (size, root) must be authenticated
    together, as RFC 6962 signed tree heads do.
    """
    leaves, root = tree13
    proof = inclusion_proof(leaves, 0)
    assert verify_inclusion(leaves[0], 0, 14, proof, root)
    assert not verify_inclusion(leaves[0], 0, 17, proof, root)
    cproof = consistency_proof(leaves, 5)
    assert verify_consistency(5, 14, merkle_root(leaves[:5]), root, cproof)


def test_consistency_edge_sizes(tree13):
    leaves, root = tree13
    other = merkle_root(leaves[:3])
    assert verify_consistency(13, 13, root, root, [])
    assert not verify_consistency(13, 13, root, other, [])
    assert not verify_consistency(13, 13, root, root, [root])
    assert verify_consistency(0, 13, EMPTY_ROOT, root, [])
    assert verify_consistency(0, 13, other, root, [])  # old root is meaningless
    assert not verify_consistency(0, 13, EMPTY_ROOT, root, [root])
    assert verify_consistency(0, 0, EMPTY_ROOT, EMPTY_ROOT, [])
    assert not verify_consistency(-1, 13, root, root, [])
    assert not verify_consistency(14, 13, root, root, [])


def test_verify_rejects_malformed_arguments(tree13):
    leaves, root = tree13
    proof = inclusion_proof(leaves, 3)
    ok = (leaves[3], 3, 13, proof, root)
    assert verify_inclusion(*ok)
    assert verify_inclusion(leaves[3], 3, 13, tuple(proof), root)
    assert verify_inclusion(bytearray(leaves[3]), 3, 13, [bytearray(p) for p in proof], bytearray(root))
    for pos, bad in [
        (0, None), (0, "text"), (0, 3),
        (1, True), (1, 3.0), (1, None), (1, -1), (1, "3"),
        (2, True), (2, 13.0), (2, 0), (2, -13), (2, None),
        (3, None), (3, b"".join(proof)), (3, [p.hex() for p in proof]), (3, iter(proof)),
        (3, [None] * len(proof)), (3, [p[:31] for p in proof]), (3, [p + b"\0" for p in proof]),
        (3, proof[:1] + [1] + proof[2:]), (3, {p: 1 for p in proof}),
        (4, None), (4, root[:31]), (4, root + b"\0"), (4, root.hex()),
    ]:
        args = list(ok)
        args[pos] = bad
        assert verify_inclusion(*args) is False, (pos, bad)
    cproof = consistency_proof(leaves, 5)
    cok = (5, 13, merkle_root(leaves[:5]), root, cproof)
    assert verify_consistency(*cok)
    for pos, bad in [
        (0, True), (0, 5.0), (0, None), (0, -5),
        (1, 13.0), (1, None), (1, True), (1, -13),
        (2, None), (2, b"x"), (2, 5),
        (3, None), (3, root[:-1]), (3, root.hex()),
        (4, None), (4, b"".join(cproof)), (4, [None]), (4, [p[:-1] for p in cproof]), (4, "abc"),
    ]:
        args = list(cok)
        args[pos] = bad
        assert verify_consistency(*args) is False, (pos, bad)


# --------------------------------------------------------------------------
# Hypothesis: verifiers never raise; proofs are not transferable
# --------------------------------------------------------------------------

anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=0, max_value=40),
    st.binary(max_size=40),
    st.binary(min_size=32, max_size=32),
    st.text(max_size=10),
    st.floats(allow_nan=True),
    st.lists(st.binary(max_size=40), max_size=70),
    st.lists(st.binary(min_size=32, max_size=32), max_size=12),
    st.lists(st.one_of(st.none(), st.integers(), st.binary(min_size=32, max_size=32)), max_size=6),
    st.tuples(st.binary(min_size=32, max_size=32)),
)


@settings(max_examples=400, deadline=None)
@given(anything, anything, anything, anything, anything)
def test_verify_inclusion_never_raises(leaf, index, size, proof, root):
    assert verify_inclusion(leaf, index, size, proof, root) in (True, False)


@settings(max_examples=400, deadline=None)
@given(anything, anything, anything, anything, anything)
def test_verify_consistency_never_raises(old_size, new_size, old_root, new_root, proof):
    assert verify_consistency(old_size, new_size, old_root, new_root, proof) in (True, False)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=0, max_value=12),
    st.integers(min_value=0, max_value=40),
    st.lists(st.binary(min_size=32, max_size=32), max_size=14),
)
def test_random_hash_proofs_do_not_verify(index, size, proof):
    root = leaf_hash(b"root")
    assert not verify_inclusion(b"leaf", index, size, proof, root)
    if index > 0:  # an empty old tree is consistent with anything
        assert not verify_consistency(index, size, leaf_hash(b"old"), root, proof)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=8), min_size=2, max_size=80, unique=True), st.data())
def test_proof_for_one_leaf_never_verifies_another(leaves, data):
    n = len(leaves)
    i = data.draw(st.integers(0, n - 1), label="i")
    j = data.draw(st.integers(0, n - 1).filter(lambda j: j != i), label="j")
    root = merkle_root(leaves)
    proof = inclusion_proof(leaves, i)
    assert verify_inclusion(leaves[i], i, n, proof, root)
    assert not verify_inclusion(leaves[j], i, n, proof, root)
    assert not verify_inclusion(leaves[j], j, n, proof, root)
    assert not verify_inclusion(leaves[i], j, n, proof, root)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 90), st.data())
def test_consistency_random_sizes(n, data):
    m = data.draw(st.integers(0, n), label="old_size")
    leaves = make_leaves(n, b"c")
    old_root, new_root = merkle_root(leaves[:m]), merkle_root(leaves)
    proof = consistency_proof(leaves, m)
    assert verify_consistency(m, n, old_root, new_root, proof)
    if 0 < m < n:
        # A different history of the same length must not pass.
        forged = merkle_root(make_leaves(m, b"f"))
        assert not verify_consistency(m, n, forged, new_root, proof)


# --------------------------------------------------------------------------
# Frontier
# --------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=6), max_size=140))
def test_frontier_matches_root_at_every_prefix(leaves):
    frontier = Frontier.empty()
    hashes: list[bytes] = []
    for data in leaves:
        h = leaf_hash(data)
        nxt = frontier.append(h)
        assert frontier.size == len(hashes)  # the old value is untouched
        frontier = nxt
        hashes.append(h)
        assert frontier.size == len(hashes)
        assert len(frontier.peaks) == frontier.size.bit_count()
        assert frontier.root() == root_from_hashes(hashes)


def test_frontier_long_run_matches_reference():
    leaves = make_leaves(1500, b"fr")
    frontier = Frontier.empty()
    for k, data in enumerate(leaves, start=1):
        frontier = frontier.append(leaf_hash(data))
        if k & (k - 1) == 0 or k % 97 == 0 or k == len(leaves):
            assert frontier.root() == ref.mth(leaves[:k])
    # Peaks are the roots of the perfect subtrees, largest first.
    assert frontier.peaks == (
        ref.mth(leaves[0:1024]),
        ref.mth(leaves[1024:1280]),
        ref.mth(leaves[1280:1408]),
        ref.mth(leaves[1408:1472]),
        ref.mth(leaves[1472:1488]),
        ref.mth(leaves[1488:1496]),
        ref.mth(leaves[1496:1500]),
    )


def test_frontier_validation():
    h = leaf_hash(b"x")
    with pytest.raises(ValueError):
        Frontier(3, (h,))
    with pytest.raises(ValueError):
        Frontier(1, (h[:31],))
    with pytest.raises(ValueError):
        Frontier(-1, ())
    with pytest.raises(TypeError):
        Frontier(True, (h,))
    with pytest.raises(ValueError):
        Frontier.empty().append(b"short")
    with pytest.raises(TypeError):
        Frontier.empty().append("x" * 32)
    f = Frontier.empty().append(h)
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.size = 5  # type: ignore[misc]
    assert Frontier(1, (h,)) == f
