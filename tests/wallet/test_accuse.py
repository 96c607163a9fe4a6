"""`pwallet accuse`: a spot check's evidence file becomes a case on a real chain's store."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from ledger import spotrules
from ledger.codec import encode
from ledger.crypto import SigningKey
from ledger.spot import S_STEP, SignedAnswer, SpotEvidence, Step, StepClaim, history_of, input_hash
from ledger.state import ACCOUNT, SPOT
from node.datadir import DataDir


@pytest.fixture
def chain(tmp_path, pnode, pwallet):
    """A one-node chain (its node bonded) and bob, funded, who accuses it."""
    d = str(tmp_path / "n")
    pnode("init", "--no-job", "--data-dir", d, "--chain-id", "w", "--slot-ms", "50", "--json")
    bob = pwallet("create", "--data-dir", d, "--name", "bob", "--json").json()["address"]
    assert pwallet("send", bob, "20", "--data-dir", d).code == 0
    assert pnode("produce", "--data-dir", d).code == 0
    return d, bytes.fromhex(bob)


def _evidence(liar: SigningKey, loser: int = 0) -> SpotEvidence:
    """``liar``'s signed answer to a step, outvoted by two servers of no chain."""
    steps = (Step(0, (3,), b"prompt" * 8), Step(3, (1,), b"token" * 8))

    def answer(key: SigningKey, hidden: bytes) -> SignedAnswer:
        claim = StepClaim(b"\x09" * 32, "smollm2-135m", 0, 30, 3, input_hash(steps[-1]),
                          history_of(steps), hashlib.sha256(hidden).digest())
        return SignedAnswer(key.public, claim, hidden, key.sign(S_STEP, encode(claim)))

    honest = [answer(SigningKey(bytes([i]) * 32), b"\x01" * 64) for i in (0x71, 0x72)]
    return SpotEvidence(steps, (answer(liar, b"\x02" * 64), *honest), loser, 1)


def _file(tmp_path, evidence: SpotEvidence | bytes, name="e.spot") -> str:
    path = tmp_path / name
    path.write_bytes(evidence if isinstance(evidence, bytes) else encode(evidence))
    return str(path)


def _state(d: str, key: bytes):
    with DataDir(d).open_chain() as db:
        return db.state.get(key)


def test_an_accusation_is_queued_mined_and_its_case_judged(chain, tmp_path, pnode, pwallet):
    d, bob = chain
    before = _state(d, ACCOUNT + bob).balance
    evidence = _evidence(DataDir(d).peer_key())
    r = pwallet("accuse", _file(tmp_path, evidence), "--data-dir", d, "--wallet", "bob", "--json")
    assert r.code == 0, r.err
    info = r.json()
    assert info["case_id"] == spotrules.case_id(evidence.answers[0]).hex()
    assert info["deposit_units"] == spotrules.min_deposit(DataDir(d).read_genesis().params)
    assert pnode("produce", "--data-dir", d).code == 0
    case = _state(d, SPOT + bytes.fromhex(info["case_id"]))
    assert case.status == spotrules.CASE_DUE and case.accuser == bob
    assert _state(d, ACCOUNT + bob).balance == before - info["deposit_units"]
    # Two blocks on: the only node is the accused's, so nobody may judge: the deposit is back.
    assert pnode("produce", "--data-dir", d, "--blocks", "2").code == 0
    assert _state(d, SPOT + bytes.fromhex(info["case_id"])).status == spotrules.UNDECIDED
    assert _state(d, ACCOUNT + bob).balance == before
    again = pwallet("accuse", _file(tmp_path, evidence), "--data-dir", d, "--wallet", "bob")
    assert again.code == 2 and "opened already" in again.err


def test_files_the_chain_would_refuse_are_refused_here(chain, tmp_path, pwallet):
    d, _ = chain
    liar = DataDir(d).peer_key()
    good = _evidence(liar)
    forged = replace(good, answers=(replace(good.answers[0], signature=bytes(64)),)
                     + good.answers[1:])
    cases = [(b"not evidence", "is not spot-check evidence"),
             (forged, "does not verify"),
             (_evidence(liar, loser=3), "accuses nobody"),
             (_evidence(SigningKey(b"\x33" * 32)), "bound to no bonded, registered node")]
    for i, (evidence, message) in enumerate(cases):
        r = pwallet("accuse", _file(tmp_path, evidence, f"{i}.spot"), "--data-dir", d,
                    "--wallet", "bob")
        assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1, r.err
    r = pwallet("accuse", _file(tmp_path, good), "--data-dir", d, "--wallet", "bob",
                "--deposit", "0.5")
    assert r.code == 2 and "under the minimum" in r.err


def test_accuse_has_help_with_examples(pwallet):
    r = pwallet("accuse", "--help")
    assert r.code == 0 and "Example" in r.out and "EVIDENCE_FILE" in r.out
