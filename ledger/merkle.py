"""RFC 6962 Merkle hash trees: roots, inclusion and consistency proofs.

Owns the ledger's Merkle arithmetic: the RFC 6962 section 2.1 hashing rules
(SHA-256, 0x00 leaf / 0x01 node prefixes, SHA-256("") for the empty tree,
split at the largest power of two below n, no duplicated leaves), proof
generation (RFC 6962 2.1.1, 2.1.2), proof verification (RFC 9162 2.1.3.2,
2.1.4.2; never raises, malformed input just fails) and :class:`Frontier`,
an append-only accumulator giving a growing log's root in O(log n).
Raw-leaf functions hash and delegate to the ``*_from_hashes`` variants.

A root alone does not commit to the tree size (leaf 0 of 13 has the same
path in a tree of 14): authenticate (size, root) together, as signed tree
heads do. Pure core: stdlib only, no clock, no I/O, no randomness.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional, Sequence

__all__ = [
    "HASH_SIZE", "EMPTY_ROOT", "leaf_hash", "node_hash", "merkle_root", "root_from_hashes",
    "inclusion_proof", "inclusion_proof_from_hashes", "verify_inclusion", "Frontier",
    "consistency_proof", "consistency_proof_from_hashes", "verify_consistency",
]  # fmt: skip

HASH_SIZE = 32
_LEAF_PREFIX = b"\x00"
_NODE_PREFIX = b"\x01"
_sha256 = hashlib.sha256

#: Root of the tree with no leaves: SHA-256 of the empty string.
EMPTY_ROOT: bytes = _sha256(b"").digest()


def leaf_hash(data: bytes) -> bytes:
    """Hash one leaf: ``SHA-256(0x00 || data)``.

    Args:
        data: the raw leaf bytes.
    Returns:
        The 32-byte leaf hash.
    Raises:
        TypeError: if ``data`` is not bytes-like.
    """
    return _sha256(_LEAF_PREFIX + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """Hash an interior node: ``SHA-256(0x01 || left || right)``.

    Args:
        left: hash of the left child.
        right: hash of the right child.
    Returns:
        The 32-byte node hash.
    Raises:
        TypeError: if either child is not bytes-like.
    """
    return _sha256(_NODE_PREFIX + left + right).digest()


def _hash_leaves(leaves: Sequence[bytes]) -> list[bytes]:
    """Leaf-hash every item (same trick as :func:`_next_level`)."""
    copy = _sha256(_LEAF_PREFIX).copy
    out: list[bytes] = []
    append = out.append
    for data in leaves:
        h = copy()
        h.update(data)
        append(h.digest())
    return out


def _next_level(level: Sequence[bytes]) -> list[bytes]:
    """Hash adjacent pairs of one level into the level above.

    A lone last node is carried up unchanged. Level by level this builds
    exactly the RFC 6962 tree: its left subtrees are perfect, so only the
    rightmost node can lack a partner, and RFC 6962 likewise hashes it in
    only where its right spine meets a left sibling.
    """
    # Copying a hasher already fed the prefix is ~10% faster than calling
    # sha256() on a freshly built 65-byte message; bound locals skip look-ups.
    copy = _sha256(_NODE_PREFIX).copy
    out: list[bytes] = []
    append = out.append
    pairs = iter(level)
    for left, right in zip(pairs, pairs):
        h = copy()
        h.update(left)
        h.update(right)
        append(h.digest())
    if len(level) & 1:
        append(level[-1])
    return out


def _check_hashes(hashes: Sequence[bytes]) -> None:
    """Raise TypeError / ValueError unless every item is a 32-byte hash."""
    # map/set run in C: under a tenth of the cost of hashing the tree,
    # where a Python loop costs about an eighth.
    bad_types = set(map(type, hashes)) - {bytes, bytearray}
    if bad_types:
        names = ", ".join(sorted(t.__name__ for t in bad_types))
        raise TypeError(f"leaf hashes must be bytes, got {names}")
    bad_lengths = set(map(len, hashes)) - {HASH_SIZE}
    if bad_lengths:
        raise ValueError(f"leaf hashes must be {HASH_SIZE} bytes, got lengths {sorted(bad_lengths)}")


def _check_count(name: str, value: int, low: int, high: int, error: type[Exception]) -> None:
    """Raise unless ``value`` is a true int with ``low <= value <= high``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be at least {low}, got {value}")
    if value > high:
        raise error(f"{name} {value} out of range {low}..{high}")


