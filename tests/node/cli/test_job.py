"""Jobs on a chain made with `pnode init`: mined by `pnode start` alone, posted with `pnode job`.

A real node process on 127.0.0.1 mines the chain's own job from genesis,
then a job another wallet pays for; the job commands read the running
node, the bad job files and deposits are refused offline.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from ledger.types import COIN
from tests.node.prockit import read, stop, wait_for


def _job(pnode, d, job_id):
    r = pnode("job", "show", job_id, "--data-dir", str(d), "--json")
    assert r.code == 0, r.err
    return r.json()


def test_init_then_start_mines_the_chains_job_then_a_paid_one(tmp_path, pnode, pwallet, spawn):
    d = tmp_path / "n"
    (tmp_path / "first.json").write_text('{"steps": 3}')
    r = pnode("init", "--data-dir", str(d), "--chain-id", "t-job", "--slot-ms", "100",
              "--job", str(tmp_path / "first.json"), "--json")
    assert r.code == 0, r.err
    (first,) = r.json()["jobs"]
    carol = pwallet("create", "--data-dir", str(d), "--name", "carol", "--json").json()["address"]
    assert pwallet("send", carol, "100", "--data-dir", str(d)).code == 0  # sealed once it runs

    proc, out, err = spawn("n", "--no-serve", "--data-dir", str(d),  # no --job: the chain's
                           "--log-level", "info")  # the default: repeats go quiet
    wait_for(lambda: _job(pnode, d, first)["state"] == "finished", "the chain's job", limit=90)
    assert f"mining job {first[:16]}" in read(out)
    # The chain says finished once the last receipt is in; the miner applies the last
    # update just after (a loaded run once exported step 2 in between).
    wait_for(lambda: (pnode("status", "--data-dir", str(d), "--json").json().get("mining")
                      or {}).get("step") == 3, "the last update", limit=30)
    _export_beats_the_initial_model(pnode, d, tmp_path, first)
    listed = pnode("job", "list", "--data-dir", str(d), "--json").json()
    assert listed["running"] is True and [j["id"] for j in listed["jobs"]] == [first]
    wait_for(lambda: "the chain has no job left to train" in read(out), "the idle line")

    (tmp_path / "paid.json").write_text('{"steps": 2, "seed": 7}')
    r = pnode("job", "submit", str(tmp_path / "paid.json"), "--wallet", "carol",
              "--data-dir", str(d), "--json")
    assert r.code == 0, r.err
    paid, deposit = r.json()["id"], r.json()["deposit_units"]
    assert deposit == r.json()["cost_units"] == 2 * 4 * 3 * COIN  # reward + 2 fees a unit
    assert pwallet("balance", carol, "--data-dir", str(d), "--json").json()["balance_units"] \
        == 100 * COIN  # queued, not yet in a block
    settled = wait_for(lambda: (j := _job(pnode, d, paid))["state"] == "finished"
                       and j["escrow_units"] == 0 and j["receipts_pending"] == 0 and j,
                       "the paid job, settled", limit=90)
    assert settled["paid_by"] == "deposit" and settled["step"] == 2
    # Eight units paid one coin each out of the deposit; the rest came back.
    assert pwallet("balance", carol, "--data-dir", str(d), "--json").json()["balance_units"] \
        == 100 * COIN - 2 * 4 * COIN
    assert f"mining job {paid[:16]}" in read(out)
    losses = [json.loads(line) for line in read(d / "train.jsonl").splitlines()]
    assert len(losses) == 3 + 2  # one loss a step, for each job
    _reads_go_through_the_running_node(pnode, pwallet, d, tmp_path, carol)
    produced = [line for line in read(out).splitlines() if line.startswith("produced block")]
    assert len(produced) == 3 and "--log-level debug" in produced[-1]
    assert pnode("status", "--data-dir", str(d), "--json").json()["blocks_produced"] > 10
    log = read(d / "node.log")  # D/node.log: the same lines, with their times
    assert "INFO pnode: listening on" in log and log.count("produced block") == 3
    assert stop(proc) == 0, read(err)
    r = pwallet("send", carol, "1", "--wait", "--data-dir", str(d))
    assert r.code == 2 and "--wait needs a running node" in r.err
    offline = pnode("job", "status", paid[:10], "--data-dir", str(d), "--json").json()
    assert offline["running"] is False and offline["id"] == paid


def _export_beats_the_initial_model(pnode, d, tmp_path, job_id):
    """The exported weights are the trained model: lower loss on the job's data than at step 0."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from compute.data import batch, make_model
    from compute.model import Transformer
    from compute.jobfile import config_from_json

    out = tmp_path / "model.safetensors"
    r = pnode("job", "export", job_id[:12], "--out", str(out), "--data-dir", str(d), "--json")
    assert r.code == 0, r.err
    assert r.json()["step"] == 3 and r.json()["bytes"] == out.stat().st_size
    with safe_open(str(out), "pt") as f:
        meta = f.metadata()
    assert meta["pnode_job"] == job_id and meta["pnode_step"] == "3"
    config = config_from_json(meta["pnode_config"])
    trained = Transformer(config.model)
    trained.load_state_dict(load_file(str(out)))
    initial = make_model(config)
    ids, targets = batch(config, step=99)  # a batch no step trained on
    losses = [torch.nn.functional.cross_entropy(m(ids).flatten(0, 1), targets.flatten()).item()
              for m in (initial, trained)]
    assert losses[1] < losses[0] - 0.3, losses
    for bad, words in ((str(tmp_path / "m.gguf"), "no tokenizer to put in a GGUF file: export "
                        "it as .safetensors"), ("model.pt", "ending in .safetensors or .gguf"),
                       (str(tmp_path / "no" / "m.safetensors"), "not a directory")):
        r = pnode("job", "export", job_id, "--out", bad, "--data-dir", str(d))
        assert r.code == 2 and words in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert not (tmp_path / "m.gguf").exists()
    r = pnode("job", "export", "ffff", "--out", str(out), "--data-dir", str(d))
    assert r.code == 2 and "mined no job" in r.err, r.err


