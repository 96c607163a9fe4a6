"""An honest client's decode steps on a free server under a flood of maximum-size chunks.

One in-process `InferenceServer` serving SmolLM2's 30 layers (real libp2p
hosts on 127.0.0.1); an honest client sends --steps one-position decode
steps after a short prompt, timing each step's round trip. Measured in one
run, three ways, the flood's order alternating each repeat:

  alone       no other client
  no pieces   --flood sessions of one other client sending --chunk-position
              steps back to back, the server's free calls NOT cut in pieces
              (free_call_positions = the chunk: issue 28 item 6's "before",
              but for the fair queue per client, which stays)
  shipped     the same flood, the shipped settings (pieces of 32 positions)

Reported: the honest step's p50 and p90 (seconds) and the ratio to alone.

Usage:  .venv/bin/python bench/free_flood.py [--steps 40] [--flood 4] [--chunk 128]
            [--repeats 2] [--json] [--smoke]
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
import torch  # noqa: E402
import trio  # noqa: E402

from compute.gguf import load_gguf, model_id, open_gguf  # noqa: E402
from compute.tokenizer import Tokenizer  # noqa: E402
from compute.wiretensor import encode_tensor  # noqa: E402
from ledger.codec import encode  # noqa: E402
from node.net.framing import read_frame, write_frame  # noqa: E402
from node.net.host import open_host  # noqa: E402
from node.serve.sessions import InferenceServer, SessionConfig  # noqa: E402
from node.wire.serve import Step  # noqa: E402
from tests.node.netkit import ident  # noqa: E402
from tests.node.serve.test_sessions import another_client, open_session, step  # noqa: E402

WAYS = ("alone", "no pieces", "shipped")


async def one_run(smol, smol_id, x, way: str, args) -> list[float]:
    """The honest step times (s) of one run of ``way``."""
    pieces = args.chunk if way == "no pieces" else SessionConfig().free_call_positions
    config = SessionConfig(max_sessions_per_peer=args.flood, free_call_positions=pieces)
    async with AsyncExitStack() as stack:
        sh = await stack.enter_async_context(open_host(ident(1)))
        server = InferenceServer(sh, smol, range(0, 30), smol_id, config=config)
        server.start()
        honest = await another_client(stack, sh, 2)
        stream, _ = await open_session(honest, sh, end=30, max_len=x.shape[1] + args.steps + 1,
                                       model_id=smol_id)
        chunk = encode_tensor(torch.cat([x[:, :1]] * args.chunk, dim=1), "raw")
        done = trio.Event()
        times: list[float] = []

        async def flood(f) -> None:
            pos = 0
            while not done.is_set():
                await write_frame(f, encode(Step(pos, (), chunk)))
                await read_frame(f, 1 << 26)
                pos = (pos + args.chunk) % (3 * args.chunk)
        flooder = await another_client(stack, sh, 3)  # outside the nursery: it outlives it
        async with trio.open_nursery() as nursery:
            if way != "alone":
                for _ in range(args.flood):
                    f, _ = await open_session(flooder, sh, end=30, max_len=4 * args.chunk,
                                              model_id=smol_id)
                    nursery.start_soon(flood, f)
                await trio.sleep(0.5)  # the flood under way
            await step(stream, x, 0)
            for k in range(args.steps):
                began = time.perf_counter()
                await step(stream, x[:, -1:], x.shape[1] + k)
                times.append(time.perf_counter() - began)
            done.set()
        return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="honest decode steps per run")
    parser.add_argument("--flood", type=int, default=4, help="flooding sessions")
    parser.add_argument("--chunk", type=int, default=128, help="positions per flood step")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = benchkit.parse_args(parser, {"steps": 3, "flood": 2, "chunk": 64, "repeats": 1})
    reader = open_gguf()
    smol, smol_id = load_gguf(reader=reader), model_id(reader)
    with torch.inference_mode():
        x = smol.embed(torch.tensor([Tokenizer.from_gguf(reader=reader).encode("The sea is")]))
    times: dict[str, list[float]] = {w: [] for w in WAYS}
    for r in range(args.repeats):
        for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
            times[way] += trio.run(one_run, smol, smol_id, x, way, args)

    def pct(xs: list[float], q: float) -> float:
        return statistics.quantiles(xs, n=10)[int(q * 10) - 1] if len(xs) > 1 else xs[0]
    rows = {w: {"p50": statistics.median(t), "p90": pct(t, 0.9)} for w, t in times.items()}

    def table() -> None:
        print(f"honest decode step under {args.flood} flooding sessions of {args.chunk}-position "
              f"steps, {args.steps} steps x {args.repeats} repeats (seconds)")
        print(f"{'':10} {'p50':>8} {'p90':>8} {'p50 / alone':>12}")
        for w, row in rows.items():
            print(f"{w:10} {row['p50']:8.3f} {row['p90']:8.3f} "
                  f"{row['p50'] / rows['alone']['p50']:11.2f}x")
    benchkit.report(args, {"flood": args.flood, "chunk": args.chunk, "rows": rows}, table)


if __name__ == "__main__":
    main()