def _root(leaf_hashes: Sequence[bytes]) -> bytes:
    """Root of already-validated leaf hashes, computed iteratively."""
    if not leaf_hashes:
        return EMPTY_ROOT
    level = leaf_hashes
    while len(level) > 1:
        level = _next_level(level)
    return bytes(level[0])


def root_from_hashes(leaf_hashes: Sequence[bytes]) -> bytes:
    """Compute the RFC 6962 root of a tree given its leaf hashes.

    Args:
        leaf_hashes: the 32-byte leaf hashes, in log order.
    Returns:
        The 32-byte root (``EMPTY_ROOT`` for no leaves).
    Raises:
        TypeError / ValueError: if an item is not a 32-byte hash.
    """
    _check_hashes(leaf_hashes)
    return _root(leaf_hashes)


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """Compute the RFC 6962 Merkle Tree Hash MTH(D[n]) of raw leaves.

    Args:
        leaves: the raw leaf data, in log order.
    Returns:
        The 32-byte root (``EMPTY_ROOT`` for no leaves).
    Raises:
        TypeError: if a leaf is not bytes-like.
    """
    return _root(_hash_leaves(leaves))


def _tree_levels(leaf_hashes: Sequence[bytes]) -> list[Sequence[bytes]]:
    """Every level of the tree, leaves first: n - 1 hashes, then any number
    of audit paths read off in O(log n) each (the benchmark relies on it)."""
    levels: list[Sequence[bytes]] = [leaf_hashes]
    while len(levels[-1]) > 1:
        levels.append(_next_level(levels[-1]))
    return levels


def _path_from_levels(levels: list[Sequence[bytes]], index: int) -> list[bytes]:
    """Read the audit path of leaf ``index`` off prebuilt levels.

    A node carried up without a partner contributes no sibling on that
    level, which is exactly where RFC 6962's PATH has none either.
    """
    path: list[bytes] = []
    for level in levels[:-1]:
        if index ^ 1 < len(level):
            path.append(bytes(level[index ^ 1]))
        index >>= 1
    return path


def inclusion_proof_from_hashes(leaf_hashes: Sequence[bytes], index: int) -> list[bytes]:
    """Build the audit path PATH(index, D[n]) from leaf hashes.

    Args:
        leaf_hashes: the 32-byte leaf hashes, in log order.
        index: position of the leaf to prove, ``0 <= index < n``.
    Returns:
        The sibling hashes, from the leaf upwards.
    Raises:
        IndexError: if ``index >= n``.
        ValueError: if ``index`` is negative or a hash is not 32 bytes.
        TypeError: if ``index`` is not an int or a hash is not bytes.
    """
    _check_count("index", index, 0, len(leaf_hashes) - 1, IndexError)
    _check_hashes(leaf_hashes)
    return _path_from_levels(_tree_levels(leaf_hashes), index)


def inclusion_proof(leaves: Sequence[bytes], index: int) -> list[bytes]:
    """Build the audit path of raw leaf ``index``.

    Args, Returns and Raises as :func:`inclusion_proof_from_hashes`, with
    raw ``leaves`` (TypeError if one is not bytes-like).
    """
    # Check first so a bad index fails before a large log is hashed.
    _check_count("index", index, 0, len(leaves) - 1, IndexError)
    return inclusion_proof_from_hashes(_hash_leaves(leaves), index)