def _reads_go_through_the_running_node(pnode, pwallet, d, tmp_path, carol):
    """The store is the node's: every read command asks it, and gets the store's answer."""
    block = pnode("ledger", "show", "--data-dir", str(d), "--json").json()
    assert block["running"] is True and all(len(tx["id"]) == 64 for tx in block["txs"])
    rid = pnode("receipts", "--data-dir", str(d), "--json").json()["receipts"][-1]["id"]
    r = pnode("proof", rid, "--data-dir", str(d))
    assert r.code == 0, r.err
    (tmp_path / "r.proof").write_text(r.out)
    r = pnode("verify", "proof", str(tmp_path / "r.proof"), "--data-dir", str(d), "--json")
    assert r.code == 0 and r.json()["ok"], r.out + r.err
    checked = pnode("verify", "chain", "--data-dir", str(d), "--json").json()
    assert checked["ok"] and checked["running"] is True
    mine = pwallet("history", "--data-dir", str(d), "--json").json()
    assert mine["running"] is True
    assert sum(r["amount_units"] for r in mine["history"] if r["height"] is not None) == mine["balance_units"]
    assert {"Allocation", "Register", "Transfer", "Reward"} <= {r["type"] for r in mine["history"]}
    hers = pwallet("history", carol, "--data-dir", str(d), "--json").json()["history"]
    assert [r["type"] for r in hers] == ["Transfer", "Job", "JobRefund"]
    assert sum(r["amount_units"] for r in hers) == 100 * COIN - 2 * 4 * COIN
    bad = pnode("ledger", "show", "99999", "--data-dir", str(d))
    assert bad.code == 2 and "the tip is" in bad.err
    sent = pwallet("send", carol, "1.5", "--wait", "--data-dir", str(d), "--json")
    assert sent.code == 0, sent.err
    doc = sent.json()
    assert doc["amount"] == "1.5" and doc["proof"]["tx"]["amount"] == 1_500_000
    assert doc["height"] == doc["proof"]["header"]["height"] >= 1
    (tmp_path / "t.proof").write_text(json.dumps({"kind": "TxProof", **{
        k: v for k, v in doc["proof"].items() if k != "kind"}}))
    r = pnode("verify", "proof", str(tmp_path / "t.proof"), "--data-dir", str(d), "--json")
    assert r.code == 0 and r.json()["kind"] == "TxProof", r.out + r.err


