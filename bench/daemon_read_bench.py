"""Read commands through a running node's control socket, against opening the store, one sitting.

A chain made with `pnode init` (its default job, 100 ms slots) is mined
by `pnode start` for --mine-s seconds (and on until it holds a receipt),
so it has blocks, receipts and rewards. Then each read the CLIs make
(`node.cli.common.read_view`, the one path every read command takes) is
timed --repeats times while the node runs (the answer comes over
DATA_DIR/node.sock, computed in the node's chain thread), and again after
the node stopped (the command opens the LevelDB store itself, and closes
it). Medians, in-process, so Python's start-up (the same for both) is left
out; the last column is the whole CLI command (median of --cli-repeats),
start-up included, while the node runs.

Usage:  .venv/bin/python bench/daemon_read_bench.py [--mine-s 30] [--repeats 15]
            [--cli-repeats 3] [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT))

import benchkit  # noqa: E402
from node.cli.common import read_view  # noqa: E402
from node.datadir import DataDir  # noqa: E402


def reads(dd: DataDir) -> dict[str, tuple[str, dict, list[str]]]:
    """name -> (view, its arguments, the CLI command that makes this read)."""
    address = json.loads(subprocess.run([str(BIN / "pwallet"), "balance", "--data-dir",
                                         str(dd.path), "--json"], capture_output=True,
                                        text=True).stdout)["address"]
    receipt = read_view(dd, "receipts")["receipts"][-1]["id"]
    d = str(dd.path)
    return {
        "ledger show (tip)": ("block", {}, ["pnode", "ledger", "show", "--data-dir", d]),
        "job list": ("jobs", {}, ["pnode", "job", "list", "--data-dir", d]),
        "proof (a receipt)": ("proof", {"txid": receipt}, ["pnode", "proof", receipt,
                                                           "--data-dir", d]),
        "receipts (all)": ("receipts", {}, ["pnode", "receipts", "--data-dir", d]),
        "pwallet history": ("history", {"address": address},
                            ["pwallet", "history", "--data-dir", d]),
        "verify chain": ("verify", {}, ["pnode", "verify", "chain", "--data-dir", d]),
    }


def mine_until_receipt(dd: DataDir, limit_s: float = 120.0) -> None:
    """Wait until the chain holds a receipt (`reads` proves one): a short --mine-s on a
    loaded machine may end before the first unit is accepted."""
    deadline = time.monotonic() + limit_s
    while not read_view(dd, "receipts")["receipts"]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no receipt on the chain within {limit_s:g} s of mining")
        time.sleep(0.5)


def timed(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mine-s", type=float, default=30.0)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--cli-repeats", type=int, default=3, help="runs of each CLI command")
    parser.add_argument("--json", action="store_true")
    args = benchkit.parse_args(parser, {"mine_s": 1.0, "repeats": 1, "cli_repeats": 1})
    os.environ.setdefault("PNODE_PASSPHRASE", "bench")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "n"
        subprocess.run([str(BIN / "pnode"), "init", "--data-dir", str(d), "--chain-id", "bench",
                        "--slot-ms", "100"], check=True, capture_output=True)
        proc = subprocess.Popen([str(BIN / "pnode"), "start", "--data-dir", str(d), "--no-serve",
                                 "--listen", "/ip4/127.0.0.1/tcp/0"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while not (d / "node.addr").exists():
                time.sleep(0.1)
            time.sleep(args.mine_s)
            dd = DataDir(d)
            mine_until_receipt(dd)
            plan = reads(dd)
            running = {name: timed(lambda v=v, a=a: read_view(dd, v, **a), args.repeats)
                       for name, (v, a, _) in plan.items()}
            cli = {name: timed(lambda c=c: subprocess.run([str(BIN / c[0]), *c[1:]],
                                                          capture_output=True, check=True),
                         args.cli_repeats)
                   for name, (_, _, c) in plan.items()}
            height = read_view(dd, "block")["header"]["height"]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        stored = {name: timed(lambda v=v, a=a: read_view(dd, v, **a), args.repeats)
                  for name, (v, a, _) in plan.items()}
    rows = [{"read": n, "running_ms": running[n] * 1e3, "store_ms": stored[n] * 1e3,
             "ratio": running[n] / stored[n], "cli_running_ms": cli[n] * 1e3} for n in plan]

    def table() -> None:
        print(f"chain of {height} blocks; medians of {args.repeats} in-process reads")
        print(f"{'read':20} {'running node':>14} {'store opened':>14} {'ratio':>7} "
              f"{'CLI, running':>14}")
        for r in rows:
            print(f"{r['read']:20} {r['running_ms']:>11.1f} ms {r['store_ms']:>11.1f} ms "
                  f"{r['ratio']:>6.2f}x {r['cli_running_ms']:>11.0f} ms")
    benchkit.report(args, {"height": height, "rows": rows}, table)


if __name__ == "__main__":
    main()
