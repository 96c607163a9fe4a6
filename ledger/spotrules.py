"""Spot-check accusations on chain: a liar's bond slashed, its accuser repaid (specs/ledger.md 5.2).

Owns what the chain does with a client's `SpotFraud` (the signed evidence
that a server answered a step wrong, `ledger.spot`): the pure admission
checks and the case it opens (`apply_spot_fraud`), the verifiers drawn two
blocks on from the parent's beacon among the nodes that hold the claim's
layers (`draw_spot_cases`), their `SpotVote`s (`apply_spot_vote`), and the
judgement at the window's end or once every vote is in
(`settle_spot_cases`). The verifiers re-run the evidence's steps on their
served model (specs/network.md 9.5); the chain only counts their votes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ledger import audit, crypto
from ledger.accounts import check_nonce, credit, debit_deposit
from ledger.auditrules import mature_candidates, slash
from ledger.codec import encode
from ledger.errors import BadSpotFraud, BadSpotVote
from ledger.records import SpotCase
from ledger.spot import SignedAnswer, check_evidence
from ledger.standing import jail
from ledger.state import KEY_BEACON, KEY_SUPPLY, NODE, SPOT, Overlay
from ledger.types import (
    COIN, MAX_SPOT_FRAUD_BYTES, SPOT_AGREES, SPOT_DISAGREES, SPOT_VOTES, SpotFraud, SpotVote,
)

#: `SpotCase.status`: its verifiers are drawn at ``draw_at``; they are voting; and how
#: it was judged: the accused lied (slashed), its answer was right (the deposit is
#: its), or nobody could decide (the deposit goes back).
CASE_DUE, CASE_OPEN, UPHELD, REJECTED, UNDECIDED = range(5)
#: The least deposit of an accusation, whatever the verifiers' fee.
MIN_SPOT_DEPOSIT = COIN
#: The accuser's share of an upheld case's slash (basis points, after the verifiers'
#: fees); the rest is burned.
SPOT_REWARD_BPS = 5_000


def case_id(answer: SignedAnswer) -> bytes:
    """A case's id: H("pnode:spot:" || the accused peer key || its encoded claim).

    Attack note: keyed by the answer, not the evidence's bytes, so re-wrapping one
    lie (another ``time_ms``, a third answer dropped, another history cut) is
    still the same case: one lie is judged, and slashed, once.
    """
    return crypto.domain_hash(crypto.H_SPOT, answer.public_key + encode(answer.claim))


def min_deposit(params: Any) -> int:
    """The least `SpotFraud.deposit`: enough to pay every verifier's fee, at least a coin."""
    return max(MIN_SPOT_DEPOSIT, audit.APPEAL_VERIFIERS * params.verify_fee)


def accused_node(st: Overlay, answer: SignedAnswer) -> tuple[bytes, Any] | None:
    """(node key, record) of the first bonded node, in key order, bound to the answer's peer key.

    Two registrations may name one peer id only if its key signed both
    bindings (specs/ledger.md 4.4): either is the same holder's.
    """
    peer_id = crypto.libp2p_peer_id(answer.public_key)
    for node_key in st.ids(NODE):
        node = st.get(NODE + node_key)
        if node.peer_id == peer_id and st.account(node.account).bond > 0:
            return node_key, node
    return None


def apply_spot_fraud(st: Overlay, ctx: Any, tx: SpotFraud, raw: bytes) -> None:
    """Open a case against the evidence's loser: every check first, then the deposit locks.

    Raises:
        BadSpotFraud: oversize, evidence that does not hold or accuses nobody, an
            accused key bound to no bonded node (or to the accuser's own), a case
            opened already, a deposit under `min_deposit`.
        InsufficientFunds: the deposit is more than the accuser's balance.
        BadNonce: not the accuser's next nonce.
    """
    if len(raw) > MAX_SPOT_FRAUD_BYTES:
        raise BadSpotFraud(f"accusation of {len(raw)} bytes, at most {MAX_SPOT_FRAUD_BYTES}")
    check_nonce(st, tx.accuser, tx.nonce)
    evidence = tx.evidence
    why = check_evidence(evidence)
    if why is not None:
        raise BadSpotFraud(f"the evidence does not hold: {why}")
    if evidence.loser >= len(evidence.answers):
        raise BadSpotFraud("unsettled evidence accuses nobody (no loser)")
    answer = evidence.answers[evidence.loser]
    accused = accused_node(st, answer)
    if accused is None:
        raise BadSpotFraud("the accused answer's key is bound to no bonded, registered node")
    node_key, node = accused
    if node.account == tx.accuser:
        raise BadSpotFraud("an account cannot accuse its own node")
    cid = case_id(answer)
    if st.get(SPOT + cid) is not None:
        raise BadSpotFraud(f"case {cid.hex()[:16]}.. was opened already (one answer, one case)")
    least = min_deposit(st.params())
    if tx.deposit < least:
        raise BadSpotFraud(f"deposit {tx.deposit} is under the minimum {least} (base units)")
    debit_deposit(st, tx.accuser, tx.deposit)
    claim = answer.claim
    st.put(SPOT + cid, SpotCase(node_key, node.account, tx.accuser, tx.deposit,
                                claim.layer_start, claim.layer_end, ctx.height + 2,
                                ctx.height + 2, (), (), CASE_DUE))


