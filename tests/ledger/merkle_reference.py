"""Slow, literal transcription of RFC 6962 section 2.1 used as a test oracle.

Written straight from the RFC text and deliberately independent of
``ledger.merkle``: recursive MTH, PATH, PROOF and SUBPROOF exactly as the
RFC defines them, on lists of raw leaf bytes. Nothing here is optimised.
"""

from __future__ import annotations

import hashlib


def sha256(data: bytes) -> bytes:
    """SHA-256 digest of ``data``."""
    return hashlib.sha256(data).digest()


def largest_power_of_two_smaller_than(n: int) -> int:
    """k such that k < n <= 2k, for n > 1 (RFC 6962 section 2.1)."""
    assert n > 1
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def mth(d: list[bytes]) -> bytes:
    """MTH(D[n]), the Merkle Tree Hash of RFC 6962 section 2.1.

    MTH({})    = SHA-256()
    MTH({d0})  = SHA-256(0x00 || d0)
    MTH(D[n])  = SHA-256(0x01 || MTH(D[0:k]) || MTH(D[k:n]))
    """
    n = len(d)
    if n == 0:
        return sha256(b"")
    if n == 1:
        return sha256(b"\x00" + d[0])
    k = largest_power_of_two_smaller_than(n)
    return sha256(b"\x01" + mth(d[0:k]) + mth(d[k:n]))


def path(m: int, d: list[bytes]) -> list[bytes]:
    """PATH(m, D[n]), the audit path of RFC 6962 section 2.1.1.

    PATH(0, {d0}) = {}
    PATH(m, D[n]) = PATH(m, D[0:k]) : MTH(D[k:n])      for m < k
    PATH(m, D[n]) = PATH(m - k, D[k:n]) : MTH(D[0:k])  for m >= k
    """
    n = len(d)
    assert 0 <= m < n
    if n == 1:
        return []
    k = largest_power_of_two_smaller_than(n)
    if m < k:
        return path(m, d[0:k]) + [mth(d[k:n])]
    return path(m - k, d[k:n]) + [mth(d[0:k])]


def proof(m: int, d: list[bytes]) -> list[bytes]:
    """PROOF(m, D[n]) = SUBPROOF(m, D[n], true), RFC 6962 section 2.1.2.

    The RFC defines it for 0 < m < n; the project's convention returns an
    empty list for m == 0 and m == n.
    """
    n = len(d)
    assert 0 <= m <= n
    if m == 0 or m == n:
        return []
    return subproof(m, d, True)


def subproof(m: int, d: list[bytes], b: bool) -> list[bytes]:
    """SUBPROOF(m, D[n], b) of RFC 6962 section 2.1.2.

    SUBPROOF(m, D[m], true)  = {}
    SUBPROOF(m, D[m], false) = {MTH(D[m])}
    SUBPROOF(m, D[n], b) = SUBPROOF(m, D[0:k], b) : MTH(D[k:n])        m <= k
    SUBPROOF(m, D[n], b) = SUBPROOF(m - k, D[k:n], false) : MTH(D[0:k]) m > k
    """
    n = len(d)
    if m == n:
        return [] if b else [mth(d)]
    k = largest_power_of_two_smaller_than(n)
    if m <= k:
        return subproof(m, d[0:k], b) + [mth(d[k:n])]
    return subproof(m - k, d[k:n], False) + [mth(d[0:k])]