def _subproof(hashes: Sequence[bytes], m: int) -> list[bytes]:
    """SUBPROOF(m, D[n], true) of RFC 6962 for ``0 < m < n``, as a loop.

    Each step narrows the window ``[lo, hi)`` to one child and records the
    other child's root. The RFC lists the deepest hash first, hence the
    reversal at the end.
    """
    lo, hi, whole = 0, len(hashes), True
    outer: list[bytes] = []
    while m != hi - lo:
        k = 1 << ((hi - lo - 1).bit_length() - 1)  # largest power of 2 < n
        if m <= k:
            outer.append(_root(hashes[lo + k : hi]))
            hi = lo + k
        else:
            outer.append(_root(hashes[lo : lo + k]))
            lo, m, whole = lo + k, m - k, False
    # SUBPROOF(m, D[m], true) is empty; with b false it is {MTH(D[m])}.
    inner = [] if whole else [_root(hashes[lo:hi])]
    return inner + outer[::-1]


def consistency_proof_from_hashes(leaf_hashes: Sequence[bytes], old_size: int) -> list[bytes]:
    """Build PROOF(old_size, D[n]) from leaf hashes.

    Args:
        leaf_hashes: the 32-byte leaf hashes of the new tree, in log order.
        old_size: size of the earlier tree, ``0 <= old_size <= n``.
    Returns:
        The proof hashes; empty when ``old_size`` is 0 or ``n``.
    Raises:
        ValueError: if ``old_size`` is out of range or a hash is not 32 bytes.
        TypeError: if ``old_size`` is not an int or a hash is not bytes.
    """
    _check_count("old_size", old_size, 0, len(leaf_hashes), ValueError)
    _check_hashes(leaf_hashes)
    if old_size in (0, len(leaf_hashes)):
        return []
    return _subproof(leaf_hashes, old_size)


def consistency_proof(leaves: Sequence[bytes], old_size: int) -> list[bytes]:
    """Build PROOF(old_size, D[n]) for raw leaves.

    Args, Returns and Raises as :func:`consistency_proof_from_hashes`, with
    raw ``leaves`` (TypeError if one is not bytes-like).
    """
    _check_count("old_size", old_size, 0, len(leaves), ValueError)
    return consistency_proof_from_hashes(_hash_leaves(leaves), old_size)


def _is_count(x: object) -> bool:
    """True for a non-negative int that is not a bool."""
    return type(x) is int and x >= 0


def _is_hash(x: object) -> bool:
    """True for a 32-byte bytes or bytearray value."""
    return isinstance(x, (bytes, bytearray)) and len(x) == HASH_SIZE


def _as_hashes(proof: object) -> Optional[list[bytes]]:
    """Return the proof as a list of 32-byte hashes, or None if malformed."""
    # Only list/tuple: bytes and str are sequences too, and an iterator
    # would be consumed by the check.
    if not isinstance(proof, (list, tuple)) or not all(_is_hash(p) for p in proof):
        return None
    return [bytes(p) for p in proof]


def _shift_until_odd(fn: int, sn: int) -> tuple[int, int]:
    """Right-shift both until ``fn`` has its low bit set or is zero."""
    while fn and not fn & 1:
        fn, sn = fn >> 1, sn >> 1
    return fn, sn


