"""GPU check: `pnode start --gpu N` serving and `pnode devnet --gpu N` mining on a real GPU.

The CPU runs every test in CI; this is what only a machine with a CUDA
device can show. Against baselines measured in the same run:
  1. serving: SmolLM2 layers on cuda:N in `pnode start --gpu N` processes
     (one server of all 30 layers, then three of 10: --routes), a greedy
     generation of --tokens over them from a CPU client (client-driven
     routes, and pushed ones over three servers)
     against `pwallet infer --local`'s engine on the CPU: whether the tokens
     are equal (the length of the equal prefix) and decode tokens/s of each
     (medians of --repeats);
  2. mining: `pnode devnet --nodes 2 --steps S --gpu N` (--nodes) against
     the same devnet on the CPU: each step's loss (the largest relative
     difference), units accepted and coins per node, wall time.

Without a CUDA device it stops, but for ``--smoke``: that runs every step
with the CPU in the GPU's place.

Usage:  python bench/gpu_check.py [--gpu 0] [--tokens 32] [--repeats 3] [--steps 6]
            [--nodes 2] [--routes 1,3] [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchkit  # noqa: E402
import swarm_bench as sb  # noqa: E402  (sets the client's OpenMP policy before torch)
import torch  # noqa: E402
import trio  # noqa: E402


def equal_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two generations share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def check_serving(args, root: Path, parts, local: sb.Local) -> dict:
    """Greedy generations over GPU servers against the CPU engine, alternately."""
    out = {}
    for n in args.routes:
        spans = sb.ROUTES[n]
        swarm = sb.Swarm(root / f"gpu{n}", args.server_threads, gpu=args.gpu)
        try:
            for span in spans:
                swarm.start(span)
            rows = []
            for _ in range(args.repeats):
                want, local_rate = local.run(args.tokens)
                ids, rate, _, _ = trio.run(sb.remote_run, swarm.addrs[0], parts, args.tokens,
                                           "raw", n)
                pids, pushed = ids, None
                if n > 1:  # one server has no next hop to push to
                    pids, pushed, _, _ = trio.run(sb.remote_run, swarm.addrs[0], parts,
                                                  args.tokens, "raw", n, None, None, True)
                rows.append((local_rate, rate, pushed, equal_prefix(ids, want),
                             equal_prefix(pids, want)))
            out[n] = {"servers": n, "local_cpu_tok_s": statistics.median(r[0] for r in rows),
                      "gpu_tok_s": statistics.median(r[1] for r in rows),
                      "gpu_pushed_tok_s": statistics.median(r[2] for r in rows) if n > 1 else None,
                      "equal_prefix": min(min(r[3], r[4]) for r in rows), "of": args.tokens}
            print(f"serving over {n} GPU server(s): {out[n]}", flush=True)
        finally:
            swarm.close()
    return out


def run_devnet(args, root: Path, gpu: int | None) -> dict:
    """One `pnode devnet` (--nodes, --steps) on the GPU or the CPU; its summary and time."""
    cmd = [sys.executable, "-m", "node.cli", "devnet", "--nodes", str(args.nodes), "--steps",
           str(args.steps), "--data-dir", str(root), "--json"]
    began = time.monotonic()
    r = subprocess.run([*cmd, *(["--gpu", str(gpu)] if gpu is not None else [])],
                       cwd=sb._ROOT, env=sb.ENV, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"devnet ({'cuda' if gpu is not None else 'cpu'}) failed: {r.stderr}")
    info = json.loads(r.stdout)
    info["seconds"] = round(time.monotonic() - began, 1)
    return info


def check_mining(args, root: Path) -> dict:
    gpu = run_devnet(args, root / "dn-gpu", args.gpu)
    # With no GPU (a smoke run) the CPU arm would run the very same devnet again.
    cpu = gpu if args.gpu is None else run_devnet(args, root / "dn-cpu", None)
    diffs = [abs(g - c) / abs(c) for g, c in zip(gpu["losses"], cpu["losses"])]
    out = {"steps": args.steps, "gpu_losses": gpu["losses"], "cpu_losses": cpu["losses"],
           "max_rel_diff": max(diffs) if diffs else None,
           "gpu_units": [n["units_accepted"] for n in gpu["nodes"]],
           "cpu_units": [n["units_accepted"] for n in cpu["nodes"]],
           "gpu_coins": [n["coins"] for n in gpu["nodes"]],
           "gpu_seconds": gpu["seconds"], "cpu_seconds": cpu["seconds"],
           "finished": [gpu["finished"], cpu["finished"]]}
    print(f"mining: {out}", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="the CPU baseline's torch threads")
    p.add_argument("--server-threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--nodes", type=int, default=2, help="nodes of each devnet")
    p.add_argument("--routes", type=sb.server_counts, default=(1, 3),
                   help="server counts of the GPU routes (comma-separated, of 1, 2, 3)")
    p.add_argument("--json", action="store_true")
    smoke = {"tokens": 2, "repeats": 1, "steps": 1, "nodes": 1, "threads": 1,
             "server_threads": 1, "routes": (1,)}
    args = benchkit.parse_args(p, smoke)
    if not torch.cuda.is_available():
        if not args.smoke:
            sys.exit("gpu_check: torch sees no CUDA device")
        # A smoke run still runs every step, with the CPU standing in for the GPU.
        benchkit.skipped("the GPU", "torch sees no CUDA device: the CPU stands in for it")
        args.gpu = None
    else:
        print(f"device: cuda:{args.gpu} {torch.cuda.get_device_name(args.gpu)}, torch "
              f"{torch.__version__}", flush=True)
    torch.set_num_threads(args.threads)
    local = sb.Local(args.threads)
    parts = sb.load_client_parts()
    try:
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
            results = {"serving": check_serving(args, Path(tmp), parts, local),
                       "mining": check_mining(args, Path(tmp))}
    finally:
        local.close()
    benchkit.report(args, results, lambda: print_tables(args, results))


def print_tables(args, results: dict) -> None:
    print("\n| route | GPU tok/s (client / pushed) | local CPU tok/s (same run) | "
          "greedy output equal |\n|---|---|---|---|")
    for n, r in results["serving"].items():
        pushed = f"{r['gpu_pushed_tok_s']:.1f}" if r["gpu_pushed_tok_s"] else "-"
        print(f"| {n} GPU server(s) | {r['gpu_tok_s']:.1f} / {pushed} | "
              f"{r['local_cpu_tok_s']:.1f} | {r['equal_prefix']} of {r['of']} tokens |")
    m = results["mining"]
    print(f"\nmining, {args.nodes}-node devnet of {m['steps']} steps: GPU {m['gpu_seconds']} s, "
          f"CPU {m['cpu_seconds']} s; losses differ by at most {m['max_rel_diff']:.2e} (relative); "
          f"units accepted GPU {m['gpu_units']}, CPU {m['cpu_units']}")


if __name__ == "__main__":
    main()