@pytest.fixture
def chain(tmp_path, pnode, pwallet):
    d = tmp_path / "n"
    assert pnode("init", "--no-job", "--data-dir", str(d), "--chain-id", "t-jobs").code == 0
    return d


@pytest.mark.parametrize("job_file, args, words", [
    ('{"steps": 5, "kk": 1}', (), "unknown job field kk"),
    ('{"k": 99}', (), "k must be in"),
    ('{"model": 3}', (), "model must be a JSON object"),
    ('{"data": {"source": "file", "path": "/nonexistent.txt"}}', (), "cannot read training data"),
    ('{"data": {"source": "file", "path": "TINY"}}', (), "corpus longer than seq_len"),
    ('{"steps": 20000000}', (), "at most 10000000 steps"),
    ('[1, 2]', (), "one JSON object"),
    ('{"steps": 5}', ("--deposit", "1"), "deposit short: the job needs at least 60 coins"),
    ('{"steps": 5}', ("--deposit", "0", "--wallet", "carol"), "--deposit: '0': amounts are"),
    ('{"steps": 500}', ("--wallet", "carol"), "more than the wallet's balance"),
    ('{"init": "%s"}' % ("ab" * 32), (), "which is not the bundled SmolLM2: give it with "
                                           "--init-file FILE"),
    ('{"init": "%s"}' % ("ab" * 32), ("--init-file", "README.md"), "expected a .gguf file or"),
    ('{"init": "%s"}' % ("ab" * 32), ("--init-file", "/nonexistent.gguf"), "does not exist"),
])
def test_bad_job_files_and_deposits_are_refused(chain, pnode, pwallet, tmp_path, job_file,
                                                args, words):
    pwallet("create", "--data-dir", str(chain), "--name", "carol")
    (tmp_path / "tiny.txt").write_text("tiny.")  # five bytes: shorter than one sample
    (tmp_path / "job.json").write_text(job_file.replace("TINY", str(tmp_path / "tiny.txt")))
    r = pnode("job", "submit", str(tmp_path / "job.json"), *args, "--data-dir", str(chain))
    assert r.code == 2 and words in r.err, r.err
    assert "Traceback" not in r.err


def test_a_template_from_a_gguf_file_and_its_init_file_at_submit(chain, pnode, tmp_path):
    """`template --model FILE.gguf` names the file by hash; `submit --init-file` must give
    the file of that hash (the bundled SmolLM2's path stands in for an export here)."""
    from compute.gguf import find_gguf
    from compute.pretrained import bundled_sha256

    r = pnode("job", "template", "--model", str(find_gguf()))
    assert r.code == 0, r.err
    assert json.loads(r.out)["init"] == bundled_sha256() and json.loads(r.out)["k"] == 3
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf")
    for model, words in (("gpt5", "expected tiny, smollm2, a .gguf file or a job's"),
                         (str(tmp_path / "junk.gguf"), "cannot read GGUF file")):
        r = pnode("job", "template", "--model", model)
        assert r.code == 2 and words in r.err and len(r.err.strip().splitlines()) == 1, r.err
    (tmp_path / "other.json").write_text('{"init": "%s"}' % ("cd" * 32))
    r = pnode("job", "submit", str(tmp_path / "other.json"), "--init-file", str(find_gguf()),
              "--data-dir", str(chain))
    assert r.code == 2 and f"has SHA-256 {bundled_sha256()[:16]}.., the job's init is " \
        f"{'cd' * 8}.." in r.err, r.err
    assert not (chain / "data").exists()  # nothing kept of a refused job


