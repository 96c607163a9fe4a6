"""SmolLM2-135M itself as a mining job: three real node processes on 127.0.0.1 train it.

Its own test file, so the test suite's workers can run it beside the other
devnet tests (it takes about a minute and a half).
"""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from compute.generate import Sampling
from compute.tokenizer import Tokenizer
from compute.train import train_local
from node.cli import devnet_run
from node.cli.common import read_view
from node.control import control_call
from node.datadir import DataDir
from node.mine.devnet import devnet_job
from wallet.client import InferRequest, LocalModel


def test_smollm2_continued_training_over_three_nodes_is_local_training(tmp_path, pwallet):
    """The served model itself as a job: SmolLM2-135M's GGUF weights (by hash), a text in its
    tokens, three nodes of ten layers each. Whole-layer sections: the same losses, bit for bit,
    as local decomposed training of the same job."""
    from compute.data import DataSpec
    from compute.pretrained import bundled_sha256, pretrained_config

    sha = bundled_sha256()
    notes = tmp_path / "notes.txt"
    notes.write_text("The capital of France is Paris. The capital of Italy is Rome. " * 100)
    over = dict(model=pretrained_config(sha, 128), init=sha, batch_size=1, seq_len=32, k=3,
                lr=1e-4, data=DataSpec("file", path=str(notes)))
    steps = 2
    dirs, job_file = devnet_run.create(tmp_path / "dn", 3, steps, "devnet", job_overrides=over,
                                       params={"audit_bps": 0, "unit_timeout": 150})
    out = tmp_path / "smol.safetensors"
    with devnet_run.Devnet(dirs, job_file) as net:
        for i in range(3):
            net.start(i)
        assert devnet_run.follow(net, steps, duration=300)
        job_id = read_view(DataDir(dirs[0]), "jobs")["jobs"][0]["id"]
        # Node 0 holds layers 0-9: the other sections' weights come from nodes 1 and 2.
        exported = control_call(dirs[0], "export_job", job=job_id, out=str(out))
        devnet_run.settle(net, 2)
    info = devnet_run.summary(dirs)
    local = train_local(devnet_job(steps, 3, **over), decomposed=True)
    assert info["losses"] == list(local.losses) and local.losses[1] < local.losses[0]
    assert [n["units_accepted"] for n in info["nodes"]] == [2 * steps] * 3  # a section each
    assert exported["step"] == steps
    weights = load_file(str(out))
    assert all(torch.equal(weights[k], v) for k, v in local.model.state_dict().items())
    # The exported model chats: `pwallet infer --model` runs it, as the local model does.
    r = pwallet("infer", "The capital of France is", "--raw", "--greedy", "--max-tokens", "6",
                "--local", "--model", str(out), "--json")
    assert r.code == 0, r.err
    tokenizer = Tokenizer.from_gguf()
    want = LocalModel.from_parts(local.model.eval(), tokenizer).generate(InferRequest(
        "The capital of France is", raw=True, max_tokens=6, sampling=Sampling()))
    assert r.json()["token_ids"] == [t.id for t in want]
