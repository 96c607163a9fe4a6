"""The Proof-of-Learning audit's rules: draws, verdicts, appeals, and how a receipt settles.

Owns what the chain does with an accepted receipt's `Pending` once its
block is in (specs/pol.md 5 and 6): the draws in each block's prelude
(`draw_audits`: a receipt's audit, the forced audits of a failed account,
a pass's re-check, an appeal's verifiers), the `Verdict` and `Appeal`
transactions, and settling at the final height (`settle_pending`: pay,
strike a silent verifier, or slash the loser). The pure choices (seeds,
sampling, who is drawn, the economics) are `ledger.audit`'s.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ledger import audit, schedule
from ledger.crypto import ZERO32
from ledger.errors import BadAppeal, BadVerdict, NotRegistered
from ledger.jobrules import pay_work
from ledger.records import AppealRecord, Pending
from ledger.standing import candidates, jail
from ledger.state import APPEAL, KEY_BEACON, KEY_SUPPLY, NODE, PENDING, Overlay
from ledger.types import FAILING_REASONS, PASS, UNAVAILABLE, VERDICT_REASONS, Appeal, Verdict

#: The statuses whose draw comes at `Pending.draw_at`.
_DRAWN_LATER = (audit.DRAW_DUE, audit.FORCED, audit.RECHECK_DUE, audit.APPEAL_DUE)


def apply_verdict(st: Overlay, ctx: Any, tx: Verdict, raw: bytes) -> None:
    """A drawn verifier's verdict: on a sampled receipt, a re-check, or an appeal."""
    pending = st.get(PENDING + tx.receipt_hash)
    if pending is None:
        raise BadVerdict("no receipt with that hash is waiting in its challenge window")
    if tx.reason >= len(VERDICT_REASONS):
        raise BadVerdict(f"unknown verdict reason {tx.reason}")
    if tx.reason in FAILING_REASONS and tx.evidence_hash == ZERO32:
        raise BadVerdict(f"a {VERDICT_REASONS[tx.reason]!r} verdict must name its evidence")
    if pending.status == audit.APPEALING:
        _apply_appeal_vote(st, ctx, tx, pending)
        return
    if pending.status not in (audit.SAMPLED, audit.RECHECKING):
        raise BadVerdict("that receipt is not awaiting a verdict (not sampled, not drawn "
                         "yet, or judged)")
    if tx.verifier != pending.verifier:
        raise BadVerdict(f"verifier {tx.verifier.hex()[:16]}.. is not the one assigned")
    verifier = st.get(NODE + tx.verifier)
    if verifier is None:
        raise NotRegistered("verifier is no longer registered")
    recheck = pending.status == audit.RECHECKING
    if tx.reason == UNAVAILABLE:
        if recheck:  # the first verifier's pass stands: the worker is paid, no fee
            st.put(PENDING + tx.receipt_hash, replace(pending, status=audit.PASSED))
        else:  # no proof, no pay; no fee, and nobody is at fault for sure
            st.delete(PENDING + tx.receipt_hash)
        return
    # A flat fee, pass or fail alike, paid as the job pays its work.
    pay_work(st, pending.job_id, verifier.account, st.params().verify_fee)
    if tx.reason == PASS:
        # A first pass is re-checked with probability recheck_bps, drawn two
        # blocks on from the beacon of the block in between: never by the block
        # holding the pass, whose producer may be the verifier's partner.
        if recheck or st.params().recheck_bps == 0:
            st.put(PENDING + tx.receipt_hash, replace(pending, status=audit.PASSED))
        else:
            st.put(PENDING + tx.receipt_hash, _draw_later(pending, audit.RECHECK_DUE, ctx))
        return
    # A failing verdict: the reward is withheld and every other receipt of the
    # account still unaudited gets audited now; the slash waits out the appeal
    # window (`verdict_window` blocks), and falls on the worker (and, on a
    # re-check, on the first verifier, who passed work that fails) unless an
    # appeal finds the verifier lied.
    st.put(PENDING + tx.receipt_hash, replace(
        pending, status=audit.FAILED, final_height=ctx.height + st.params().verdict_window))
    for receipt_hash in st.ids(PENDING):
        other = st.get(PENDING + receipt_hash)
        if other.account == pending.account and other.status in (audit.DRAW_DUE,
                                                                  audit.UNSAMPLED):
            st.put(PENDING + receipt_hash, _draw_later(other, audit.FORCED, ctx))