def draw_spot_cases(st: Overlay, ctx: Any) -> None:
    """Draw the verifiers of every case due at this height, as an appeal's are drawn.

    Up to `audit.APPEAL_VERIFIERS` mature bonded nodes, one per account, whose
    registered layers cover the claim's, of accounts other than the accused's
    and the accuser's, seeded by the parent's beacon (the block after the
    accusation's: neither party knew it). With none, the case is undecided at
    once and the deposit goes back.
    """
    beacon_value = st.get(KEY_BEACON).value
    for cid in st.ids(SPOT):
        case = st.get(SPOT + cid)
        if case.status != CASE_DUE or case.draw_at > ctx.height:
            continue
        able = [(c, account) for c, account in mature_candidates(st, ctx.height - 2)
                if c.layer_start <= case.layer_start and case.layer_end <= c.layer_end]
        verifiers = audit.appeal_verifiers(able, audit.audit_seed(beacon_value, cid),
                                           (case.accused_account, case.accuser), ctx.height)
        if not verifiers:
            _close(st, cid, case, UNDECIDED, to_accuser=case.deposit)
            continue
        st.put(SPOT + cid, replace(case, status=CASE_OPEN, verifiers=verifiers,
                                   votes=(audit.NO_VOTE,) * len(verifiers),
                                   final_height=ctx.height + st.params().verdict_window))


def apply_spot_vote(st: Overlay, ctx: Any, tx: SpotVote, raw: bytes) -> None:
    """A drawn verifier's vote; the last one in decides the case at once.

    Raises:
        BadSpotVote: no open case, an unknown vote, a node not drawn, a second vote.
    """
    case = st.get(SPOT + tx.case_id)
    if case is None:
        raise BadSpotVote(f"no spot case {tx.case_id.hex()[:16]}..")
    if case.status != CASE_OPEN:
        raise BadSpotVote("that case is not open for votes (not drawn yet, or judged)")
    if tx.vote >= len(SPOT_VOTES):
        raise BadSpotVote(f"unknown spot vote {tx.vote}")
    if tx.verifier not in case.verifiers:
        raise BadSpotVote(f"verifier {tx.verifier.hex()[:16]}.. is not drawn for this case")
    at = case.verifiers.index(tx.verifier)
    if case.votes[at] != audit.NO_VOTE:
        raise BadSpotVote("this verifier has voted on the case already")
    case = replace(case, votes=case.votes[:at] + (tx.vote,) + case.votes[at + 1:])
    st.put(SPOT + tx.case_id, case)
    if audit.NO_VOTE not in case.votes:
        _decide(st, ctx, tx.case_id, case)


def settle_spot_cases(st: Overlay, ctx: Any) -> None:
    """Judge every open case whose window closed: the silent verifiers struck, the votes counted."""
    for cid in st.ids(SPOT):
        case = st.get(SPOT + cid)
        if case.status != CASE_OPEN or case.final_height > ctx.height:
            continue
        for key, vote in zip(case.verifiers, case.votes):
            if vote == audit.NO_VOTE:
                jail(st, ctx, key)
        _decide(st, ctx, cid, case)


def _decide(st: Overlay, ctx: Any, cid: bytes, case: SpotCase) -> None:
    """A majority of the drawn verifiers decides; each that judged is paid ``verify_fee``.

    More than half of those drawn (not of those who voted) must find the
    answer wrong to slash, or right to forfeit the deposit: one verifier,
    when the others are silent or unable, decides nothing.

    Upheld: the accused is slashed (`ledger.auditrules.slash`: ``slash_bps``
    of the bond, a jail strike); out of the slash the judging verifiers are
    paid, then the accuser `SPOT_REWARD_BPS` of it (at most what is left);
    the rest stays burned; the deposit goes back. Rejected: the verifiers are
    paid out of the deposit, the accused gets the rest. Undecided: the
    verifiers are paid out of the deposit, the accuser gets the rest.
    """
    fee = st.params().verify_fee
    drawn = len(case.verifiers)
    judges = [_account(st, key) for key, vote in zip(case.verifiers, case.votes)
              if vote in (SPOT_AGREES, SPOT_DISAGREES)]
    judges = [a for a in judges if a is not None]
    if sum(v == SPOT_DISAGREES for v in case.votes) * 2 > drawn:
        slashed = slash(st, ctx, case.accused_account, case.accused)
        paid = _pay_fees(st, judges, fee, slashed)
        reward = min(slashed - paid, slashed * SPOT_REWARD_BPS // audit.BPS)
        credit(st, case.accuser, reward)
        _unburn(st, paid + reward)
        _close(st, cid, case, UPHELD, to_accuser=case.deposit)
        return
    paid = _pay_fees(st, judges, fee, case.deposit)
    rest = case.deposit - paid
    if sum(v == SPOT_AGREES for v in case.votes) * 2 > drawn:
        credit(st, case.accused_account, rest)
        _close(st, cid, case, REJECTED, to_accuser=0)
    else:
        _close(st, cid, case, UNDECIDED, to_accuser=rest)


def _pay_fees(st: Overlay, accounts: list[bytes], fee: int, budget: int) -> int:
    """Credit each account ``fee`` while ``budget`` lasts; returns what was paid."""
    paid = 0
    for account in accounts:
        amount = min(fee, budget - paid)
        if amount:
            credit(st, account, amount)
            paid += amount
    return paid


def _unburn(st: Overlay, amount: int) -> None:
    """Take ``amount`` of a slash just burned back out of the burned count (it was paid out)."""
    supply = st.get(KEY_SUPPLY)
    st.put(KEY_SUPPLY, replace(supply, burned=supply.burned - amount))


def _close(st: Overlay, cid: bytes, case: SpotCase, status: int, to_accuser: int) -> None:
    """Keep the case as judged (its deposit spent) and return ``to_accuser`` to the accuser."""
    if to_accuser:
        credit(st, case.accuser, to_accuser)
    st.put(SPOT + cid, replace(case, status=status, deposit=0))


def _account(st: Overlay, node_key: bytes) -> bytes | None:
    node = st.get(NODE + node_key)
    return None if node is None else node.account
