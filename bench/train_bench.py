"""Mining benchmark: the devnet's job trained by 1, 2 and 3 node processes vs locally.

Measures, against baselines measured in the same run:
  1. training samples/s of a `pnode devnet --nodes N` (N = 1, 2, 3 real node
     processes on 127.0.0.1, each producing blocks and running the units the
     chain assigns it) from the first step's loss to the last one's (process
     start-up left out), against the same job trained locally block by block
     (`train_local(decomposed=True)`, the computation the swarm distributes)
     and whole-model, in this process with the same torch thread count;
  2. the swarm's losses against local whole-model training's (largest
     relative difference: 0 with one replica, where the swarm's whole-layer
     sections compute the whole model's updates bit for bit; float noise with
     several, whose gradients are averaged rather than taken over one batch);
  3. ledger overhead per compute unit: the encoded receipt's bytes, the
     block bytes per unit over the devnet's chain, and the time to
     re-validate the chain (`ChainDB.verify_chain`) per unit.

With ``--replicas R,...`` each node count also runs the job with R
data-parallel replicas (R shards of every step, R x batch_size samples),
against local training of that same job.

Usage:  .venv/bin/python bench/train_bench.py [--steps 40] [--nodes 1,2,3] [--replicas 1]
        [--threads 2] [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import benchkit  # noqa: E402
import torch  # noqa: E402

from compute.train import train_local  # noqa: E402
from ledger.codec import encode  # noqa: E402
from ledger.types import Receipt  # noqa: E402
from node.datadir import DataDir  # noqa: E402
from node.mine.devnet import devnet_job  # noqa: E402
from node.node import TRAIN_LOG  # noqa: E402


def devnet(n: int, steps: int, root: Path, replicas: int) -> dict:
    r = subprocess.run([sys.executable, "-m", "node.cli", "devnet", "--nodes", str(n),
                        "--steps", str(steps), "--replicas", str(replicas),
                        "--data-dir", str(root), "--json"],
                       cwd=_ROOT, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"devnet of {n} failed: {r.stderr[-2000:]}")
    info = json.loads(r.stdout)
    times = {}
    for d in root.glob("node*"):
        for line in (d / TRAIN_LOG).read_text().splitlines() if (d / TRAIN_LOG).exists() else ():
            item = json.loads(line)  # a step's loss is known once every replica's is
            times[item["step"]] = max(times.get(item["step"], 0.0), item["time"])
    span = times[steps - 1] - times[0]
    config = devnet_job(steps, n, replicas=replicas)
    info["samples_per_s"] = (steps - 1) * config.batch_size * replicas / span
    info["ledger"] = ledger_overhead(root / "node0")
    return info


def ledger_overhead(node_dir: Path) -> dict:
    with DataDir(node_dir).open_chain() as db:
        blocks = list(db.iter_blocks())
        receipts = [tx for b in blocks for tx in b.txs if isinstance(tx, Receipt)]
        chain_bytes = sum(len(encode(b)) for b in blocks[1:])
        began = time.perf_counter()
        db.verify_chain()
        seconds = time.perf_counter() - began
    n = max(len(receipts), 1)
    return {"units": len(receipts), "receipt_bytes": len(encode(receipts[0])) if receipts else 0,
            "block_bytes_per_unit": round(chain_bytes / n), "blocks": len(blocks),
            "verify_ms_per_unit": round(1000 * seconds / n, 3)}


def local(steps: int, n: int, decomposed: bool, replicas: int
          ) -> tuple[float, tuple[float, ...]]:
    config = devnet_job(steps, n, replicas=replicas)
    train_local(config, 2, decomposed=decomposed)  # warm-up
    began = time.perf_counter()
    result = train_local(config, decomposed=decomposed)
    return steps * config.batch_size * replicas / (time.perf_counter() - began), result.losses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--nodes", default="1,2,3")
    p.add_argument("--replicas", default="1", help="data-parallel replicas to try, e.g. 1,2")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", action="store_true")
    args = benchkit.parse_args(p, {"steps": 2, "nodes": "1", "threads": 1})
    torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory(prefix="train-bench-") as tmp:
        runs = [(int(n), int(r)) for n in args.nodes.split(",") for r in args.replicas.split(",")]
        for n, reps in runs:
            swarm = devnet(n, args.steps, Path(tmp) / f"dn{n}x{reps}", reps)
            dec_rate, dec_losses = local(args.steps, n, True, reps)
            whole_rate, whole_losses = local(args.steps, n, False, reps)
            diff = max(abs(a - b) / abs(b) for a, b in zip(swarm["losses"], whole_losses))
            rows.append({"nodes": n, "replicas": reps,
                         "swarm_samples_s": round(swarm["samples_per_s"], 1),
                         "local_decomposed_samples_s": round(dec_rate, 1),
                         "local_whole_samples_s": round(whole_rate, 1),
                         "ratio_vs_decomposed": round(swarm["samples_per_s"] / dec_rate, 3),
                         "ratio_vs_whole": round(swarm["samples_per_s"] / whole_rate, 3),
                         "loss_first": round(swarm["loss_first"], 4),
                         "loss_last": round(swarm["loss_last"], 4),
                         "max_rel_loss_diff_vs_local": diff, "ledger": swarm["ledger"],
                         "units_per_node": [x["units_accepted"] for x in swarm["nodes"]],
                         "coins_per_node": [x["coins"] for x in swarm["nodes"]]})
            print(rows[-1], file=sys.stderr, flush=True)
    benchkit.report(args, {"rows": rows}, lambda: print_tables(rows))


def print_tables(rows: list[dict]) -> None:
    print("| nodes | replicas | swarm samples/s | local block-by-block (same run) | "
          "local whole-model | ratio vs block-by-block | ratio vs whole | loss first -> last | "
          "max rel. loss diff vs local whole-model |\n|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['nodes']} | {r['replicas']} | {r['swarm_samples_s']} | "
              f"{r['local_decomposed_samples_s']} | "
              f"{r['local_whole_samples_s']} | {r['ratio_vs_decomposed']}x | "
              f"{r['ratio_vs_whole']}x | {r['loss_first']} -> {r['loss_last']} | "
              f"{r['max_rel_loss_diff_vs_local']:.1e} |")
    print("\n| nodes | replicas | units | receipt bytes | block bytes per unit | "
          "verify ms per unit |\n|---|---|---|---|---|---|")
    for r in rows:
        lg = r["ledger"]
        print(f"| {r['nodes']} | {r['replicas']} | {lg['units']} | {lg['receipt_bytes']} | "
              f"{lg['block_bytes_per_unit']} | {lg['verify_ms_per_unit']} |")


if __name__ == "__main__":
    main()
