"""The Proof-of-Learning audit draw: which receipts are re-executed, and by whom (specs/pol.md 5, 6).

Pure functions of chain state; `ledger.rules` applies them (the draw in a
block's prelude, verdicts, silence). Owns the `Pending` statuses, the audit
seed and sampling, the verifier choice and the genesis economics check
under collusion and withholding.
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction

from ledger import crypto, schedule

#: `Pending.status`: its draw is still to come (block h+2), it was drawn
#: and not sampled, it is sampled and awaits its verifier's verdict, it
#: passed, it must be sampled at the next prelude (its account failed), its
#: pass's re-check is drawn at the next prelude, or a second verifier
#: re-checks its pass (specs/pol.md 6.5).
DRAW_DUE, UNSAMPLED, SAMPLED, PASSED, FORCED, RECHECK_DUE, RECHECKING = range(7)
#: A failing verdict stands once its appeal window closes unappealed; an
#: appeal's verifiers are drawn at `draw_at`; they are judging it
#: (specs/pol.md 6.6).
FAILED, APPEAL_DUE, APPEALING = 7, 8, 9
#: Fresh verifiers drawn for an appeal, each of a distinct account; the
#: majority of those who vote pass or fail decides.
APPEAL_VERIFIERS = 3
#: An appeal verifier's vote before its verdict.
NO_VOTE = 0xFF
BPS = 10_000


def audit_seed(beacon_value: bytes, receipt_hash: bytes) -> bytes:
    """H("pnode:audit:" || the beacon of the block after the event || receipt hash).

    The event is the receipt's inclusion, the failing verdict that forces
    its audit, or the pass to re-check (specs/pol.md 5).

    Attack note: the worker signed before that block existed, and the
    beacon is a VRF output its producer cannot choose (`ledger.beacon`):
    that producer can only withhold its block, one re-draw per slot it
    holds (priced by `economics_problem`).
    """
    return crypto.domain_hash(crypto.H_AUDIT, beacon_value + receipt_hash)


def is_sampled(seed: bytes, audit_bps: int) -> bool:
    """Whether the receipt of ``seed`` is audited: u64_be(seed[:8]) mod 10000 < audit_bps."""
    return int.from_bytes(seed[:8], "big") % BPS < audit_bps


def audit_verifier(candidates: Iterable[tuple[schedule.Candidate, bytes]], seed: bytes,
                   excluded: Iterable[bytes], height: int) -> bytes | None:
    """The node key that must re-execute a sampled unit; None when no one may.

    Args:
        candidates: (candidate, its account) of the mature bonded nodes.
        seed: the draw's `audit_seed`.
        excluded: accounts whose nodes may not judge it (the worker's, and
            on a re-check the first verifier's).
        height: the current height (a jailed node comes after a free one).

    Returns:
        The candidate minimising (jailed, tiebreak(seed, key)): uniform over
        the free nodes of other accounts.

    Attack note: the draw once preferred holders of the unit's layers (they
    keep the weights to compare); a worker's partner holding the same
    layers was then drawn for every audit of its partner's units. Uniform,
    a partner is drawn as often as its share of the nodes.
    """
    barred = set(excluded)
    others = [c for c, account in candidates if account not in barred]
    if not others:
        return None
    best = min(others, key=lambda c: (c.jailed_until > height,
                                      schedule.tiebreak(seed, c.node_key)))
    return best.node_key


def appeal_verifiers(candidates: Iterable[tuple[schedule.Candidate, bytes]], seed: bytes,
                     excluded: Iterable[bytes], height: int) -> tuple[bytes, ...]:
    """Up to `APPEAL_VERIFIERS` node keys, one per account, drawn as `audit_verifier` draws one.

    Args:
        candidates, seed, height: as for `audit_verifier`.
        excluded: the worker's account, the accused verifier's, and a
            failed re-check's first verifier's: none of them judges the
            appeal.

    Returns:
        The keys in draw order (fewer when fewer accounts may judge).
    """
    barred = set(excluded)
    order = sorted(((c.jailed_until > height, schedule.tiebreak(seed, c.node_key)), c.node_key,
                    account) for c, account in candidates if account not in barred)
    chosen: list[bytes] = []
    for _, node_key, account in order:
        if account in barred:
            continue
        chosen.append(node_key)
        barred.add(account)
        if len(chosen) == APPEAL_VERIFIERS:
            break
    return tuple(chosen)


def caught_rate(audit_bps: int, recheck_bps: int, cartel_bps: int) -> Fraction:
    """The chance that one cheated receipt of a cartel's worker is caught (specs/pol.md 5.1).

    A cartel holding a share f of the nodes withholds its block whenever
    the beacon it would publish samples its own receipt: the next producer
    in the ladder draws again, so the draw ends sampled with probability
    p(1-f) / (1-fp). A sampled receipt meets a cartel verifier with
    probability f, which passes it; that pass is caught only if it is
    re-checked (drawn the same way, rate r) by an honest second verifier.
    """
    f, p, r = (Fraction(x, BPS) for x in (cartel_bps, audit_bps, recheck_bps))
    sampled = p * (1 - f) / (1 - f * p)
    rechecked = r * (1 - f) / (1 - f * r)
    return sampled * ((1 - f) + f * rechecked * (1 - f))


def economics_problem(params) -> str | None:
    """Why cheating would pay under these parameters; None when it does not.

    A cheater caught with probability q per receipt (`caught_rate`, at the
    chain's ``cartel_bps``) collects about (1 - q) / q unaudited rewards
    before it is caught and slashed ``min_bond * slash_bps / 10000``, so
    cheating must lose on average: q * slash > (1 - q) * reward, exactly
    (rationals). No audit (audit_bps 0): no claim is made, so nothing to
    check.
    """
    if params.audit_bps == 0:
        return None
    q = caught_rate(params.audit_bps, params.recheck_bps, params.cartel_bps)
    slash = params.min_bond * params.slash_bps // BPS
    if q * slash > (1 - q) * params.reward:
        return None
    return (f"cheating would pay: a cheated receipt is caught with probability {float(q):.4f} "
            f"(audit_bps {params.audit_bps}, recheck_bps {params.recheck_bps}, a cartel of "
            f"cartel_bps {params.cartel_bps} withholding blocks and passing its own), and a "
            f"slash of {slash} (min_bond x slash_bps) does not outweigh the "
            f"{float((1 - q) / q):.1f} rewards of {params.reward} it collects first")
