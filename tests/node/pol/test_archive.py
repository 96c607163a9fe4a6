"""node.pol.archive on disk: a reopened archive serves what it kept; damage, crashes, retention.

A worker's units (tests/node/pol/polkit.py) are kept in a real directory,
the archive object is dropped and a new one opened on the directory, as a
restarted node opens its data dir's ``pol/``. What it serves goes through
`ArchiveFetcher` (the replies `/pnode/pol/1.0.0` sends, checked as a
verifier checks them). Damage is done to the files as a disk or an
interrupted write leaves them; a crash is a real SIGKILL of a process
writing units.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import trio

from compute.wiretensor import encode_tensor
from ledger.codec import decode
from ledger.crypto import ZERO32
from ledger.types import Receipt, tx_hash
from node.pol.archive import AUDITED_KEEP_STEPS, KEEP_STATES, PolArchive, state_key
from node.pol.fetch import ArchiveFetcher, reply_for
from node.wire import CLIENT, EVIDENCE, PolRequest
from proof_of_learning.units import tensor_digest
from proof_of_learning.certificate import (
    GRADIENT_MISMATCH, TOLERANCE, Digest, Evidence, decode_cert, digest_map,
)
from tests.node.pol.polkit import JOB, make_worker, run_step
from tests.ledger.fskit import fill_until_free, small_fs  # noqa: F401,F811 (fixture)
from tests.node.prockit import ROOT


def files(d: Path, sub: str) -> set[str]:
    return {p.name for p in (d / sub).iterdir()}


def unit_keys(a: PolArchive, step: int | None = None) -> dict[bytes, dict]:
    """Every kept unit's (of ``step``, or all) certificate hash, named sets and tensor
    digests, by receipt hash."""
    out = {}
    for h in (h for h, s in a.receipts().items() if step in (None, s)):
        receipt = decode(a.receipt(h), Receipt)
        cert = decode_cert(a.encoded(receipt.cert_hash))
        named = [k for k in (cert.weights_hash, cert.grads_hash) if k != ZERO32]
        out[h] = {"cert": receipt.cert_hash, "named": named,
                  "tensors": [*digest_map(cert.inputs).values(), *digest_map(cert.outputs).values(),
                              *(d for k in named for d in a.named_digests(k).values())]}
    return out


def served(a: PolArchive, keys: dict[bytes, dict], states: list[tuple[int, int]]) -> dict:
    """What ``a`` serves of ``keys`` and ``states``, fetched and checked as a verifier does."""
    fetcher = ArchiveFetcher({"w": a})

    async def main():
        out = {}
        for h, k in keys.items():
            out[h] = {"cert": await fetcher.cert_bytes(["w"], JOB, k["cert"]),
                      "named": [await fetcher.named(["w"], JOB, n) for n in k["named"]],
                      "tensors": [await fetcher.tensor(["w"], JOB, d) for d in k["tensors"]]}
        out["states"] = [await fetcher.state(["w"], JOB, s, p) for s, p in states]
        assert fetcher.bad == {}  # nothing served under a key it does not hash to
        return out
    return trio.run(main)


def same(x, y) -> bool:
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and all(map(same, x, y))
    return x == y


def an_evidence(cert_key: bytes) -> Evidence:
    return Evidence(b"\x88" * 32, cert_key, GRADIENT_MISMATCH, TOLERANCE, 0x38D1B717,
                    (Digest("y", b"\x66" * 32),), ())


@pytest.mark.parametrize("sync_each", [True, False])
def test_a_reopened_archive_serves_every_unit_tensor_named_set_state_and_evidence(
        tmp_path, sync_each):
    d = tmp_path / "pol"
    w = make_worker(2, path=d, sync_each=sync_each)
    run_step(w, 0)
    run_step(w, 1)
    w.archive.keep_state(JOB, 2, CLIENT, w.replayer.part_state(CLIENT))
    w.archive.keep_state(JOB, 2, 0, w.replayer.part_state(0))
    receipt = w.receipts[(1, 2)]
    ev_key = w.archive.keep_evidence(1, an_evidence(receipt.cert_hash))
    w.archive.mark_audited({tx_hash(receipt)})
    keys, states = unit_keys(w.archive), [(2, CLIENT), (2, 0)]
    assert len(keys) == 8 and all(k["tensors"] for k in keys.values())
    before = served(w.archive, keys, states)
    assert all(v is not None for k in keys for v in (before[k]["cert"], *before[k]["named"],
                                                     *before[k]["tensors"]))
    assert all(s is not None for s in before["states"])
    kept = w.archive.receipts(), {h: w.archive.receipt(h) for h in keys}
    ev = w.archive.encoded(ev_key)
    w.archive = None  # the process ends: nothing of the object survives

    again = PolArchive(path=d)
    assert again.receipts() == kept[0] and {h: again.receipt(h) for h in keys} == kept[1]
    assert same(served(again, keys, states), before)
    assert again.state_steps() == [2]
    assert again.encoded(ev_key) == ev
    assert reply_for(again, PolRequest(EVIDENCE, JOB, ev_key)).data == ev
    # The audited mark came back too: it outlives the 4 steps of an unaudited unit.
    again.forget(set(keys), step_now=1 + again.keep_steps + 1)
    assert again.receipts() == {tx_hash(receipt): 1}
    assert served(again, {tx_hash(receipt): keys[tx_hash(receipt)]}, [])[tx_hash(receipt)][
        "cert"] is not None


def test_a_damaged_file_is_not_served_and_is_deleted(tmp_path):
    d = tmp_path / "pol"
    w = make_worker(2, path=d)
    run_step(w, 0)
    keys = unit_keys(w.archive)
    h, k = next((h, k) for h, k in keys.items() if len(k["named"]) == 2)  # a backward unit
    weights = w.archive.named_digests(k["named"][0])
    cut, other = sorted(set(weights.values()))[:2]
    (d / "tensors" / cut.hex()).write_bytes((d / "tensors" / cut.hex()).read_bytes()[:-5])
    # A whole wire tensor, but another tensor than its name says (a misplaced write).
    (d / "tensors" / other.hex()).write_bytes(encode_tensor(torch.ones(4)))
    cert_file = d / "certs" / k["cert"].hex()
    data = bytearray(cert_file.read_bytes())
    data[-1] ^= 1  # a flipped bit
    cert_file.write_bytes(bytes(data))
    for again in (False, True):  # at once, and opened again
        a = PolArchive(path=d) if again else w.archive
        got = served(a, {h: k}, [])[h]
        assert got["cert"] is None and got["named"][0] is None
        assert a.tensor(cut) is None and a.tensor(other) is None
        assert not {cut.hex(), other.hex()} & files(d, "tensors")
        assert k["cert"].hex() not in files(d, "certs")
        assert got["named"][1] is not None  # the gradients are whole: still served
    untouched = next(x for x in keys if x != h and k["cert"] != keys[x]["cert"])
    assert served(PolArchive(path=d), {untouched: keys[untouched]}, [])[untouched]["cert"]


def test_retention_deletes_the_files_of_what_it_forgets(tmp_path):
    d = tmp_path / "pol"
    w = make_worker(2, path=d)
    a = w.archive
    for t in range(3):
        run_step(w, t)
    by_step = {t: {h for h, s in a.receipts().items() if s == t} for t in range(3)}
    keys = unit_keys(a)
    at = {t: {x.hex() for h in by_step[t] for x in keys[h]["tensors"]} for t in range(3)}
    assert at[0] <= files(d, "tensors") and at[2] <= files(d, "tensors")
    # Steps 0 and 1 done, and older than the last keep_steps steps: their units go.
    a.forget(by_step[0] | by_step[1], step_now=1 + a.keep_steps + 1)
    assert set(a.receipts()) == by_step[2]
    left = files(d, "tensors")
    assert at[2] <= left and not (at[0] - at[2]) & left  # shared digests stay (same weights)
    assert not {keys[h]["cert"].hex() for h in by_step[0]} & files(d, "certs")
    again = PolArchive(path=d)
    assert set(again.receipts()) == by_step[2] and files(d, "tensors") == left
    # States: the newest KEEP_STATES steps stay, the files of older ones go.
    for s in range(KEEP_STATES + 2):
        again.keep_state(JOB, 100 + s, CLIENT, {"w": torch.full((3,), float(s))})
    assert again.state_steps() == [100 + s for s in range(2, KEEP_STATES + 2)]
    assert again.state(state_key(JOB, 100, CLIENT)) is None
    gone = [encode_tensor(torch.full((3,), float(s))) for s in (0, 1)]
    assert all(torch.equal(again.state(state_key(JOB, 100 + s, CLIENT))["w"],
                           torch.full((3,), float(s))) for s in range(2, KEEP_STATES + 2))
    assert not any((d / "tensors" / n).read_bytes() in gone for n in files(d, "tensors"))
    assert PolArchive(path=d).state_steps() == again.state_steps()
    # Audited units are kept AUDITED_KEEP_STEPS steps, then go with their files.
    again.mark_audited(by_step[2])
    again.forget(by_step[2], step_now=2 + again.keep_steps + 1)
    assert set(again.receipts()) == by_step[2]
    again.forget(by_step[2], step_now=2 + AUDITED_KEEP_STEPS + 1)
    assert again.receipts() == {} and files(d, "certs") == set()
    assert PolArchive(path=d).receipts() == {}


def test_interrupted_writes_leave_nothing_served_wrongly(tmp_path):
    """What an interrupted write leaves: a temporary file, a payload whose journal record
    never came, a torn last journal line. The next open serves none of it, deletes the
    files, and keeps a whole journal for what comes after."""
    d = tmp_path / "pol"
    w = make_worker(2, path=d)
    run_step(w, 0)
    first = unit_keys(w.archive)
    journal = (d / "journal").read_bytes()
    run_step(w, 1)
    second = {h: k for h, k in unit_keys(w.archive).items() if h not in first}
    lines = (d / "journal").read_bytes()[len(journal):].split(b"\n")
    assert len(lines) > 2
    # The journal's last record (step 1's last unit), torn half way through its append.
    (d / "journal").write_bytes(journal + b"\n".join(lines[:-2]) + b"\n" + lines[-2][:300])
    torn = [h for h in second if h.hex() in lines[-2].decode(errors="replace")]
    assert len(torn) == 1
    # A temporary file of a write under way, and an orphan: a whole file, no record.
    (d / "tensors" / f"{'ab' * 32}.tmp").write_bytes(b"PNWT\x01")
    orphan = torch.arange(5.0)
    (d / "tensors" / tensor_digest(orphan).hex()).write_bytes(encode_tensor(orphan))
    w.archive = None
    a = PolArchive(path=d)
    assert set(a.receipts()) == set(first) | set(second) - set(torn)
    assert a.tensor(tensor_digest(orphan)) is None
    assert not any(n.endswith(".tmp") or n == tensor_digest(orphan).hex()
                   for n in files(d, "tensors"))
    alive = {h: k for h, k in {**first, **second}.items() if h not in torn}
    got = served(a, alive, [])
    assert all(v is not None for h in alive for v in (got[h]["cert"], *got[h]["named"],
                                                      *got[h]["tensors"]))
    torn_tensors = set(second[torn[0]]["tensors"]) - {
        x for h in alive for x in alive[h]["tensors"]}
    assert not {x.hex() for x in torn_tensors} & files(d, "tensors")
    # The journal is whole again: a unit kept now survives the next open.
    w.archive = a
    run_step(w, 2)
    assert set(PolArchive(path=d).receipts()) == set(a.receipts())
    assert all(json.loads(line) for line in (d / "journal").read_bytes().splitlines())


CHILD = """
import sys
from tests.node.pol.polkit import make_worker, run_step
w = make_worker(2, path=sys.argv[1], sync_each=sys.argv[2] == "1")
for t in range(1000):
    run_step(w, t)
    print(t, flush=True)
