"""SmolLM2-135M itself as a mining job: three real node processes on 127.0.0.1 train it.

Its own test file, so the test suite's workers can run it beside the other
devnet tests (it takes about a minute and a half).
"""

from __future__ import annotations

from compute.train import train_local
from node.cli import devnet_run
from node.mine.devnet import devnet_job


def test_smollm2_continued_training_over_three_nodes_is_local_training(tmp_path):
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
    with devnet_run.Devnet(dirs, job_file) as net:
        for i in range(3):
            net.start(i)
        assert devnet_run.follow(net, steps, duration=300)
        devnet_run.settle(net, 2)
    info = devnet_run.summary(dirs)
    local = train_local(devnet_job(steps, 3, **over), decomposed=True).losses
    assert info["losses"] == list(local) and local[1] < local[0]
    assert [n["units_accepted"] for n in info["nodes"]] == [2 * steps] * 3  # a section each
