"""Cold-forward benchmark: what one swarm hop's 10 layers cost after waiting.

A hop of a 3-server route computes one token's 10 layers, then waits while
the other two hops and the client compute (about 30-45 ms), then computes
the next token's. A local run never waits: its thread goes from one layer
to the next. This bench measures, with no network and no trio at all, what
the wait alone costs: a one-token forward through layers 0-9 of SmolLM2
(packed, as a server holds them, --threads torch threads, OpenMP settings
as `pnode start` sets them), timed per layer after each kind of gap:

  back-to-back   no gap (the baseline: how a local run sees its layers);
  sleep          the thread sleeps --gap-ms (a hop's process idle);
  busy           the thread spins in Python for --gap-ms (the CPU busy, but
                 not with this work);
  other weights  the same thread runs the same code over a second copy of
                 the layers for about --gap-ms (busy with this work);
  other process  a second process runs its own copy of the layers for about
                 --gap-ms while this one waits on a pipe (the swarm's case:
                 another hop computes in between).

Modes alternate within each repeat (the machine is shared and noisy); each
figure is the median over repeats of the per-repeat medians. Ratios are
each mode's 10-layer time over back-to-back's.

Usage:  .venv/bin/python bench/cold_forward_bench.py [--steps 40] [--repeats 3]
            [--gap-ms 25] [--threads 2] [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from node.torch_thread import share_cpus_politely  # noqa: E402

share_cpus_politely()  # as `pnode start` does, before torch loads

import torch  # noqa: E402

import benchkit  # noqa: E402
from compute.gguf import load_gguf  # noqa: E402
from compute.kvcache import KVCache  # noqa: E402

LAYERS = range(0, 10)
MODES = ("back-to-back", "sleep", "busy", "other weights", "other process")


class Hop:
    """Layers 0-9 and a KV cache that is emptied before it fills up."""

    def __init__(self) -> None:
        self.model = load_gguf(layers=LAYERS, ends=False, serve_only=True)
        dim = self.model.config.dim
        self.cache = KVCache(self.model.config, 256, layers=LAYERS)
        self.x = torch.randn(1, 1, dim, generator=torch.Generator().manual_seed(0))
        self.prompt = torch.randn(1, 8, dim, generator=torch.Generator().manual_seed(1))
        self._restart()

    def _restart(self) -> None:
        self.cache.reset()
        with torch.inference_mode():
            self.model.run_layers(self.prompt, LAYERS.start, LAYERS.stop, pos=0, cache=self.cache)

    def step(self) -> list[float]:
        """One token through the 10 layers; seconds per layer."""
        if self.cache.room < 1:
            self._restart()
        pos, h, times = self.cache.length, self.x, []
        with torch.inference_mode():
            for layer in LAYERS:
                t = time.perf_counter()
                h = self.model.run_layers(h, layer, layer + 1, pos=pos, cache=self.cache)
                times.append(time.perf_counter() - t)
        return times

    def compute_for(self, seconds: float) -> None:
        """Whole-token steps until ``seconds`` have passed (at least one)."""
        end = time.perf_counter() + seconds
        self.step()
        while time.perf_counter() < end:
            self.step()


def other_process(conn, threads: int) -> None:
    """The second hop: on each message (seconds), compute that long, then answer."""
    torch.set_num_threads(threads)
    hop = Hop()
    conn.send("ready")
    while (seconds := conn.recv()) is not None:
        hop.compute_for(seconds)
        conn.send("done")


def run_mode(mode: str, hop: Hop, other: Hop, conn, steps: int, gap: float) -> list[list[float]]:
    """``steps`` timed forwards, each after the mode's gap; per-layer seconds."""
    out = []
    for _ in range(steps):
        if mode == "sleep":
            time.sleep(gap)
        elif mode == "busy":
            end = time.perf_counter() + gap
            while time.perf_counter() < end:
                pass
        elif mode == "other weights":
            other.compute_for(gap)
        elif mode == "other process":
            conn.send(gap)
            conn.recv()
        out.append(hop.step())
    return out[2:]  # the first two after a mode switch see the previous mode


def summarize(runs: dict[str, list[list[list[float]]]]) -> dict[str, dict[str, float]]:
    """Median over repeats of each repeat's median 10-layer and first-layer ms."""
    table = {}
    for mode, repeats in runs.items():
        total = statistics.median(statistics.median(sum(s) for s in r) for r in repeats)
        first = statistics.median(statistics.median(s[0] for s in r) for r in repeats)
        table[mode] = {"layers_ms": 1000 * total, "first_layer_ms": 1000 * first}
    base = table["back-to-back"]["layers_ms"]
    for row in table.values():
        row["ratio"] = row["layers_ms"] / base
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gap-ms", type=float, default=25.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = benchkit.parse_args(parser, {"steps": 3, "repeats": 1, "gap_ms": 1.0, "threads": 1})
    torch.set_num_threads(args.threads)
    ctx = mp.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    child = ctx.Process(target=other_process, args=(child_conn, args.threads), daemon=True)
    child.start()
    hop, other = Hop(), Hop()
    assert conn.recv() == "ready"
    runs: dict[str, list] = {mode: [] for mode in MODES}
    try:
        for r in range(args.repeats):
            order = MODES if r % 2 == 0 else MODES[::-1]
            for mode in order:
                runs[mode].append(run_mode(mode, hop, other, conn, args.steps, args.gap_ms / 1000))
            print(f"repeat {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    finally:
        conn.send(None)
        child.join(timeout=30)
    table = summarize(runs)

    def show() -> None:
        print(f"10-layer one-token forward after a {args.gap_ms:g} ms gap "
              f"({args.threads} threads, {args.steps} steps x {args.repeats} repeats)")
        print(f"{'mode':<16}{'10 layers ms':>14}{'first layer ms':>16}{'ratio':>8}")
        for mode, row in table.items():
            print(f"{mode:<16}{row['layers_ms']:>14.2f}{row['first_layer_ms']:>16.2f}"
                  f"{row['ratio']:>7.2f}x")
    benchkit.report(args, {"gap_ms": args.gap_ms, "threads": args.threads, "modes": table},
                    show, indent=None)


if __name__ == "__main__":
    main()
