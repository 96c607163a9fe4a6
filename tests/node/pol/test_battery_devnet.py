"""The attack battery's newer cheats (issue 27), each on a real devnet with every receipt audited.

Each devnet: real nodes on 127.0.0.1, the real chain and audits; the
cheater is caught and slashed, no honest node is. One devnet per test, so
the two test workers never run two at once in this file.
"""

from __future__ import annotations

from node.cli import devnet_run
from node.mine import DEVNET_PARAMS
from node.mine.devnet import BOND
from ledger.types import COIN

VERDICTS = 12  # blocks a verifier (and an appeal's) has: room on a loaded machine


def run(tmp_path, n: int, steps: int, attacks: dict[int, str], **params) -> dict:
    """A devnet of ``n`` nodes, ``attacks`` by node, run to the end and settled: its summary."""
    dirs, job_file = devnet_run.create(tmp_path / "dn", n, steps, "devnet",
                                       params={"audit_bps": 10_000, "verdict_window": VERDICTS,
                                               **params})
    with devnet_run.Devnet(dirs, job_file, attacks=attacks) as net:
        for i in range(n):
            net.start(i, wait_peers=n - 1)
        devnet_run.follow(net, steps, duration=240)
        # Past every window: a fail's appeal window, the appeal's draw and its votes.
        devnet_run.settle(net, DEVNET_PARAMS["challenge_window"] + 3 * VERDICTS + 6)
    info = devnet_run.summary(dirs)
    info["logs"] = [(d / "node.log").read_text() if (d / "node.log").exists() else ""
                    for d in dirs]
    return info


def slashed(info: dict) -> list[bool]:
    return [n["slashed"] > 0 for n in info["nodes"]]


def test_a_sub_threshold_steering_cheat_is_caught_in_its_own_compute_class(tmp_path):
    """9e-5 x max|g| on every gradient passed the old 1e-4 tolerance 80 times of 80."""
    info = run(tmp_path, 3, 4, {0: "sub-threshold"})
    assert slashed(info) == [True, False, False]
    assert info["nodes"][0]["slashed"] == BOND // COIN
    assert info["verdicts"]["reasons"].get("gradient mismatch", 0) >= 1


def test_a_withholding_producer_is_still_caught(tmp_path):
    """random-update, and node0 seals no block whose beacon would audit its receipts: the
    next producer's beacon draws again (one re-draw per slot it holds, specs/pol.md 5.1)."""
    info = run(tmp_path, 3, 8, {0: "random-update+withholding"}, audit_bps=5000)
    assert slashed(info) == [True, False, False]


def test_a_colluding_lazy_verifier_does_not_save_its_partner(tmp_path):
    """node1 passes whatever it is drawn for and withholds blocks that would re-check its
    passes; verifiers are drawn uniformly, so node0's other audits catch it."""
    info = run(tmp_path, 4, 5, {0: "scaled-gradients", 1: "lazy-verifier+withholding"},
               recheck_bps=10_000)
    assert slashed(info)[0] and not any(slashed(info)[2:])


def test_a_malicious_verifiers_fails_are_appealed_and_its_bond_burns(tmp_path):
    """node0 fails everything with made-up evidence; every failed worker appeals, the
    appeal's fresh verifiers re-execute and pass, and the accuser is slashed instead."""
    info = run(tmp_path, 4, 5, {0: "malicious-verifier"})
    assert slashed(info) == [True, False, False, False], info["nodes"]
    assert any("appealed the failing verdict" in log for log in info["logs"][1:])