def apply_appeal(st: Overlay, ctx: Any, tx: Appeal, raw: bytes) -> None:
    """The worker's appeal against a failing verdict: fresh verifiers, drawn two blocks on.

    Attack note: appealing costs the worker nothing it would not lose
    anyway (the slash is only deferred), so a cheater appeals too; it
    gains a few blocks before its slash, while its other receipts are
    already being audited. The appeal verifiers' fees are the price.
    """
    pending = st.get(PENDING + tx.receipt_hash)
    if pending is None or pending.status != audit.FAILED:
        raise BadAppeal("no failing verdict on that receipt is open to appeal")
    if tx.node_key != pending.node_key:
        raise BadAppeal("only the node that signed the receipt may appeal its verdict")
    st.put(PENDING + tx.receipt_hash, _draw_later(pending, audit.APPEAL_DUE, ctx))


def _apply_appeal_vote(st: Overlay, ctx: Any, tx: Verdict, pending: Pending) -> None:
    record = st.get(APPEAL + tx.receipt_hash)
    if tx.verifier not in record.verifiers:
        raise BadVerdict(f"verifier {tx.verifier.hex()[:16]}.. is not drawn for this appeal")
    at = record.verifiers.index(tx.verifier)
    if record.votes[at] != audit.NO_VOTE:
        raise BadVerdict("this verifier has voted on the appeal already")
    verifier = st.get(NODE + tx.verifier)
    if verifier is None:
        raise NotRegistered("verifier is no longer registered")
    if tx.reason != UNAVAILABLE:
        pay_work(st, pending.job_id, verifier.account, st.params().verify_fee)
    votes = record.votes[:at] + (tx.reason,) + record.votes[at + 1:]
    record = replace(record, votes=votes)
    st.put(APPEAL + tx.receipt_hash, record)
    if audit.NO_VOTE not in votes:
        _decide_appeal(st, ctx, tx.receipt_hash, pending, record)


def _draw_later(pending: Pending, status: int, ctx: Any) -> Pending:
    """``pending`` with a draw due two blocks on, its window kept open until then."""
    draw_at = ctx.height + 2
    return replace(pending, status=status, draw_at=draw_at,
                   final_height=max(pending.final_height, draw_at))


def mature_candidates(st: Overlay, height: int) -> list[tuple[schedule.Candidate, bytes]]:
    """(candidate, account) of the bonded nodes registered at ``height`` or before.

    Attack note: only nodes registered before the seed's block existed may
    be drawn, so a key registered once the seed is known cannot place
    itself (specs/pol.md 5).
    """
    return [(c, node.account) for c in candidates(st)
            if (node := st.get(NODE + c.node_key)).registered_height <= height]


def draw_audits(st: Overlay, ctx: Any) -> None:
    """Draw every audit, forced audit, re-check and appeal due at this height (``draw_at``).

    Each was set two blocks after its event (the receipt's inclusion, the
    failing verdict that forces it, the pass to re-check, the appeal); the
    seed is the parent's beacon (`ledger.beacon`), the block in between's,
    read before this block's own replaces it. A sampled receipt gets its
    verifier and ``verdict_window`` more blocks; one with no possible
    verifier is not sampled. A re-check's verifier is of neither the
    worker's nor the first verifier's account (specs/pol.md 6.5); a pass
    not drawn for one stays passed. An appeal gets `audit.APPEAL_VERIFIERS`
    of accounts that took no part (specs/pol.md 6.6); with none, the fail
    stands.
    """
    params = st.params()
    beacon_value = st.get(KEY_BEACON).value
    mature = None  # the same for every draw of this block: computed once, when needed
    for receipt_hash in st.ids(PENDING):
        pending = st.get(PENDING + receipt_hash)
        if pending.status not in _DRAWN_LATER or pending.draw_at > ctx.height:
            continue
        seed = audit.audit_seed(beacon_value, receipt_hash)
        recheck = pending.status == audit.RECHECK_DUE
        rate = params.recheck_bps if recheck else params.audit_bps
        drawn = pending.status in (audit.APPEAL_DUE, audit.FORCED) or \
            audit.is_sampled(seed, rate)
        if drawn:
            mature = mature_candidates(st, ctx.height - 2) if mature is None else mature
        if pending.status == audit.APPEAL_DUE:
            _draw_appeal(st, ctx, receipt_hash, pending, seed, mature)
            continue
        verifier = None
        if drawn:
            excluded = (pending.account, _account(st, pending.verifier)) if recheck \
                else (pending.account,)
            verifier = audit.audit_verifier(mature, seed, excluded, ctx.height)
        if verifier is None:
            st.put(PENDING + receipt_hash, replace(
                pending, status=audit.PASSED if recheck else audit.UNSAMPLED))
        else:
            st.put(PENDING + receipt_hash, replace(
                pending, status=audit.RECHECKING if recheck else audit.SAMPLED,
                verifier=verifier, first_verifier=pending.verifier if recheck else ZERO32,
                final_height=ctx.height + params.verdict_window))


