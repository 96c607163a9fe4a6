"""The Proof-of-Learning audit draw: which receipts are re-executed, and by whom (specs/pol.md 5, 6).

Pure functions of chain state; `ledger.rules` applies them (the draw in a
block's prelude, verdicts, silence). Owns the `Pending` statuses, the audit
seed and sampling, the verifier choice and the genesis economics check.
"""

from __future__ import annotations

from collections.abc import Iterable

from ledger import crypto, schedule

#: `Pending.status`: its draw is still to come (block h+2), it was drawn
#: and not sampled, it is sampled and awaits its verifier's verdict, it
#: passed, it must be sampled at the next prelude (its account failed), its
#: pass's re-check is drawn at the next prelude, or a second verifier
#: re-checks its pass (specs/pol.md 6.5).
DRAW_DUE, UNSAMPLED, SAMPLED, PASSED, FORCED, RECHECK_DUE, RECHECKING = range(7)
BPS = 10_000


def audit_seed(block_hash: bytes, receipt_hash: bytes) -> bytes:
    """H("pnode:audit:" || hash of the block after the receipt's || receipt hash).

    Attack note: the worker signed its receipt before that block existed,
    so it cannot steer the draw; that block's producer still can, by
    grinding its hash (specs/pol.md 5.1: a hash-onion beacon is planned).
    """
    return crypto.domain_hash(crypto.H_AUDIT, block_hash + receipt_hash)


def is_sampled(seed: bytes, audit_bps: int) -> bool:
    """Whether the receipt of ``seed`` is audited: u64_be(seed[:8]) mod 10000 < audit_bps."""
    return int.from_bytes(seed[:8], "big") % BPS < audit_bps


def audit_verifier(candidates: Iterable[tuple[schedule.Candidate, bytes]], seed: bytes,
                   worker_account: bytes, layers: tuple[int, int], height: int,
                   also_excluded: bytes | None = None) -> bytes | None:
    """The node key that must re-execute a sampled unit; None when no one may.

    Args:
        candidates: (candidate, its account) of the mature bonded nodes.
        seed: the receipt's `audit_seed`.
        worker_account: the account the receipt pays (its nodes never judge it).
        layers: the unit's [layer_start, layer_end).
        height: the current height (a jailed node comes after a free one).
        also_excluded: another account whose nodes may not judge it (a
            re-check: the first verifier's).

    Returns:
        The candidate minimising (does not cover the layers, jailed,
        tiebreak(seed, key)): a holder of the unit's layers if any, then
        one not jailed, then the lowest tiebreak.
    """
    others = [c for c, account in candidates
              if account != worker_account and account != also_excluded]
    if not others:
        return None
    best = min(others, key=lambda c: (not c.covers(*layers), c.jailed_until > height,
                                      schedule.tiebreak(seed, c.node_key)))
    return best.node_key


def economics_problem(min_bond: int, reward: int, slash_bps: int, audit_bps: int) -> str | None:
    """Why cheating would pay under these parameters; None when it does not.

    A worker audited with probability p = audit_bps / 10000 collects about
    (1 - p) / p unaudited rewards before an audit catches it and slashes
    ``min_bond * slash_bps / 10000``, so cheating must lose on average:
    p * slash > (1 - p) * reward, in integers. No audit (audit_bps 0): no
    claim is made, so nothing to check.
    """
    if audit_bps == 0:
        return None
    if min_bond * slash_bps * audit_bps > (BPS - audit_bps) * reward * BPS:
        return None
    return (f"cheating would pay: audited {audit_bps} bps of receipts, a cheater's slash of "
            f"{min_bond * slash_bps // BPS} (min_bond x slash_bps) does not outweigh the "
            f"{BPS - audit_bps}/{audit_bps} rewards it collects unaudited first")
