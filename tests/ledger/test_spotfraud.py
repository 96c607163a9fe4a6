"""Spot-check accusations on chain (specs/ledger.md 5.2): evidence, the draw, votes, who pays.

Real chains, real keys: the accused server's answers are signed by the peer
key its registration binds (`chainkit.peer_key`), the other answers by
servers of no chain at all, as a client's evidence holds them.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from ledger import audit, spotrules
from ledger import errors as E
from ledger.codec import encode
from ledger.crypto import SigningKey
from ledger.spot import S_STEP, SignedAnswer, SpotEvidence, Step, StepClaim, history_of, input_hash
from ledger.state import ACCOUNT, JAIL, KEY_PARAMS, KEY_SUPPLY, NODE, SPOT, check_supply
from ledger.types import (
    COIN, MAX_SPOT_FRAUD_BYTES, SPOT_AGREES, SPOT_DISAGREES, SPOT_UNABLE, ZERO_SIG, SpotFraud,
    SpotVote, sign,
)
from tests.ledger.chainkit import (
    CHAIN, check_block as check, grow, make_net, new_db, next_block, peer_key, with_txs,
)

MODEL = "smollm2-135m"
TRUE, LIE = b"\x01" * 64, b"\x02" * 64


def _steps(rows: int = 3) -> tuple[Step, ...]:
    """A session's inputs: a 3-position prompt, then one decode step (bytes: never run here)."""
    return (Step(0, (rows,), b"prompt" * 8), Step(rows, (1,), b"token" * 8))


def _answer(key: SigningKey, steps, hidden: bytes, history: bytes | None = None,
            layers=(0, 30)) -> SignedAnswer:
    claim = StepClaim(b"\x09" * 32, MODEL, layers[0], layers[1], steps[-1].pos,
                      input_hash(steps[-1]), history_of(steps) if history is None else history,
                      hashlib.sha256(hidden).digest())
    return SignedAnswer(key.public, claim, hidden, key.sign(S_STEP, encode(claim)))


def _evidence(liar: SigningKey, steps=None, history: bytes | None = None,
              layers=(0, 30)) -> SpotEvidence:
    """The liar's answer (after ``history``) outvoted by two honest servers' (of no node)."""
    steps = _steps() if steps is None else steps
    honest = [SigningKey(bytes([i]) * 32) for i in (0x71, 0x72)]
    answers = (_answer(liar, steps, LIE, history, layers),) + tuple(
        _answer(k, steps, TRUE, layers=layers) for k in honest)
    return SpotEvidence(steps, answers, 0, 1_700_000_000_000)


def _fraud(net, who: SigningKey, evidence: SpotEvidence, deposit=3 * COIN) -> SpotFraud:
    nonce = net.nonces.get(who.public, 0)
    net.nonces[who.public] = nonce + 1
    return sign(SpotFraud(CHAIN, who.public, evidence, deposit, nonce, ZERO_SIG), who)


def _vote(net, verifier: bytes, cid: bytes, vote: int) -> SpotVote:
    key = net.node_key(verifier)
    return sign(SpotVote(CHAIN, key.public, cid, vote, ZERO_SIG), key)


def _refused(db, net, tx, error, match):
    with pytest.raises(error, match=match):
        check(db, with_txs(next_block(db, net).block, net, [tx]))


@pytest.fixture
def chain():
    """Six nodes of six accounts, all holding layers [0, 30); users accuse."""
    net = make_net(n_nodes=6)
    return net, new_db(net)


def _accused(net, db):
    liar = net.nodes[0]
    return liar, peer_key(liar), db.state.get(NODE + liar.public).account


def _open(net, db, evidence):
    """Accuse in block b; the verifiers are drawn at b + 2, from b + 1's beacon."""
    grow(db, net, 1, [_fraud(net, net.users[0], evidence)])
    cid = spotrules.case_id(evidence.answers[evidence.loser])
    assert db.state.get(SPOT + cid).status == spotrules.CASE_DUE
    grow(db, net, 1)
    assert db.state.get(SPOT + cid).status == spotrules.CASE_DUE
    grow(db, net, 1)
    case = db.state.get(SPOT + cid)
    assert case.status == spotrules.CASE_OPEN
    return cid, case


def _balance(db, account):
    return db.state.get(ACCOUNT + account).balance