"""


@pytest.mark.parametrize("sync_each", [True, False])
def test_a_worker_killed_while_writing_leaves_every_kept_unit_whole(tmp_path, sync_each):
    """SIGKILL a process keeping units while it writes one of its third step's files:
    every unit the reopened archive lists is served whole, and no file is left that it
    does not name. Also when it fsyncs nothing (a running node's setting: the page
    cache outlives a killed process)."""
    d = tmp_path / "pol"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(d), "1" if sync_each else "0"],
                             cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)},
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "0"
        assert child.stdout.readline().strip() == "1"
        # Mid-way through step 2's units: at a write under way (a temporary file there),
        # or, should polling miss every one, once the step is done.
        tensors = d / "tensors"
        while child.poll() is None and not any(n.endswith(".tmp") for n in os.listdir(tensors)):
            if select.select([child.stdout], [], [], 0)[0]:
                break
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    a = PolArchive(path=d)
    steps = sorted(set(a.receipts().values()))
    assert steps[:2] == [0, 1] and len(a.receipts()) >= 8
    keys = unit_keys(a)
    got = served(a, keys, [])
    assert all(v is not None for h in keys for v in (got[h]["cert"], *got[h]["named"],
                                                     *got[h]["tensors"]))
    named = {x.hex() for k in keys.values() for x in k["tensors"]}
    assert files(d, "tensors") == named  # nothing unnamed left, nothing named missing
    assert not any(p.name.endswith(".tmp") for p in d.rglob("*"))


def test_a_full_disk_loses_those_units_and_not_the_archive(small_fs):
    """On a full disk units are kept in part or not at all, and a journal append fails
    half way (the miner mines on; its verifiers say UNAVAILABLE); once there is room,
    units are kept whole again, and the journal, rewritten, is whole for the next open."""
    d = small_fs / "pol"
    w = make_worker(2, path=d)
    run_step(w, 0)
    before = files(d, "tensors")
    filler = fill_until_free(small_fs, 0)
    run_step(w, 1)  # nothing raised: what did not fit was logged
    assert files(d, "tensors") == before
    assert sorted(w.archive.receipts().values()) == [0] * 4  # no certificate: no unit
    filler.unlink()
    # Room for step 2 (the filesystem holds about one step): steps 0 and 1 forgotten.
    w.archive.forget(set(w.archive.receipts()), step_now=2 + w.archive.keep_steps)
    assert w.archive.receipts() == {} and files(d, "tensors") == set()
    run_step(w, 2)
    fine = unit_keys(w.archive, 2)
    assert len(fine) == 4
    w.archive = None
    a = PolArchive(path=d)
    assert set(a.receipts()) == set(fine)  # the forgetting, too, came after the torn line
    got = served(a, fine, [])  # and nothing served under a key it does not hash to
    assert all(v is not None for h in fine for v in (got[h]["cert"], *got[h]["named"],
                                                     *got[h]["tensors"]))
    assert all(json.loads(line) for line in (d / "journal").read_bytes().splitlines())


def test_a_restarted_worker_still_serves_the_units_it_signed_before(tmp_path):
    """Real node processes (`pnode devnet`'s): node 1 signs units, is killed (SIGKILL) and
    started again on its data dir; a verifier then fetches, over /pnode/pol/1.0.0, the
    certificate, named sets and every input and output of each unit of node 1's that
    the chain holds from before the crash."""
    from node.cli import devnet_run
    from node.cli.common import read_view
    from node.datadir import DataDir
    from node.net.host import open_host
    from node.pol.fetch import PolFetcher
    from tests.node.netkit import ident
    from tests.node.prockit import wait_for

    dirs, job_file = devnet_run.create(tmp_path / "dn", 2, 8, "devnet")
    key = DataDir(dirs[1]).node_key().public
    with devnet_run.Devnet(dirs, job_file) as net:
        net.start(0)
        net.start(1)
        wait_for(lambda: read_view(DataDir(dirs[1]), "receipts", node=key.hex())["receipts"],
                 "a receipt of node 1 on chain", limit=300, step=0.5)
        net.kill(1)
        chain = DataDir(dirs[1]).open_chain()
        try:
            signed = [tx for block in chain.iter_blocks() for tx in block.txs
                      if isinstance(tx, Receipt) and tx.node_key == key]
        finally:
            chain.close()
        assert signed
        net.start(1)

        async def fetch_all():
            async with open_host(ident(9)) as me:
                peer = str(await me.connect(net.addrs[1]))
                fetcher = PolFetcher(me, wait_s=30)
                with trio.fail_after(180):  # it serves once its first syncs are over
                    while await fetcher.cert_bytes([peer], signed[0].job_id,
                                                   signed[0].cert_hash) is None:
                        await trio.sleep(0.5)
                for r in signed:
                    cert = decode_cert(await fetcher.cert_bytes([peer], r.job_id, r.cert_hash))
                    for k in (cert.weights_hash, cert.grads_hash):
                        assert k == ZERO32 or await fetcher.named([peer], r.job_id, k), k
                    for name, d in {**digest_map(cert.inputs),
                                    **digest_map(cert.outputs)}.items():
                        assert await fetcher.tensor([peer], r.job_id, d) is not None, name
                assert fetcher.bad == {}
        trio.run(fetch_all)
