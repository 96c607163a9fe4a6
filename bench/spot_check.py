"""Spot-check overhead: decode tokens/s with spot checks off vs at the default rate, paired.

Three `pnode start` server processes on loopback (layers 0-15, 15-30 and
0-30, so every span has a second server to check against; `bench/swarm_bench.py`'s
`Swarm`), the client in this process set up as `pwallet infer --peers` sets
itself up. Each pair runs the same greedy generation (--tokens after the same
prompt, push routing, `pwallet infer`'s default) twice: spot checks off
(rate 0, the baseline) and at --rate (default `ClientConfig`'s 0.02; the
first step is always checked, each later one with that probability, seeded
by the pair's index, so both arms of a pair see the same draw); which arm
goes first alternates. The decode rate leaves the first token out (as
swarm_bench does), so the always-checked first step (the prompt) counts only
in the time to first token, reported apart. Outputs must be equal (asserted).

Prints per pair both rates and on/off, then the medians: the target is an
overhead of at most 5% (ratio >= 0.95) at the default rate.

Usage:  .venv/bin/python bench/spot_check.py [--pairs 8] [--tokens 64] [--rate 0.02]
            [--server-threads 2] [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
for path in (str(_ROOT), str(_ROOT / "bench")):
    if path not in sys.path:
        sys.path.insert(0, path)

import benchkit  # noqa: E402
import swarm_bench  # noqa: E402  (sets the client's CPU sharing, as `pwallet infer` does)
import trio  # noqa: E402

from compute.generate import Sampling  # noqa: E402
from wallet.client import InferRequest  # noqa: E402
from wallet.client.remote import ClientConfig, load_client_parts, open_remote  # noqa: E402

SPANS = ((0, 15), (15, 30), (0, 30))


async def generate(peer: str, parts, tokens: int, rate: float, seed: int) -> dict:
    """One generation; its ids, decode rate, time to first token and spot-check report."""
    request = InferRequest(swarm_bench.PROMPT, raw=True, max_tokens=tokens, sampling=Sampling())
    config = ClientConfig(push=True, spot_check_rate=rate, spot_check_seed=seed)
    times: list[float] = []
    async with open_remote([peer], parts, config=config) as client:
        with trio.fail_after(30):
            while len(client.servers()) < len(SPANS):
                await trio.sleep(0.3)
                await client.refresh()
        began = time.perf_counter()
        result = await client.generate(request, lambda t: times.append(time.perf_counter()))
    return {"ids": result.token_ids, "rate": swarm_bench.decode_rate(times),
            "first_s": times[0] - began, "checks": result.spot_checks.as_json()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rate", type=float, default=ClientConfig().spot_check_rate)
    p.add_argument("--server-threads", type=int, default=2)
    p.add_argument("--json", action="store_true")
    args = benchkit.parse_args(p, {"pairs": 1, "tokens": 3, "server_threads": 1})
    parts = load_client_parts()
    rows = []
    with tempfile.TemporaryDirectory(prefix="spot-bench-") as tmp:
        swarm = swarm_bench.Swarm(Path(tmp), args.server_threads)
        try:
            for span in SPANS:
                swarm.start(span)
            # A warm-up, not counted.
            trio.run(generate, swarm.addrs[0], parts, min(8, args.tokens), 0.0, 0)
            for pair in range(args.pairs):
                arms = [("off", 0.0), ("on", args.rate)]
                if pair % 2:
                    arms.reverse()
                got = {name: trio.run(generate, swarm.addrs[0], parts, args.tokens, rate, pair)
                       for name, rate in arms}
                assert got["on"]["ids"] == got["off"]["ids"], "spot checks changed the output"
                assert got["on"]["checks"]["mismatches"] == [], "honest servers disagreed"
                row = {"off": got["off"]["rate"], "on": got["on"]["rate"],
                       "ratio": got["on"]["rate"] / got["off"]["rate"],
                       "checks": got["on"]["checks"]["run"],
                       "first_off_s": got["off"]["first_s"], "first_on_s": got["on"]["first_s"]}
                rows.append(row)
                print(f"pair {pair}: off {row['off']:.1f} tok/s, on {row['on']:.1f} tok/s "
                      f"({row['checks']} checks), on/off {row['ratio']:.3f}", flush=True)
        finally:
            swarm.close()
    summary = {
        "pairs": len(rows), "tokens": args.tokens, "rate": args.rate,
        "off_tok_s": statistics.median(r["off"] for r in rows),
        "on_tok_s": statistics.median(r["on"] for r in rows),
        "ratio": statistics.median(r["ratio"] for r in rows),
        "checks_per_generation": statistics.mean(r["checks"] for r in rows),
        "first_token_off_s": statistics.median(r["first_off_s"] for r in rows),
        "first_token_on_s": statistics.median(r["first_on_s"] for r in rows),
    }
    benchkit.report(args, {"rows": rows, "summary": summary}, lambda: print_table(summary))


def print_table(s: dict) -> None:
    print(f"\n| spot checks | decode tok/s (median of {s['pairs']}) | on/off (median of pairs) "
          f"| checks per generation | time to first token | target |\n|---|---|---|---|---|---|")
    print(f"| off (rate 0, baseline, same run) | {s['off_tok_s']:.1f} | 1 | 0 | "
          f"{s['first_token_off_s']:.3f} s | |")
    print(f"| on (rate {s['rate']}) | {s['on_tok_s']:.1f} | {s['ratio']:.3f} | "
          f"{s['checks_per_generation']:.2f} | {s['first_token_on_s']:.3f} s | >= 0.95 |")


if __name__ == "__main__":
    main()