def test_valid_evidence_is_upheld_the_liar_slashed_and_the_client_repaid(chain):
    net, db = chain
    liar, peer, liar_account = _accused(net, db)
    user = net.users[0].public
    before, bond = _balance(db, user), db.state.get(ACCOUNT + liar_account).bond
    burned = db.state.get(KEY_SUPPLY).burned
    cid, case = _open(net, db, _evidence(peer))
    assert _balance(db, user) == before - 3 * COIN  # the deposit is locked
    accounts = [db.state.get(NODE + k).account for k in case.verifiers]
    assert len(case.verifiers) == audit.APPEAL_VERIFIERS == len(set(accounts))
    assert liar_account not in accounts and user not in accounts
    paid = {a: _balance(db, a) for a in accounts}
    votes = [_vote(net, case.verifiers[0], cid, SPOT_DISAGREES),
             _vote(net, case.verifiers[1], cid, SPOT_DISAGREES),
             _vote(net, case.verifiers[2], cid, SPOT_AGREES)]
    grow(db, net, 1, votes)  # every vote in: judged at once
    fee = db.state.get(KEY_PARAMS).verify_fee
    assert db.state.get(SPOT + cid).status == spotrules.UPHELD
    assert db.state.get(SPOT + cid).deposit == 0
    assert db.state.get(ACCOUNT + liar_account).bond == 0  # slash_bps 10000
    assert db.state.get(JAIL + liar_account).strikes >= 1
    reward = bond * spotrules.SPOT_REWARD_BPS // audit.BPS
    assert _balance(db, user) == before + reward  # deposit back, and repaid from the slash
    assert [_balance(db, a) - paid[a] for a in accounts] == [fee] * 3
    assert db.state.get(KEY_SUPPLY).burned == burned + bond - reward - 3 * fee
    check_supply(db.state)
    _refused(db, net, _vote(net, case.verifiers[2], cid, SPOT_AGREES), E.BadSpotVote,
             "not open for votes")


def test_a_false_accusation_loses_the_deposit_to_the_accused(chain):
    net, db = chain
    liar, peer, accused_account = _accused(net, db)
    user = net.users[0].public
    before_user, before_accused = _balance(db, user), _balance(db, accused_account)
    bond = db.state.get(ACCOUNT + accused_account).bond
    cid, case = _open(net, db, _evidence(peer))
    grow(db, net, 1, [_vote(net, k, cid, SPOT_AGREES) for k in case.verifiers])
    fee = db.state.get(KEY_PARAMS).verify_fee
    assert db.state.get(SPOT + cid).status == spotrules.REJECTED
    assert _balance(db, user) == before_user - 3 * COIN
    assert _balance(db, accused_account) == before_accused + 3 * COIN - 3 * fee
    assert db.state.get(ACCOUNT + accused_account).bond == bond
    check_supply(db.state)


def test_silent_verifiers_are_struck_and_the_deposit_goes_back(chain):
    net, db = chain
    _, peer, accused_account = _accused(net, db)
    user = net.users[0].public
    before = _balance(db, user)
    cid, case = _open(net, db, _evidence(peer))
    grow(db, net, 1, [_vote(net, case.verifiers[0], cid, SPOT_DISAGREES)])
    strikes = lambda k: getattr(  # noqa: E731
        db.state.get(JAIL + db.state.get(NODE + k).account), "strikes", 0)
    was = {k: strikes(k) for k in case.verifiers}
    grow(db, net, case.final_height - db.height)
    assert db.state.get(SPOT + cid).status == spotrules.UNDECIDED  # one of three: no majority
    assert db.state.get(ACCOUNT + accused_account).bond > 0
    fee = db.state.get(KEY_PARAMS).verify_fee
    assert _balance(db, user) == before - fee  # the one judge is paid out of the deposit
    assert [strikes(k) - was[k] for k in case.verifiers][1:] == [1, 1]
    check_supply(db.state)


def test_an_unable_verifier_is_not_struck_and_decides_nothing(chain):
    net, db = chain
    _, peer, _ = _accused(net, db)
    cid, case = _open(net, db, _evidence(peer))
    grow(db, net, 1, [_vote(net, case.verifiers[0], cid, SPOT_DISAGREES),
                      _vote(net, case.verifiers[1], cid, SPOT_DISAGREES),
                      _vote(net, case.verifiers[2], cid, SPOT_UNABLE)])
    assert db.state.get(SPOT + cid).status == spotrules.UPHELD  # two of three drawn


