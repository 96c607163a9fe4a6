"""`pwallet` from the command line: create, balance, send, history."""

from __future__ import annotations

import pytest

from ledger.types import COIN


@pytest.fixture
def node(tmp_path, pnode):
    d = str(tmp_path / "n")
    info = pnode("init", "--no-job", "--data-dir", d, "--chain-id", "w", "--slot-ms", "50", "--json").json()
    return d, info


def test_send_is_mined_and_shows_in_balance_and_history(node, pnode, pwallet):
    d, info = node
    bob = pwallet("create", "--data-dir", d, "--name", "bob", "--json").json()["address"]
    for amount in ("2.5", "0.000001", "1"):
        assert pwallet("send", bob, amount, "--data-dir", d).code == 0
    assert pnode("produce", "--data-dir", d, "--json").json()["blocks"][0]["txs"] == 3
    assert pwallet("balance", bob, "--data-dir", d, "--json").json()["balance_units"] == 3_500_001
    mine = pwallet("balance", "--data-dir", d, "--json").json()
    assert mine["balance_units"] == 1000 * COIN - 10 * COIN - 3_500_001 and mine["nonce"] == 4
    rows = pwallet("history", "--data-dir", d, "--json").json()["history"]
    assert [r["amount_units"] for r in rows] == [1000 * COIN, -10 * COIN, -2_500_000, -1, -COIN]
    assert [r["height"] for r in rows] == [0, 0, 1, 1, 1]
    bob_rows = pwallet("history", "--data-dir", d, "--wallet", "bob", "--json").json()["history"]
    assert sum(r["amount_units"] for r in bob_rows) == 3_500_001


def test_one_coin_is_said_in_the_singular(node, pnode, pwallet):
    d, info = node
    bob = pwallet("create", "--data-dir", d, "--name", "bob", "--json").json()["address"]
    r = pwallet("send", bob, "1", "--data-dir", d)
    assert r.code == 0 and r.out.startswith(f"queued 1 coin to {bob[:16]}..")
    assert pwallet("send", bob, "1.5", "--data-dir", d).out.startswith("queued 1.5 coins to ")
    assert pnode("produce", "--data-dir", d).code == 0
    assert pwallet("balance", bob, "--data-dir", d).out.startswith("2.5 coins (bond 0) ")
    assert pwallet("send", "--data-dir", d, "--wallet", "bob", info["address"], "1.5").code == 0
    assert pnode("produce", "--data-dir", d).code == 0
    assert pwallet("balance", bob, "--data-dir", d).out.startswith("1 coin (bond 0) at height")


def test_overspend_is_refused_before_queueing(node, pwallet):
    d, _ = node
    bob = pwallet("create", "--data-dir", d, "--name", "bob", "--json").json()["address"]
    assert pwallet("send", bob, "980", "--data-dir", d).code == 0
    r = pwallet("send", bob, "15", "--data-dir", d)  # 980 queued already; 990 held
    assert r.code == 2 and "balance" in r.err
    queued = [r for r in pwallet("history", "--data-dir", d, "--json").json()["history"]
              if r["height"] is None]
    assert len(queued) == 1


def test_wrong_passphrase_is_a_clear_error(node, pwallet, monkeypatch):
    d, info = node
    monkeypatch.setenv("PNODE_PASSPHRASE", "wrong")
    r = pwallet("send", info["address"], "1", "--data-dir", d)
    assert r.code == 2 and r.err.strip() == "error: wrong passphrase for key file"


def test_passphrase_file_is_used(node, pwallet, monkeypatch, tmp_path):
    d, _ = node
    monkeypatch.delenv("PNODE_PASSPHRASE")
    (tmp_path / "pass").write_text("correct horse\n")
    bob = "ab" * 32
    r = pwallet("send", bob, "1", "--data-dir", d, "--passphrase-file", str(tmp_path / "pass"))
    assert r.code == 0, r.err


@pytest.mark.parametrize("amount", ["0", "-1", "abc", "1.0000001", "nan", "1e30"])
def test_bad_amounts_are_refused(node, pwallet, amount):
    d, _ = node
    r = pwallet("send", "ab" * 32, amount, "--data-dir", d)
    assert r.code == 2 and "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1


def test_bad_wallet_name_and_missing_wallet(node, pwallet):
    d, _ = node
    assert pwallet("create", "--data-dir", d, "--name", "../evil").code == 2
    r = pwallet("balance", "--data-dir", d, "--wallet", "ghost")
    assert r.code == 2 and "ghost" in r.err


@pytest.mark.parametrize("command", ["create", "balance", "send", "history"])
def test_every_command_has_help_with_examples(pwallet, command):
    r = pwallet(command, "--help")
    assert r.code == 0 and "Example" in r.out
