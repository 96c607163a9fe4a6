"""ledger.audit: the draw's pure parts, against slow obvious versions and invariants."""

from __future__ import annotations

import hashlib
from fractions import Fraction
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from ledger import audit
from ledger.schedule import Candidate, tiebreak
from ledger.types import COIN

keys = st.binary(min_size=32, max_size=32)


def test_the_seed_is_the_audit_domain_hash_of_the_block_and_the_receipt():
    block, receipt = b"\x01" * 32, b"\x02" * 32
    assert audit.audit_seed(block, receipt) == \
        hashlib.sha256(b"pnode:audit:" + block + receipt).digest()
    assert audit.audit_seed(block, receipt) != audit.audit_seed(receipt, block)


def test_the_sampled_share_is_audit_bps():
    seeds = [hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(20_000)]
    for bps in (0, 100, 1000, 5000, 10_000):
        share = sum(audit.is_sampled(s, bps) for s in seeds) / len(seeds)
        assert abs(share - bps / 10_000) < 0.01, (bps, share)


@settings(max_examples=200, deadline=None)
@given(nodes=st.lists(st.tuples(keys, st.integers(0, 3), st.integers(0, 10)), min_size=0,
                      max_size=8, unique_by=lambda n: n[0]),
       seed=keys, worker=st.integers(0, 3), first=st.integers(0, 4), height=st.integers(0, 10))
def test_the_verifier_is_the_slow_obvious_choice(nodes, seed, worker, first, height):
    accounts = [bytes([a]) * 32 for a in range(5)]
    cands = [(Candidate(k, 0, 0, 30, jail), accounts[acct]) for k, acct, jail in nodes]
    excluded = {accounts[worker], accounts[first]}
    chosen = audit.audit_verifier(cands, seed, excluded, height)
    eligible = [c for c, acct in cands if acct not in excluded]
    if not eligible:
        assert chosen is None
        return
    # Slow and obvious: the free first, then the lowest tiebreak; layers play no part.
    free = [c for c in eligible if c.jailed_until <= height]
    best = sorted(free or eligible, key=lambda c: tiebreak(seed, c.node_key))[0]
    assert chosen == best.node_key
    assert dict((c.node_key, a) for c, a in cands)[chosen] not in excluded


def test_a_partner_holding_the_layers_is_drawn_only_its_share():
    """The attack the holder preference allowed: the partner is one of five, drawn about 1/5."""
    cands = [(Candidate(bytes([i]) * 32, 0, 0 if i else 4, 30 if i else 12, 0), bytes([i]) * 32)
             for i in range(6)]  # node 0 (the partner) alone holds the unit's layers
    seeds = [hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(5000)]
    drawn = [audit.audit_verifier(cands, s, [bytes([9]) * 32], 0) for s in seeds]
    share = drawn.count(bytes(32)) / len(drawn)
    assert abs(share - 1 / 6) < 0.02, share


def _slow_caught(p: Fraction, r: Fraction, f: Fraction) -> Fraction:
    """Walk the ladder: each cartel producer re-draws a draw that samples its receipt."""
    def final_sampled(rate):
        total, reach = Fraction(0), Fraction(1)  # reach: the chance the ladder gets this far
        for _ in range(80):
            total += reach * (1 - f) * rate  # an honest producer's draw stands
            reach *= f * rate  # a cartel producer whose draw samples withholds
        return total
    s, rr = final_sampled(p), final_sampled(r)
    return s * (1 - f) + s * f * rr * (1 - f)


@pytest.mark.parametrize("p, r, f", [(1000, 1000, 2000), (1000, 0, 0), (10_000, 1000, 3000),
                                     (500, 5000, 1000), (2000, 2000, 5000)])
def test_the_caught_rate_is_the_ladder_walked(p, r, f):
    exact = audit.caught_rate(p, r, f)
    slow = _slow_caught(Fraction(p, 10_000), Fraction(r, 10_000), Fraction(f, 10_000))
    assert abs(float(exact - slow)) < 1e-12
    if f == 0:
        assert exact == Fraction(p, 10_000)


def _params(**kw):
    base = dict(min_bond=20 * COIN, reward=COIN, slash_bps=10_000, audit_bps=1000,
                recheck_bps=1000, cartel_bps=2000)
    return SimpleNamespace(**{**base, **kw})


def test_the_economics_boundary():
    # Without a cartel: p * slash > (1 - p) * reward; 10 coins at p = 0.1 beat 0.9 coins.
    assert audit.economics_problem(_params(min_bond=10 * COIN, cartel_bps=0)) is None
    assert audit.economics_problem(_params(min_bond=9 * COIN, cartel_bps=0)) is not None
    # A fifth colluding: caught 0.0664 of the time, so 10 coins no longer do, 20 do.
    assert abs(float(audit.caught_rate(1000, 1000, 2000)) - 0.0664) < 1e-4
    assert "cheating would pay" in audit.economics_problem(_params(min_bond=10 * COIN))
    assert audit.economics_problem(_params()) is None
    assert audit.economics_problem(_params(slash_bps=5000)) is not None
    assert audit.economics_problem(_params(audit_bps=0, min_bond=1)) is None  # no claim
