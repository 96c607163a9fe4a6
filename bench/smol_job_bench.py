"""SmolLM2-135M continued training as a job: a step over 1, 2 and 3 nodes against local training.

In one sitting: the same job (the bundled SmolLM2-135M-Instruct's weights,
a text in its tokens, --batch x --seq tokens a step) trained locally whole
(one AdamW over the model) and decomposed (block by block, as the network
runs it), then mined by `pnode devnet` with 1, 2 and 3 node processes (--nodes) on
loopback, k = 3 sections of 10 layers (one node: all three; two: 0-19 and
20-29; three: one each; a section's state must fit a 512 MiB frame). A
step's time is the median gap between consecutive steps' losses (after the
first step, which includes setting up). Every run's losses are compared
with local decomposed training's.

Usage:  .venv/bin/python bench/smol_job_bench.py [--steps 4] [--batch 1] [--seq 32]
            [--nodes 1,2,3] [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import benchkit  # noqa: E402
from compute.data import DataSpec  # noqa: E402
from compute.pretrained import bundled_sha256, pretrained_config  # noqa: E402
from compute.train import train_local  # noqa: E402
from node.cli import devnet_run  # noqa: E402
from node.mine.devnet import devnet_job  # noqa: E402

TEXT = ("The capital of France is Paris. Rome is the capital of Italy, and Madrid the "
        "capital of Spain. Paris lies on the Seine; Rome on the Tiber. ") * 200


def local_step_s(job, decomposed: bool) -> tuple[float, list[float]]:
    stamps = []
    result = train_local(job, decomposed=decomposed, on_step=lambda s, loss: stamps.append(
        time.perf_counter()))
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return statistics.median(gaps), list(result.losses)


#: The layers each node registers, by node count: k = 3 sections of 10 layers (a
#: section's weights and AdamW state must fit one 512 MiB frame), spread over the nodes.
SPANS = {1: [(0, 30)], 2: [(0, 20), (20, 30)], 3: [(0, 10), (10, 20), (20, 30)]}


def swarm_step_s(root: Path, n: int, steps: int, over: dict) -> tuple[float, list[float]]:
    dirs, job_file = devnet_run.create(root, n, steps, "bench", job_overrides=over,
                                       params={"audit_bps": 0, "unit_timeout": 300},
                                       spans=SPANS[n])
    with devnet_run.Devnet(dirs, job_file) as net:
        for i in range(n):
            net.start(i)
        if not devnet_run.follow(net, steps, duration=900):
            raise RuntimeError(f"{n} nodes did not finish {steps} steps")
        devnet_run.settle(net, min(2, n))
    times = {}
    for d in dirs:
        log = d / "train.jsonl"
        for line in log.read_text().splitlines() if log.exists() else []:
            entry = json.loads(line)
            times[entry["step"]] = entry["time"]
    stamps = [times[s] for s in sorted(times)]
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return statistics.median(gaps), devnet_run.summary(dirs)["losses"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--nodes", default="1,2,3", help="node counts to mine with, of 1, 2, 3")
    parser.add_argument("--json", action="store_true")
    args = benchkit.parse_args(parser, {"steps": 2, "seq": 8, "nodes": "1"})
    sha = bundled_sha256()
    with tempfile.TemporaryDirectory() as tmp:
        notes = Path(tmp) / "notes.txt"
        notes.write_text(TEXT)
        over = dict(model=pretrained_config(sha, 128), init=sha, batch_size=args.batch,
                    seq_len=args.seq, lr=1e-4, k=3, data=DataSpec("file", path=str(notes)))
        job = devnet_job(args.steps, 3, **over)
        rows = {"local whole": local_step_s(job, False),
                "local decomposed (k=3)": local_step_s(job, True)}
        for n in map(int, args.nodes.split(",")):
            rows[f"{n} node{'s' if n > 1 else ''} (k=3)"] = swarm_step_s(
                Path(tmp) / f"dn{n}", n, args.steps, over)
    whole, reference = rows["local whole"][0], rows["local decomposed (k=3)"][1]
    out = [{"run": name, "step_s": step, "vs_local_whole": step / whole,
            "losses_equal_local_decomposed": losses == reference}
           for name, (step, losses) in rows.items()]

    def table() -> None:
        print(f"SmolLM2-135M, {args.batch} x {args.seq} tokens a step, {args.steps} steps; "
              "median step after the first")
        print(f"{'run':26} {'step':>9} {'vs local whole':>15} {'losses = local decomposed':>26}")
        for r in out:
            print(f"{r['run']:26} {r['step_s']:>7.2f} s {r['vs_local_whole']:>14.2f}x "
                  f"{str(r['losses_equal_local_decomposed']):>26}")
    benchkit.report(args, {"rows": out}, table)


if __name__ == "__main__":
    main()
