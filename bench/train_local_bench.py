"""Benchmark the default training job: loss curve and time, whole-model and decomposed.

Trains `compute.data.JobConfig()` (4 layers, dim 128, bytes as tokens, on
the seeded synthetic text) from its initial weights for --steps steps, once
whole-model (one AdamW) and, with --decomposed-steps N > 0, for N steps block
by block over a k-section partition (the path the network runs), and reports:
  1. the loss at the first and last step, the mean of the first and last 10,
     and the loss every --every steps;
  2. seconds in all and per step, with the torch thread count;
  3. for the decomposed run, the largest |loss difference| to the
     whole-model run over the same steps.

Usage:  .venv/bin/python bench/train_local_bench.py [--steps 200] [--threads 2]
            [--decomposed-steps 20] [--k 8] [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))  # run as a script without an install

import benchkit  # noqa: E402
from compute.data import JobConfig, load_corpus  # noqa: E402
from compute.train import train_local  # noqa: E402


def _curve(losses: tuple[float, ...], seconds: float, every: int) -> dict[str, Any]:
    n = len(losses)
    head, tail = losses[: min(10, n)], losses[-min(10, n) :]
    return {
        "steps": n,
        "first": losses[0],
        "last": losses[-1],
        "first10_mean": sum(head) / len(head),
        "last10_mean": sum(tail) / len(tail),
        "every": {i: round(losses[i], 4) for i in range(0, n, every)},
        "seconds": round(seconds, 2),
        "seconds_per_step": round(seconds / n, 4),
    }


def run(steps: int, decomposed_steps: int, k: int, every: int) -> dict[str, Any]:
    """Train and time; returns the figures as a dict."""
    job = dataclasses.replace(JobConfig(), k=k)
    corpus = load_corpus(job.data)
    t0 = time.perf_counter()
    whole = train_local(job, steps, corpus=corpus)
    out: dict[str, Any] = {"whole": _curve(whole.losses, time.perf_counter() - t0, every)}
    if decomposed_steps:
        t0 = time.perf_counter()
        dec = train_local(job, decomposed_steps, decomposed=True, corpus=corpus)
        out["decomposed"] = _curve(dec.losses, time.perf_counter() - t0, every)
        out["decomposed"]["k"] = k
        pairs = zip(dec.losses, whole.losses)
        out["decomposed"]["max_abs_loss_diff"] = max(abs(a - b) for a, b in pairs)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--decomposed-steps", type=int, default=20)
    parser.add_argument("--k", type=int, default=8, help="sections (8 cuts layers into pieces)")
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    smoke = {"steps": 3, "decomposed_steps": 2, "every": 1, "threads": 1}
    args = benchkit.parse_args(parser, smoke, argv)
    torch.set_num_threads(args.threads)
    figures = run(args.steps, args.decomposed_steps, args.k, args.every)
    figures["env"] = {
        "torch": torch.__version__, "threads": args.threads, "cpu": platform.processor()
    }
    benchkit.report(args, figures, lambda: _print(figures))
    return 0


def _print(figures: dict[str, Any]) -> None:
    for name in ("whole", "decomposed"):
        if name not in figures:
            continue
        f = figures[name]
        print(
            f"{name:10s} {f['steps']} steps in {f['seconds']} s ({f['seconds_per_step']} s/step): "
            f"loss {f['first']:.3f} -> {f['last']:.3f}, "
            f"first-10 mean {f['first10_mean']:.3f}, last-10 mean {f['last10_mean']:.3f}"
        )
        print("  curve:", ", ".join(f"{i}: {v}" for i, v in f["every"].items()))
    if "decomposed" in figures:
        diff = figures["decomposed"]["max_abs_loss_diff"]
        print(f"  decomposed vs whole, max |loss diff|: {diff:.2e}")


if __name__ == "__main__":
    raise SystemExit(main())