def verify_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> bool:
    """Check that ``leaf`` is at ``index`` in the ``size``-leaf tree with ``root``.

    Args:
        leaf: the raw leaf data (bytes or bytearray).
        index: claimed position of the leaf, ``0 <= index < size``.
        size: number of leaves in the tree.
        proof: the audit path, a list or tuple of 32-byte hashes.
        root: the expected 32-byte root.
    Returns:
        True if the proof is valid; False for an invalid proof or any
        malformed argument. Never raises.
    """
    path = _as_hashes(proof)
    if path is None or not isinstance(leaf, (bytes, bytearray)) or not _is_hash(root):
        return False
    if not (_is_count(index) and _is_count(size) and index < size):
        return False
    fn, sn, r = index, size - 1, leaf_hash(leaf)
    for p in path:
        if sn == 0:
            return False  # more hashes than the tree is deep
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            fn, sn = _shift_until_odd(fn, sn)
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> bool:
    """Check that the ``new_size`` tree extends the ``old_size`` tree.

    Equal sizes need an empty proof and equal roots. An empty old tree is a
    prefix of every tree, so it needs only an empty proof: its root is not
    compared, though both roots must still be well-formed.

    Args:
        old_size: size of the earlier tree.
        new_size: size of the later tree, ``old_size <= new_size``.
        old_root: 32-byte root of the earlier tree.
        new_root: 32-byte root of the later tree.
        proof: the consistency proof, a list or tuple of 32-byte hashes.
    Returns:
        True if the proof is valid; False for an invalid proof or any
        malformed argument. Never raises.
    """
    path = _as_hashes(proof)
    if path is None or not (_is_hash(old_root) and _is_hash(new_root)):
        return False
    if not (_is_count(old_size) and _is_count(new_size) and old_size <= new_size):
        return False
    if old_size == new_size:
        return not path and old_root == new_root
    if old_size == 0:
        return not path
    return _verify_subproof(old_size, new_size, bytes(old_root), bytes(new_root), path)


def _verify_subproof(first: int, second: int, first_hash: bytes, second_hash: bytes, path: list[bytes]) -> bool:
    """RFC 9162 section 2.1.4.2 for ``0 < first < second``."""
    if not path:
        return False
    # A power-of-two old tree is a whole left subtree, so the proof omits
    # its root and the verifier supplies it.
    if first & (first - 1) == 0:
        path = [first_hash] + path
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            fn, sn = _shift_until_odd(fn, sn)
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and fr == first_hash and sr == second_hash


@dataclass(frozen=True, slots=True)
class Frontier:
    """Compact state of an append-only log: one peak per set bit of ``size``.

    ``peaks`` are the roots of the perfect subtrees in the binary
    decomposition of ``size``, largest (leftmost) first. Appending merges
    equal-size peaks like the carry of a binary counter: O(log n).

    Raises:
        TypeError: on construction if ``size`` is not an int.
        ValueError: on construction if ``size`` is negative, the peak count
            is not popcount(size), or a peak is not 32 bytes of ``bytes``.
    """

    size: int
    peaks: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int):
            raise TypeError("Frontier.size must be an int")
        if self.size < 0 or len(self.peaks) != self.size.bit_count():
            raise ValueError(f"size {self.size} cannot have {len(self.peaks)} peaks")
        if not all(type(p) is bytes and len(p) == HASH_SIZE for p in self.peaks):
            raise ValueError("every peak must be a 32-byte bytes value")

    @classmethod
    def empty(cls) -> Frontier:
        """Return the frontier of the empty log."""
        return cls(0, ())

    def append(self, leaf_hash: bytes) -> Frontier:
        """Return a new frontier with one more leaf.

        Args:
            leaf_hash: the 32-byte hash of the appended leaf.
        Returns:
            The frontier of ``size + 1`` leaves; ``self`` is unchanged.
        Raises:
            TypeError / ValueError: if ``leaf_hash`` is not a 32-byte hash.
        """
        _check_hashes((leaf_hash,))
        peaks = list(self.peaks)
        carry, n = bytes(leaf_hash), self.size
        # Each trailing 1 bit of the old size is a peak as large as the carry.
        while n & 1:
            carry = node_hash(peaks.pop(), carry)
            n >>= 1
        peaks.append(carry)
        return Frontier(self.size + 1, tuple(peaks))

    def root(self) -> bytes:
        """Return the RFC 6962 root of all leaves appended so far.

        Returns:
            The 32-byte root; ``EMPTY_ROOT`` for an empty log.
        """
        if not self.peaks:
            return EMPTY_ROOT
        # RFC 6962 splits off the largest power of two first, so the peaks
        # nest to the right: fold from the smallest peak leftwards.
        acc = self.peaks[-1]
        for peak in reversed(self.peaks[:-1]):
            acc = node_hash(peak, acc)
        return acc
