"""Spot-check detection: how often a liar that answers replays honestly is caught, paired.

Five in-process servers on loopback serving the real SmolLM2 (the tests'
`swarm`: A 0-10, L 10-20, C 20-30, and H1, H2 10-20 to check L against).
L announces a huge throughput, so every route runs through it, and lies:
it shifts its answer to a decode step (one position at the end of its
cache) by 0.05 x the row's largest |value|, each with probability
--lie-rate, and answers prompts and replays honestly (`lie_on_decode`,
tests/wallet/client/spotkit.py). Each generation is a fresh client (so a
ban does not carry over) at the default check rate (`ClientConfig`'s
0.02, seeded by the generation's index), push routing, greedy, --tokens
after a raw prompt whose continuation does not stop before them.

Both arms run in the same process on the same draws: ``new`` (the checks
of specs/network.md 9.5: every earlier row compared, each hop judged on
its own logged steps by other servers) and ``old`` (`SpotChecker.legacy`:
the checked step's rows only, localised by replaying the route, what the
code did before). For each lie rate and arm: the share of generations in
which L lied at least once, in which L was caught (a mismatch whose loser
is L), caught among those it lied in, and whose tokens equal the local
model's (the reference).

Usage:  .venv/bin/python bench/spot_detect.py [--generations 20] [--tokens 32]
            [--lie-rates 0.01,0.1,1.0] [--rate 0.02] [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import random
import sys
from contextlib import AsyncExitStack
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
for path in (str(_ROOT), str(_ROOT / "bench")):
    if path not in sys.path:
        sys.path.insert(0, path)

import benchkit  # noqa: E402
import trio  # noqa: E402

from compute.generate import generate as local_generate  # noqa: E402
from compute.gguf import load_gguf, model_id, open_gguf  # noqa: E402
from compute.tokenizer import Tokenizer  # noqa: E402
from tests.wallet.client.spotkit import attract, lie_on_decode  # noqa: E402
from tests.wallet.client.test_remote import swarm  # noqa: E402
from wallet.client import InferRequest  # noqa: E402
from wallet.client.remote import ClientConfig, ClientParts, open_remote  # noqa: E402
from wallet.client.spotcheck import SpotChecker  # noqa: E402

SPANS = [(0, 10), (10, 20), (20, 30), (10, 20), (10, 20)]
#: A raw prompt whose greedy continuation runs past 32 tokens (bench/swarm_bench.py's).
PROMPT = "The history of the Roman Empire"


async def measure(args, reader, parts, reference: list[int]) -> list[dict]:
    rows = []
    async with AsyncExitStack() as stack:
        hosts, servers = await swarm(stack, reader, SPANS)
        liar, honest = str(hosts[1].peer_id), servers[1].inference._forward
        await attract(servers[1])
        for lie_rate in args.lie_rates:
            for arm in ("new", "old"):
                SpotChecker.legacy = arm == "old"
                row = {"lie_rate": lie_rate, "arm": arm, "generations": 0, "lied": 0,
                       "caught": 0, "caught_when_lied": 0, "equal": 0, "checks": 0}
                for g in range(args.generations):
                    servers[1].inference._forward = honest  # one wrapper at a time
                    # Same lies and same draws in both arms: seeded by the generation.
                    lied = lie_on_decode(servers[1], rate=lie_rate, rng=random.Random(g))
                    config = ClientConfig(push=True, spot_check_rate=args.rate,
                                          spot_check_seed=g)
                    async with open_remote([hosts[0].addrs[0]], parts, config=config) as client:
                        await client.refresh()
                        result = await client.generate(InferRequest(PROMPT, raw=True,
                                                                    max_tokens=args.tokens))
                    caught = any(m["loser"] == liar for m in result.spot_checks.mismatches)
                    row["generations"] += 1
                    row["lied"] += bool(lied)
                    row["caught"] += caught
                    row["caught_when_lied"] += caught and bool(lied)
                    row["equal"] += result.token_ids == reference
                    row["checks"] += result.spot_checks.run
                rows.append(row)
                print(f"lie rate {lie_rate}, {arm}: lied in {row['lied']}/{row['generations']}, "
                      f"caught in {row['caught']}, tokens equal in {row['equal']}", flush=True)
        SpotChecker.legacy = False
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--generations", type=int, default=20)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--lie-rates", type=lambda s: [float(x) for x in s.split(",")],
                   default=[0.01, 0.1, 1.0])
    p.add_argument("--rate", type=float, default=ClientConfig().spot_check_rate)
    p.add_argument("--json", action="store_true")
    args = benchkit.parse_args(p, {"generations": 1, "tokens": 3, "lie_rates": [1.0]})
    reader = open_gguf()
    tokenizer = Tokenizer.from_gguf(reader=reader)
    parts = ClientParts(load_gguf(reader=reader, layers=range(0)), tokenizer, model_id(reader))
    ids = tokenizer.encode(PROMPT)
    reference = local_generate(load_gguf(reader=reader), ids, args.tokens,
                               stop_ids=tokenizer.stop_ids)
    print(f"reference: {len(reference)} tokens", flush=True)
    rows = trio.run(measure, args, reader, parts, reference)
    benchkit.report(args, {"rows": rows, "tokens": args.tokens, "rate": args.rate},
                    lambda: print_table(rows, args))


def print_table(rows: list[dict], args) -> None:
    print(f"\n| lie rate | arm | generations | L lied in | caught | caught when it lied "
          f"| tokens equal to local | checks per generation |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        n, lied = r["generations"], max(r["lied"], 1)
        print(f"| {r['lie_rate']:g} | {r['arm']} | {n} | {r['lied']} | {r['caught'] / n:.0%} | "
              f"{r['caught_when_lied'] / lied:.0%} | {r['equal'] / n:.0%} | "
              f"{r['checks'] / n:.2f} |")


if __name__ == "__main__":
    main()
