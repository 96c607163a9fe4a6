"""Paired A/B of two checkouts mining the devnet's job: arm B's samples/s over arm A's.

Each arm is a checkout of pnode (``--a`` and ``--b``, default: this one for
both). A pair runs ``pnode devnet --nodes N --steps S`` once with each
arm's code (N real node processes on 127.0.0.1 producing blocks and running
the units the chain assigns them; the arm's checkout first on
``PYTHONPATH``), the arms alternating which goes first. The rate is
training samples/s from the first step's loss to the last one's, process
start-up left out (as bench/train_bench.py measures it). Both arms train
the same job from the same seed, so their losses must be equal bit for bit
(asserted): a change that moves code must not move a number.

Prints, per pair, both rates and B/A; then the median of B/A and how often
B was ahead.

Usage:  .venv/bin/python bench/ab_mining.py --a /path/to/old/checkout [--b .]
            [--pairs 4] [--nodes 3] [--steps 12] [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

_HERE = Path(__file__).resolve()
_ROOT = _HERE.parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import benchkit  # noqa: E402

from node.mine.devnet import devnet_job  # noqa: E402
from node.node import TRAIN_LOG  # noqa: E402


def mine(root: Path, nodes: int, steps: int, where: Path) -> tuple[float, list[float]]:
    """(samples/s, losses) of one devnet run of the checkout at ``root``."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    r = subprocess.run([sys.executable, "-m", "node.cli", "devnet", "--nodes", str(nodes),
                        "--steps", str(steps), "--data-dir", str(where), "--json"],
                       cwd=root, env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"devnet of {root} failed: {r.stderr[-2000:]}")
    times: dict[int, float] = {}
    for d in where.glob("node*"):
        log = d / TRAIN_LOG
        for line in log.read_text().splitlines() if log.exists() else ():
            item = json.loads(line)  # a step's loss is known once every replica's is
            times[item["step"]] = max(times.get(item["step"], 0.0), item["time"])
    span = times[steps - 1] - times[0]
    return (steps - 1) * devnet_job(steps, nodes).batch_size / span, json.loads(r.stdout)["losses"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", type=Path, default=_ROOT, help="checkout of arm A")
    p.add_argument("--b", type=Path, default=_ROOT, help="checkout of arm B")
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--json", action="store_true")
    args = benchkit.parse_args(p, {"pairs": 1, "nodes": 1, "steps": 2})
    arms = {"A": args.a.resolve(), "B": args.b.resolve()}
    pairs = []
    with tempfile.TemporaryDirectory(prefix="pnode-ab-mining-") as tmp:
        for i in range(args.pairs):
            order = ("A", "B") if i % 2 == 0 else ("B", "A")
            got = {name: mine(arms[name], args.nodes, args.steps, Path(tmp) / f"{i}{name}")
                   for name in order}
            assert got["A"][1] == got["B"][1], f"pair {i}: the arms' losses differ"
            pairs.append((got["A"][0], got["B"][0]))
            if not args.json:
                print(f"pair {i + 1:2}: A {pairs[-1][0]:6.1f} samples/s  "
                      f"B {pairs[-1][1]:6.1f} samples/s  B/A {pairs[-1][1] / pairs[-1][0]:.3f}",
                      flush=True)
    ratios = [rb / ra for ra, rb in pairs]
    summary = {"a": str(arms["A"]), "b": str(arms["B"]), "nodes": args.nodes,
               "steps": args.steps, "pairs": len(pairs),
               "a_samples_s": round(statistics.median(r[0] for r in pairs), 2),
               "b_samples_s": round(statistics.median(r[1] for r in pairs), 2),
               "b_over_a": round(statistics.median(ratios), 3),
               "b_ahead": sum(r > 1 for r in ratios)}

    def table() -> None:
        print(f"\n| A | B | nodes x steps | pairs | A samples/s | B samples/s | B/A, median | "
              f"B ahead |\n|---|---|---|---|---|---|---|---|\n"
              f"| {summary['a']} | {summary['b']} | {args.nodes} x {args.steps} | "
              f"{len(pairs)} | {summary['a_samples_s']} | {summary['b_samples_s']} | "
              f"{summary['b_over_a']} | {summary['b_ahead']} of {len(pairs)} |")
    benchkit.report(args, summary, table)


if __name__ == "__main__":
    main()
