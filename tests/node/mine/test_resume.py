"""node.mine.resume: a node that mines alone, stopped mid-job, resumes from its kept state.

Issue 28, item 10: a one-node chain's miner, stopped and started again, had
no holder to catch up from. It waited for one for good (``out of step at
update 0 of N``), the chain gave the job up, and the node said ``finished at
step 0`` and exported step-0 weights. Now it replays from the full state it
kept at its last ``state_every`` step (`D/pol/`), checked unit by unit
against the chain's receipts, and trains on to the end: the same weights, bit
for bit, as the job replayed from its initial model without a stop.
"""

from __future__ import annotations

import json
import re

import torch

from tests.node.prockit import read, stop, wait_for

JOB = {"steps": 10, "state_every": 2, "batch_size": 2, "seq_len": 16}


def _mining_step(pnode, d) -> int:
    """The updates the running node applied (0 before it answers)."""
    doc = pnode("status", "--data-dir", str(d), "--json").json()
    return doc["running"] and (doc.get("mining") or {}).get("step") or 0


def test_a_lone_miner_stopped_mid_job_resumes_from_its_kept_state(tmp_path, pnode, spawn):
    from safetensors import safe_open
    from safetensors.torch import load_file

    from compute.jobfile import config_from_json
    from proof_of_learning.replay import Replayer

    d = tmp_path / "n"
    (tmp_path / "job.json").write_text(json.dumps(JOB))
    r = pnode("init", "--data-dir", str(d), "--chain-id", "t-resume", "--slot-ms", "200",
              "--job", str(tmp_path / "job.json"), "--json")
    assert r.code == 0, r.err
    (job,) = r.json()["jobs"]

    proc, out, err = spawn("first", "--no-serve", "--data-dir", str(d))
    wait_for(lambda: _mining_step(pnode, d) >= 3, "three updates", limit=90, step=0.2)
    assert stop(proc) == 0, read(err)  # as Ctrl-C: mid-job, past a kept state
    shown = pnode("job", "show", job, "--data-dir", str(d), "--json").json()
    stopped_at = shown["step"]
    assert shown["state"] == "training" and 3 <= stopped_at < JOB["steps"], shown
    journal = [json.loads(line) for line in read(d / "pol" / "journal").splitlines()]
    kept = {rec["step"] for rec in journal if rec["op"] == "state"}
    assert kept and all(s % 2 == 0 for s in kept) and max(kept) >= 2, kept

    proc, out, err = spawn("second", "--no-serve", "--data-dir", str(d))
    wait_for(lambda: "finished at step 10 of 10" in read(out), "the job's end", limit=120,
             step=0.2)
    said = re.search(r"caught up at step (\d+) from the state kept at step (\d+), replayed "
                     r"(\d+) steps", read(out))
    assert said, read(out)
    at, start, replayed = map(int, said.groups())
    assert at >= stopped_at and start in kept and start > 0 and replayed == at - start
    assert "out of step" not in read(out) and "unfinished" not in read(out)
    assert pnode("job", "show", job, "--data-dir", str(d), "--json").json()["state"] \
        == "finished"

    path = tmp_path / "model.safetensors"
    r = pnode("job", "export", job[:12], "--out", str(path), "--data-dir", str(d), "--json")
    assert r.code == 0, r.err
    assert r.json()["step"] == JOB["steps"]
    with safe_open(str(path), "pt") as f:
        config = config_from_json(f.metadata()["pnode_config"])
    exported = load_file(str(path))
    assert stop(proc) == 0, read(err)

    # The reference: the job replayed from its initial model, step after step, with no stop.
    rp = Replayer(config)
    rp.start()
    for t in range(config.steps):
        rp.step(bytes.fromhex(job), t, rp.units)
    reference = rp.model.state_dict()
    assert exported.keys() == reference.keys()
    for name, value in reference.items():
        assert torch.equal(exported[name], value), name
