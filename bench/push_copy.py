"""What the linked hops' signed copies (`StepCopy`, specs/network.md 9.3a) cost a pushed route.

Three in-process servers (SmolLM2 layers 0:10, 10:20, 20:30, real libp2p
hosts on 127.0.0.1) and one client, push routing, no spot checks. Each
repeat generates --tokens greedy tokens twice, once as shipped (every
linked hop sends the client its signed answer after the push) and once
with the copies off (`PushRouting._copy` a no-op: the baseline, in the same
run), the order alternating. Reported: the median seconds per token after
the first, per mode, and the paired ratio of tokens/s (copies / none).

Usage:  .venv/bin/python bench/push_copy.py [--tokens 48] [--repeats 6] [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import benchkit  # noqa: E402
import trio  # noqa: E402

from compute.gguf import load_gguf, model_id, open_gguf  # noqa: E402
from compute.tokenizer import Tokenizer  # noqa: E402
from node.serve import push  # noqa: E402
from tests.wallet.client.test_remote import PROMPT, swarm  # noqa: E402
from wallet.client import InferRequest  # noqa: E402
from wallet.client.remote import ClientConfig, ClientParts, open_remote  # noqa: E402

SHIPPED = push.PushRouting._copy


async def _no_copy(self, s, answer) -> None:
    """The baseline: a linked hop sends the client nothing after the push."""


async def measure(reader, parts, args) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"copies": [], "none": []}
    async with AsyncExitStack() as stack:
        hosts, _ = await swarm(stack, reader, [(0, 10), (10, 20), (20, 30)])
        config = ClientConfig(push=True, spot_check_rate=0.0)
        async with open_remote([hosts[0].addrs[0]], parts, config=config) as client:
            await client.generate(InferRequest(PROMPT, max_tokens=4))  # warm
            for r in range(args.repeats):
                for mode in (("copies", "none") if r % 2 == 0 else ("none", "copies")):
                    push.PushRouting._copy = SHIPPED if mode == "copies" else _no_copy
                    stamps: list[float] = []
                    await client.generate(InferRequest(PROMPT, max_tokens=args.tokens),
                                          lambda token: stamps.append(time.perf_counter()))
                    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
                    out[mode].append(statistics.median(gaps) if gaps else 0.0)
    push.PushRouting._copy = SHIPPED
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--json", action="store_true")
    args = benchkit.parse_args(parser, {"tokens": 4, "repeats": 1})
    reader = open_gguf()
    parts = ClientParts(load_gguf(reader=reader, layers=range(0)),
                        Tokenizer.from_gguf(reader=reader), model_id(reader))
    out = trio.run(measure, reader, parts, args)
    ratio = benchkit.paired_ratio(out["copies"], out["none"])  # none time / copies time

    def table() -> None:
        print(f"pushed route of 3 hops, {args.tokens} tokens x {args.repeats} repeats")
        for mode, times in out.items():
            print(f"{mode:8} {statistics.median(times) * 1000:8.1f} ms/token")
        print(f"tokens/s, copies / none (paired median): {ratio:.3f}x")
    benchkit.report(args, {"ms_per_token": {m: statistics.median(t) * 1000
                                            for m, t in out.items()},
                           "ratio": ratio}, table)


if __name__ == "__main__":
    main()