def test_init_job_options(pnode, tmp_path):
    r = pnode("init", "--data-dir", str(tmp_path / "a"), "--no-job", "--job", "x.json")
    assert r.code == 2 and "contradict" in r.err
    (tmp_path / "bad.json").write_text('{"lr": -1}')
    r = pnode("init", "--data-dir", str(tmp_path / "b"), "--job", str(tmp_path / "bad.json"))
    assert r.code == 2 and "--job" in r.err
    r = pnode("init", "--data-dir", str(tmp_path / "c"), "--chain-id", "t-nojob", "--no-job",
              "--json")
    assert r.code == 0 and r.json()["jobs"] == []
    assert pnode("job", "list", "--data-dir", str(tmp_path / "c"), "--json").json()["jobs"] == []
    r = pnode("job", "show", "abcd", "--data-dir", str(tmp_path / "c"))
    assert r.code == 2 and "no job on the chain with an id starting abcd" in r.err
    r = pnode("job", "show", "xyz", "--data-dir", str(tmp_path / "c"))
    assert r.code == 2 and "not a job id" in r.err


def test_a_job_on_a_data_file_names_it_by_hash_and_is_mined(tmp_path, pnode, spawn):
    d = tmp_path / "n"
    assert pnode("init", "--no-job", "--data-dir", str(d), "--chain-id", "t-data",
                 "--slot-ms", "100").code == 0
    notes = tmp_path / "notes.txt"
    notes.write_text("The quick brown fox jumps over the lazy dog. " * 200)
    (tmp_path / "job.json").write_text(json.dumps(
        {"steps": 2, "data": {"source": "file", "path": str(notes)}}))
    r = pnode("job", "submit", str(tmp_path / "job.json"), "--data-dir", str(d), "--json")
    assert r.code == 0, r.err
    job_id = r.json()["id"]
    sha = hashlib.sha256(notes.read_bytes()).hexdigest()
    assert (d / "data" / sha).read_bytes() == notes.read_bytes()  # on the node's shelf
    proc, out, err = spawn("n", "--no-serve", "--data-dir", str(d))
    done = wait_for(lambda: (j := _job(pnode, d, job_id))["state"] == "finished" and j,
                    "the file job", limit=90)
    assert done["spec"]["data"] == {"source": "file", "sha256": sha, "path": "", "seed": 0,
                                    "n_chars": 100000}  # named by content only
    assert len(read(d / "train.jsonl").splitlines()) == 2
    # Its export as the next job's initial model: the same job again, from trained weights.
    out_file = tmp_path / "m.safetensors"
    assert pnode("job", "export", job_id, "--out", str(out_file), "--data-dir", str(d)).code == 0
    r = pnode("job", "template", "--model", str(out_file), "--steps", "2")
    assert r.code == 0, r.err
    again = json.loads(r.out)
    assert again["init"] == hashlib.sha256(out_file.read_bytes()).hexdigest()
    assert again["model"] == done["spec"]["model"] and again["data"]["sha256"] == sha
    again["data"]["path"] = str(notes)
    (tmp_path / "again.json").write_text(json.dumps(again))
    r = pnode("job", "submit", str(tmp_path / "again.json"), "--init-file", str(out_file),
              "--data-dir", str(d), "--json")
    assert r.code == 0, r.err
    assert (d / "data" / again["init"]).read_bytes() == out_file.read_bytes()
    wait_for(lambda: _job(pnode, d, r.json()["id"])["state"] == "finished", "the next job",
             limit=90)
    first, _, continued, _ = [json.loads(x)["loss"] for x in
                              read(d / "train.jsonl").splitlines()]
    from compute.data import batch
    from compute.export import load_export
    from compute.jobfile import config_from_json

    model, _ = load_export(out_file)
    ids, targets = batch(config_from_json(json.dumps(again)), 0)
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
    assert continued < first and abs(continued - want.item()) < 1e-4, (first, continued, want)
    assert stop(proc) == 0, read(err)