def _draw_appeal(st: Overlay, ctx: Any, receipt_hash: bytes, pending: Pending, seed: bytes,
                 mature: list) -> None:
    excluded = {pending.account, _account(st, pending.verifier),
                _account(st, pending.first_verifier)}
    verifiers = audit.appeal_verifiers(mature, seed, excluded, ctx.height)
    if not verifiers:  # nobody may judge it: the fail stands, settled this block
        st.put(PENDING + receipt_hash, replace(pending, status=audit.FAILED,
                                               final_height=ctx.height))
        return
    st.put(APPEAL + receipt_hash, AppealRecord(verifiers, (audit.NO_VOTE,) * len(verifiers)))
    st.put(PENDING + receipt_hash, replace(
        pending, status=audit.APPEALING, final_height=ctx.height + st.params().verdict_window))


def _account(st: Overlay, node_key: bytes) -> bytes | None:
    node = st.get(NODE + node_key) if node_key != ZERO32 else None
    return None if node is None else node.account


# -- settling -------------------------------------------------------------------------


def settle_pending(st: Overlay, ctx: Any) -> None:
    """Settle every receipt whose window has closed (`Pending.final_height`).

    A failed one whose appeal window passed is slashed; an appeal is
    decided on the votes that came (the silent appeal verifiers struck);
    any other is paid its reward (`pay_work`), and a drawn verifier that
    said nothing gets a jail strike.
    """
    reward = st.params().reward
    for receipt_hash in st.ids(PENDING):
        pending = st.get(PENDING + receipt_hash)
        if pending.final_height > ctx.height:
            continue
        if pending.status == audit.FAILED:
            _fail_stands(st, ctx, receipt_hash, pending)
        elif pending.status == audit.APPEALING:
            record = st.get(APPEAL + receipt_hash)
            for key, vote in zip(record.verifiers, record.votes):
                if vote == audit.NO_VOTE:
                    jail(st, ctx, key)
            _decide_appeal(st, ctx, receipt_hash, pending, record)
        else:
            pay_work(st, pending.job_id, pending.account, reward)
            if pending.status in (audit.SAMPLED, audit.RECHECKING):  # its verifier was silent
                jail(st, ctx, pending.verifier)
            st.delete(PENDING + receipt_hash)


def _decide_appeal(st: Overlay, ctx: Any, receipt_hash: bytes, pending: Pending,
                   record: AppealRecord) -> None:
    """More passes than fails among the votes: the accused verifier lied; else the fail stands.

    The accused (`Pending.verifier`) is slashed as a cheating worker is and
    the worker is paid its reward: its bond was never touched (the slash
    waits for the appeal). Unavailable and silent votes count for neither
    side, so an appeal nobody could judge leaves the fail standing: the
    worker must keep its units fetchable while it appeals.
    """
    passes = sum(v == PASS for v in record.votes)
    fails = sum(v in FAILING_REASONS for v in record.votes)
    st.delete(APPEAL + receipt_hash)
    if passes > fails:
        accused = _account(st, pending.verifier)
        if accused is not None:
            slash(st, ctx, accused, pending.verifier)
        pay_work(st, pending.job_id, pending.account, st.params().reward)
        st.delete(PENDING + receipt_hash)
    else:
        _fail_stands(st, ctx, receipt_hash, pending)


def _fail_stands(st: Overlay, ctx: Any, receipt_hash: bytes, pending: Pending) -> None:
    """The worker is slashed (and a failed re-check's first verifier, who passed it); no reward."""
    st.delete(PENDING + receipt_hash)
    slash(st, ctx, pending.account, pending.node_key)
    lazy = _account(st, pending.first_verifier)
    if lazy is not None:
        slash(st, ctx, lazy, pending.first_verifier)


def slash(st: Overlay, ctx: Any, account_id: bytes, node_key: bytes) -> int:
    """Burn ``slash_bps`` of the account's bond and give it a jail strike (specs/pol.md 6.2).

    Returns:
        The base units burned (a spot case pays its accuser and verifiers out of them,
        `ledger.spotrules`).
    """
    account = st.account(account_id)
    slashed = account.bond * st.params().slash_bps // audit.BPS
    st.put_account(account_id, replace(account, bond=account.bond - slashed))
    supply = st.get(KEY_SUPPLY)
    st.put(KEY_SUPPLY, replace(supply, burned=supply.burned + slashed))
    jail(st, ctx, node_key)
    return slashed
