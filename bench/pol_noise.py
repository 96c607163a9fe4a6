"""Honest noise between two compute classes, and what a steering cheat looks like beside it.

The numbers behind specs/pol.md 7.3's cross-class thresholds. A job is
trained on the CPU at its pinned thread count (the reference class); at
every step the same weights and batch are also run on the other class
(``--other cuda:0``, or the CPU at ``--other-threads``), and every weight
gradient is compared, per tensor, as the judge compares them:

- ``max``: max |a - b| / max |b| (the distance of specs/pol.md 7.2);
- ``rms``: sqrt(mean (a - b)^2) / max |b| (the residual's spread);
- ``cos``: the cosine between this step's residual (a - b) and the last
  step's, per tensor: a cheat that steers adds the same pattern every step
  (cosine near 1), honest rounding does not.

The same three for the sub-threshold cheat (node/pol/attacks.py: a fixed
+-pattern of 9e-5 x max|g|) against the reference, so the table shows
where each threshold sits between honest noise and cheating.

    python bench/pol_noise.py                    # CPU 2 threads vs 1 thread
    python bench/pol_noise.py --other cuda:0     # CPU vs a GPU
    python bench/pol_noise.py --smoke
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchkit  # noqa: E402
from compute.data import JobConfig, batch, load_corpus, make_model  # noqa: E402
from compute.device import pinned_threads  # noqa: E402
from compute.train import make_whole_optimizer  # noqa: E402

#: node.pol.attacks.SUB_THRESHOLD: not imported, so the bench runs where only
#: torch is installed (a GPU machine); tests/bench/test_smoke.py checks they agree.
SUB_THRESHOLD = 9e-5


def grads_of(model, ids, targets, device: str, threads: int) -> dict[str, torch.Tensor]:
    """Every weight gradient of one whole-model step on ``device`` (CPU copies, float64)."""
    m = model if device == "cpu" else copy.deepcopy(model).to(device)
    m.zero_grad(set_to_none=True)
    with pinned_threads(threads):
        loss = F.cross_entropy(m(ids.to(device)).flatten(0, 1), targets.to(device).flatten())
        loss.backward()
    return {n: p.grad.detach().to("cpu", torch.float64).clone()
            for n, p in m.named_parameters() if p.grad is not None}


def compare(a: dict, b: dict, last: dict) -> dict[str, tuple[float, float, float]]:
    """Per tensor: (max, rms, cos with the last residual); updates ``last``."""
    out = {}
    for name in sorted(b):
        scale = float(b[name].abs().max()) or 1.0
        d = a[name] - b[name]
        cos = float("nan")
        if name in last and d.norm() > 0 and last[name].norm() > 0:
            cos = float((d * last[name]).sum() / (d.norm() * last[name].norm()))
        last[name] = d
        out[name] = (float(d.abs().max()) / scale, float(d.pow(2).mean().sqrt()) / scale, cos)
    return out


def cheat(g: dict[str, torch.Tensor], patterns: dict) -> dict[str, torch.Tensor]:
    """The sub-threshold cheat's gradients: the same +-pattern per tensor at every step."""
    out = {}
    for name, t in g.items():
        if name not in patterns:
            gen = torch.Generator().manual_seed(len(patterns) + 7)
            patterns[name] = (torch.randint(0, 2, t.shape, generator=gen) * 2 - 1).double()
        out[name] = t + patterns[name] * SUB_THRESHOLD * float(t.abs().max())
    return out


def run(args) -> dict:
    config = JobConfig(steps=args.steps, k=2, batch_size=args.batch, seq_len=args.seq)  # devnet's
    torch.manual_seed(0)
    model = make_model(config)
    opt = make_whole_optimizer(model, config)
    corpus = load_corpus(config.data)
    other = args.other
    if other.startswith("cuda") and not torch.cuda.is_available():
        benchkit.skipped(f"--other {other}", "no CUDA device here")
        return {"skipped": "no CUDA device"}
    honest_last, cheat_last, patterns = {}, {}, {}
    rows = {"honest": [], "cheat": []}
    for t in range(args.steps):
        ids, targets = batch(config, t, corpus=corpus)
        ref = grads_of(model, ids, targets, "cpu", config.threads)
        theirs = grads_of(model, ids, targets, other,
                          args.other_threads if other == "cpu" else config.threads)
        rows["honest"].append(compare(theirs, ref, honest_last))
        rows["cheat"].append(compare(cheat(ref, patterns), ref, cheat_last))
        with torch.no_grad():  # the reference class's update, from its own gradients
            for name, p in model.named_parameters():
                p.grad = ref[name].to(p.dtype)
        opt.step()
    return {"job": {"steps": args.steps, "batch": args.batch, "seq": args.seq,
                    "threads": config.threads},
            "other": other if other != "cpu" else f"cpu at {args.other_threads} threads",
            "summary": {kind: summarize(r) for kind, r in rows.items()},
            "per_tensor": per_tensor(rows["honest"])}


def per_tensor(rows: list[dict]) -> dict[str, list]:
    """Each tensor's worst (max, rms, |cos|) over the steps, the noisiest first."""
    worst: dict[str, list] = {}
    for row in rows:
        for name, (m, r, c) in row.items():
            w = worst.setdefault(name, [0.0, 0.0, 0.0])
            w[0], w[1] = max(w[0], m), max(w[1], r)
            w[2] = max(w[2], abs(c)) if c == c else w[2]
    return dict(sorted(worst.items(), key=lambda kv: -kv[1][0]))


def summarize(rows: list[dict]) -> dict:
    """Over every tensor and step: the largest max, the largest rms, the largest |cos|."""
    flat = [v for row in rows for v in row.values()]
    coses = [abs(c) for _, _, c in flat if c == c]
    return {"max": max(m for m, _, _ in flat), "rms": max(r for _, r, _ in flat),
            "median_rms": sorted(r for _, r, _ in flat)[len(flat) // 2],
            "abs_cos_max": max(coses) if coses else None,
            "abs_cos_median": sorted(coses)[len(coses) // 2] if coses else None,
            "tensors_x_steps": len(flat)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--other", default="cpu", help="the other class: cpu or cuda:N")
    parser.add_argument("--other-threads", type=int, default=1,
                        help="its thread count when --other is cpu (default 1)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = benchkit.parse_args(parser, {"steps": 2, "batch": 2, "seq": 16})
    doc = run(args)

    def table() -> None:
        if "summary" not in doc:
            return
        print(f"{doc['other']} against the CPU at {doc['job']['threads']} threads, "
              f"{doc['job']['steps']} steps of batch {doc['job']['batch']} x {doc['job']['seq']}")
        print(f"{'':8} {'max':>10} {'rms (max)':>10} {'rms (median)':>13} {'|cos| max':>10} "
              f"{'|cos| median':>13}")
        for kind, s in doc["summary"].items():
            def f(x):
                return "-" if x is None else f"{x:.3g}"
            print(f"{kind:8} {f(s['max']):>10} {f(s['rms']):>10} {f(s['median_rms']):>13} "
                  f"{f(s['abs_cos_max']):>10} {f(s['abs_cos_median']):>13}")
    benchkit.report(args, doc, table)


if __name__ == "__main__":
    main()