def test_a_job_whose_hashes_lie_is_not_mined_and_the_node_goes_on(tmp_path, pnode, spawn):
    """A job whose model hash is not its spec's initial model: the miner refuses it (a
    `MinerError` inside the miner's task group) and the node keeps running and producing."""
    from dataclasses import replace

    from compute.data import JobConfig
    from ledger.crypto import SigningKey
    from ledger.types import sign
    from node.datadir import DataDir
    from node.datadir import read_key_file
    from proof_of_learning.units import job_tx

    d = tmp_path / "n"
    assert pnode("init", "--no-job", "--data-dir", str(d), "--chain-id", "t-lie",
                 "--slot-ms", "100").code == 0
    dd = DataDir(d)
    wallet = SigningKey(read_key_file(dd.wallet_file, "correct horse"))
    honest = job_tx(JobConfig(steps=2), "t-lie", wallet, 1)
    lying = sign(replace(honest, model_hash=bytes(32)), wallet)
    with dd.open_chain() as db:
        db.admit(lying)
    proc, out, err = spawn("n", "--no-serve", "--data-dir", str(d))
    wait_for(lambda: "does not commit to this config's initial weights" in read(out),
             "the miner to refuse the job", limit=60)
    height = pnode("status", "--data-dir", str(d), "--json").json()["height"]
    wait_for(lambda: pnode("status", "--data-dir", str(d), "--json").json()["height"] > height,
             "the node to go on producing")
    assert proc.poll() is None and stop(proc) == 0, read(err)


def test_a_job_that_can_never_run_is_skipped_and_the_node_goes_on(tmp_path, pnode, spawn):
    """Issue 28, item 8: a job on a 5-byte data file (shorter than one sample) ended every
    node that mined it, and again at each restart. The miner now refuses it with one line,
    the verifier leaves it be, and the node keeps running and producing; a restart too."""
    from compute.data import DataSpec, JobConfig
    from ledger.crypto import SigningKey
    from node.datadir import DataDir, read_key_file
    from proof_of_learning.units import job_tx

    d = tmp_path / "n"
    assert pnode("init", "--no-job", "--data-dir", str(d), "--chain-id", "t-short",
                 "--slot-ms", "100").code == 0
    dd = DataDir(d)
    short = b"tiny."
    sha = hashlib.sha256(short).hexdigest()
    (d / "data").mkdir(exist_ok=True)
    (d / "data" / sha).write_bytes(short)  # on the node's shelf, as `job submit` leaves it
    config = JobConfig(steps=2, data=DataSpec(source="file", path=str(d / "data" / sha),
                                              sha256=sha))
    wallet = SigningKey(read_key_file(dd.wallet_file, "correct horse"))
    with dd.open_chain() as db:
        db.admit(job_tx(config, "t-short", wallet, 1))
    for run in range(2):  # and once more after a restart
        proc, out, err = spawn("n", "--no-serve", "--data-dir", str(d))
        wait_for(lambda: "the job cannot run" in read(out), "the miner to refuse the job",
                 limit=60)
        height = pnode("status", "--data-dir", str(d), "--json").json()["height"]
        wait_for(lambda: pnode("status", "--data-dir", str(d), "--json").json()["height"]
                 > height, "the node to go on producing")
        assert proc.poll() is None and stop(proc) == 0, read(err)
        assert "corpus longer than seq_len" in read(out)
