"""Paired A/B of two checkouts on the 3-server swarm: pushed decode, arm B over arm A.

Each arm is a checkout of pnode (``--a`` and ``--b``, default: this one for
both). For each arm a worker process, run on that checkout's code, starts
three `pnode start` servers (--servers; layers 0-10, 10-20, 20-30) with
that code and keeps a client ready (`bench/swarm_bench.py`'s `Swarm` and
`remote_run` of the same checkout). The arm not running has its servers
stopped with SIGSTOP, so its background work (announcements, pings) cannot
touch the other arm's tokens; the arms alternate which goes first each
round. Each generation is greedy, pushed (`pwallet infer`'s default), after
the same prompt; the decode rate leaves the first token out. The outputs of
both arms must be equal (asserted).

Prints, per pair, both rates and B/A; then the median of B/A and how often
B was ahead: on this shared 2-core machine two full benches of the same code
differ by up to 0.1x of local, while a paired ratio moves by a few percent.

Usage:  .venv/bin/python bench/ab_swarm.py --a /path/to/old/checkout [--b .]
            [--pairs 12] [--tokens 64] [--server-threads 2] [--servers 3] [--json]
            [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import benchkit

_HERE = Path(__file__).resolve()


def worker(root: Path, tokens: int, server_threads: int, servers: int) -> None:
    """One arm: servers and a client from the checkout at ``root``; a generation per stdin line."""
    import tempfile

    sys.path[:0] = [str(root), str(root / "bench")]
    import swarm_bench  # the arm's own (it puts its checkout first on sys.path)
    import trio

    import node
    for module in (swarm_bench, node):  # the arm's code, not the checkout this file is in
        assert root in Path(module.__file__).resolve().parents, (module.__file__, root)
    parts = swarm_bench.load_client_parts()
    with tempfile.TemporaryDirectory(prefix="pnode-ab-") as tmp:
        swarm = swarm_bench.Swarm(Path(tmp), server_threads)
        try:
            for span in benchkit.even_spans(servers):
                swarm.start(span)
            print(json.dumps({"pids": [p.pid for p in swarm.procs]}), flush=True)
            for _ in sys.stdin:
                ids, rate, _, _ = trio.run(swarm_bench.remote_run, swarm.addrs[0], parts, tokens,
                                           "raw", servers, None, None, True)
                print(json.dumps({"ids": ids, "rate": rate}), flush=True)
        finally:
            swarm.close()


class Arm:
    """A worker process of one checkout, and its servers' pids (to stop and continue)."""

    def __init__(self, name: str, root: Path, args: argparse.Namespace):
        self.name, self.root = name, root
        self.proc = subprocess.Popen(
            [sys.executable, str(_HERE), "--worker", str(root), "--tokens", str(args.tokens),
             "--server-threads", str(args.server_threads), "--servers", str(args.servers)],
            cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"arm {name} ({root}) did not start its swarm")
        self.pids = json.loads(line)["pids"]

    def signal(self, signum: int) -> None:
        for pid in self.pids:
            os.kill(pid, signum)

    def run(self) -> tuple[list[int], float]:
        self.signal(signal.SIGCONT)
        time.sleep(1.0)  # let the servers answer the pings they missed
        try:
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()
            reply = json.loads(self.proc.stdout.readline())
        finally:
            self.signal(signal.SIGSTOP)
        return reply["ids"], reply["rate"]

    def close(self) -> None:
        try:
            self.signal(signal.SIGCONT)
        except ProcessLookupError:
            pass
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", type=Path, default=_HERE.parent.parent, help="checkout of arm A")
    p.add_argument("--b", type=Path, default=_HERE.parent.parent, help="checkout of arm B")
    p.add_argument("--pairs", type=int, default=12)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--server-threads", type=int, default=2)
    p.add_argument("--servers", type=int, default=3, help="servers of each arm's route")
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    # Smoke: one server an arm (the harness is what it checks; swarm_bench's smoke pushes).
    args = benchkit.parse_args(p, {"pairs": 1, "tokens": 2, "server_threads": 1, "servers": 1})
    if args.worker:
        return worker(args.worker.resolve(), args.tokens, args.server_threads, args.servers)
    arms = []
    try:
        for name, root in (("A", args.a.resolve()), ("B", args.b.resolve())):
            arms.append(Arm(name, root, args))
            arms[-1].signal(signal.SIGSTOP)
        a, b = arms
        pairs = []
        for i in range(args.pairs):
            order = (a, b) if i % 2 == 0 else (b, a)
            got = {arm.name: arm.run() for arm in order}
            assert got["A"][0] == got["B"][0], f"pair {i}: the arms' outputs differ"
            pairs.append((got["A"][1], got["B"][1]))
            if not args.json:
                print(f"pair {i + 1:2}: A {pairs[-1][0]:5.2f} tok/s  B {pairs[-1][1]:5.2f} tok/s  "
                      f"B/A {pairs[-1][1] / pairs[-1][0]:.3f}", flush=True)
    finally:
        for arm in arms:
            arm.close()
    ratios = [rb / ra for ra, rb in pairs]
    summary = {"a": str(args.a), "b": str(args.b), "pairs": len(pairs),
               "a_tok_s": statistics.median(r[0] for r in pairs),
               "b_tok_s": statistics.median(r[1] for r in pairs),
               "b_over_a": statistics.median(ratios), "b_ahead": sum(r > 1 for r in ratios)}
    benchkit.report(args, summary, lambda: print_table(args, summary))


def print_table(args, summary: dict) -> None:
    pairs = summary["pairs"]
    print(f"\n| A | B | pairs | A tok/s | B tok/s | B/A, median | B ahead |\n|---|---|---|---|---|---|---|\n"
          f"| {args.a} | {args.b} | {pairs} | {summary['a_tok_s']:.2f} | "
          f"{summary['b_tok_s']:.2f} | {summary['b_over_a']:.3f} | {summary['b_ahead']} of "
          f"{pairs} |")


if __name__ == "__main__":
    main()
