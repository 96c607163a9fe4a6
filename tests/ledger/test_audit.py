"""ledger.audit: the draw's pure parts, against slow obvious versions and invariants."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings, strategies as st

from ledger import audit
from ledger.schedule import Candidate, tiebreak

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
@given(nodes=st.lists(st.tuples(keys, st.integers(0, 3), st.integers(0, 30), st.integers(1, 30),
                                st.integers(0, 10)), min_size=0, max_size=8, unique_by=lambda n: n[0]),
       seed=keys, worker=st.integers(0, 3), height=st.integers(0, 10))
def test_the_verifier_is_the_slow_obvious_choice(nodes, seed, worker, height):
    accounts = [bytes([a]) * 32 for a in range(4)]
    cands = [(Candidate(k, 0, min(a, b), max(a, b) + 1, jail), accounts[acct])
             for k, acct, a, b, jail in nodes]
    layers = (4, 12)
    chosen = audit.audit_verifier(cands, seed, accounts[worker], layers, height)
    eligible = [c for c, acct in cands if acct != accounts[worker]]
    if not eligible:
        assert chosen is None
        return
    # Slow and obvious: holders first, then the free, then the lowest tiebreak.
    for group in ([c for c in eligible if c.covers(*layers) and c.jailed_until <= height],
                  [c for c in eligible if c.covers(*layers)],
                  [c for c in eligible if c.jailed_until <= height],
                  eligible):
        if group:
            best = sorted(group, key=lambda c: tiebreak(seed, c.node_key))[0]
            break
    assert chosen == best.node_key
    assert dict((c.node_key, a) for c, a in cands)[chosen] != accounts[worker]


def test_the_economics_boundary():
    coin = 10**6
    # p * slash > (1 - p) * reward, at min_bond: 10 coins slashed at p = 0.1 beats 0.9 coins.
    assert audit.economics_problem(10 * coin, coin, 10_000, 1000) is None
    assert audit.economics_problem(9 * coin, coin, 10_000, 1000) is not None  # 0.9 = 0.9
    assert audit.economics_problem(10 * coin, coin, 5000, 1000) is not None
    assert audit.economics_problem(1, coin, 0, 0) is None  # no audit, no claim