def test_forged_and_mismatched_evidence_is_refused(chain):
    net, db = chain
    _, peer, _ = _accused(net, db)
    user = net.users[0]
    good = _evidence(peer)
    forged = replace(good.answers[0], signature=bytes(64))
    _refused(db, net, _fraud(net, user, replace(good, answers=(forged,) + good.answers[1:])),
             E.BadSpotFraud, "signature or output hash")
    net.nonces[user.public] = 0
    swapped = replace(good.answers[0], hidden=TRUE)  # the bytes the claim does not name
    _refused(db, net, _fraud(net, user, replace(good, answers=(swapped,) + good.answers[1:])),
             E.BadSpotFraud, "signature or output hash")
    net.nonces[user.public] = 0
    other_history = _evidence(peer, history=b"\x05" * 32)
    _refused(db, net, _fraud(net, user, other_history), E.BadSpotFraud, "another history")
    net.nonces[user.public] = 0
    _refused(db, net, _fraud(net, user, replace(good, loser=3)), E.BadSpotFraud, "accuses nobody")


def test_an_accused_key_bound_to_no_node_is_refused(chain):
    net, db = chain
    stranger = SigningKey(b"\x33" * 32)
    _refused(db, net, _fraud(net, net.users[0], _evidence(stranger)), E.BadSpotFraud,
             "bound to no bonded, registered node")


def test_an_account_cannot_accuse_its_own_node(chain):
    net, db = chain
    _, peer, _ = _accused(net, db)
    _refused(db, net, _fraud(net, net.wallets[0], _evidence(peer)), E.BadSpotFraud,
             "its own node")


def test_replayed_evidence_is_refused_even_rewrapped(chain):
    net, db = chain
    _, peer, _ = _accused(net, db)
    evidence = _evidence(peer)
    grow(db, net, 1, [_fraud(net, net.users[0], evidence)])
    _refused(db, net, _fraud(net, net.users[1], evidence), E.BadSpotFraud, "opened already")
    net.nonces[net.users[1].public] = 0
    rewrapped = replace(evidence, answers=evidence.answers[:2], time_ms=evidence.time_ms + 1)
    _refused(db, net, _fraud(net, net.users[1], rewrapped), E.BadSpotFraud, "opened already")


def test_oversize_evidence_is_refused(chain):
    net, db = chain
    _, peer, _ = _accused(net, db)
    big = (Step(0, (3,), bytes(MAX_SPOT_FRAUD_BYTES)), Step(3, (1,), b"token"))
    _refused(db, net, _fraud(net, net.users[0], _evidence(peer, steps=big)), E.BadSpotFraud,
             "at most")


def test_a_short_deposit_and_a_stranger_vote_are_refused(chain):
    net, db = chain
    _, peer, _ = _accused(net, db)
    least = spotrules.min_deposit(db.state.get(KEY_PARAMS))
    _refused(db, net, _fraud(net, net.users[0], _evidence(peer), deposit=least - 1),
             E.BadSpotFraud, "under the minimum")
    net.nonces[net.users[0].public] = 0
    cid, case = _open(net, db, _evidence(peer))
    outsider = next(k.public for k in net.nodes[1:] if k.public not in case.verifiers)
    _refused(db, net, _vote(net, outsider, cid, SPOT_DISAGREES), E.BadSpotVote, "not drawn")
    _refused(db, net, _vote(net, case.verifiers[0], cid, 7), E.BadSpotVote, "unknown spot vote")
    grow(db, net, 1, [_vote(net, case.verifiers[0], cid, SPOT_DISAGREES)])
    _refused(db, net, _vote(net, case.verifiers[0], cid, SPOT_DISAGREES), E.BadSpotVote,
             "voted on the case already")


def test_only_holders_of_the_claims_layers_are_drawn():
    """Nodes 0 (accused), 1 and 2 hold [0, 10); the others [10, 30): only 1 and 2 may judge."""
    net = make_net(n_nodes=6, layers=[(0, 10)] * 3 + [(10, 30)] * 3)
    db = new_db(net)
    peer = peer_key(net.nodes[0])
    cid, case = _open(net, db, _evidence(peer, layers=(0, 10)))
    assert sorted(case.verifiers) == sorted(k.public for k in net.nodes[1:3])


def test_with_nobody_to_judge_the_deposit_goes_back():
    net = make_net(n_nodes=2, layers=[(0, 10), (10, 30)])
    db = new_db(net)
    user = net.users[0].public
    before = _balance(db, user)
    grow(db, net, 1, [_fraud(net, net.users[0], _evidence(peer_key(net.nodes[0]),
                                                          layers=(0, 10)))])
    grow(db, net, 2)
    cid = spotrules.case_id(_evidence(peer_key(net.nodes[0]), layers=(0, 10)).answers[0])
    assert db.state.get(SPOT + cid).status == spotrules.UNDECIDED
    assert _balance(db, user) == before
    check_supply(db.state)
