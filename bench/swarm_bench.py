"""Swarm benchmark: SmolLM2 served by `pnode start` processes on loopback.

Measures, against baselines measured in the same run:
  1. decode tokens/s of a greedy generation (--tokens, default 64, after a
     short prompt) over routes of 1, 2 and 3 server processes (30, 15+15,
     10+10+10 layers; --routes picks some), the client in this process, set
     up as `pwallet infer --peers` sets itself up
     (`node.torch_thread.share_cpus_politely`); the
     baseline is `pwallet infer --local`'s engine (`wallet.client.LocalModel`)
     in a process of its own with `--local`'s settings and the same thread
     count, run alternately with the swarm (same machine load). Decode rate = (tokens - 1) / time
     from the first token to the last, so prompt processing is left out of
     both. Each figure is the median of --repeats generations; the outputs
     must equal the local ones (asserted). Routes of 2 and 3 servers also
     run with push routing (`ClientConfig(push=True)`: each server pushes
     its outputs to the next) in the same alternation;
  2. memory: the resident set (VmRSS) and its peak (VmHWM) of each server
     process after the runs (Petals' figure for a 10-layer CPU server: about
     840 MiB);
  3. bytes on the wire per decoded token for each hidden-state encoding over
     the 3-server route (the longest of --routes; both directions, all
     hops), and whether the greedy output stays equal to the local one;
  4. recovery: a 4th server also holds layers 10-19 (the longest route's
     middle span); the server the route uses for 10-19 is killed with
     SIGKILL after the 8th token (push routing, `pwallet infer`'s default):
     recovery is the gap between that token and the next, against the
     median gap;
  5. chain sync: a node joining late pulls a chain of --blocks blocks from a
     `pnode start` peer; blocks/s from its start to its reaching the tip
     (process start-up included, so a lower bound).

Servers use --server-threads torch threads each; on a 2-core machine three
servers and the client share the cores (as the Petals figure did).

Usage:  .venv/bin/python bench/swarm_bench.py [--tokens 64] [--repeats 3]
            [--threads 2] [--server-threads 2] [--blocks 2000] [--routes 1,2,3]
            [--json] [--smoke]
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

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import benchkit  # noqa: E402
from node.torch_thread import CLIENT_SPIN_COUNT, share_cpus_politely  # noqa: E402

USER_ENV = dict(os.environ)  # before the client's own settings: for the baseline
if "--local-worker" not in sys.argv:
    share_cpus_politely(CLIENT_SPIN_COUNT)  # as `pwallet infer --peers` does, before torch

import torch  # noqa: E402
import trio  # noqa: E402

from compute.generate import Sampling  # noqa: E402
from wallet.client import InferRequest, LocalModel  # noqa: E402
from wallet.client.remote import (  # noqa: E402
    ClientConfig, ClientParts, load_client_parts, open_remote,
)

PROMPT = "The history of the Roman Empire"
ROUTES = {n: benchkit.even_spans(n) for n in (1, 2, 3)}  # servers -> their layer spans
PETALS = {"ratio": 0.46, "rss_mib": 840}
ENV = dict(USER_ENV, PYTHONUNBUFFERED="1", PNODE_PASSPHRASE="bench")


def pnode(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node.cli", *args], cwd=_ROOT, env=ENV,
                          capture_output=True, text=True, check=check)


class Swarm:
    """`pnode start` server processes in a temp dir (on CUDA device ``gpu`` if given)."""

    def __init__(self, root: Path, server_threads: int, gpu: int | None = None):
        self.root, self.threads, self.gpu = root, server_threads, gpu
        self.procs: list[subprocess.Popen] = []
        self.addrs: list[str] = []
        self.count = 0
        pnode("init", "--no-job", "--data-dir", str(root / "g"), "--chain-id", "bench-swarm")

    def start(self, span: tuple[int, int]) -> str:
        d = self.root / f"s{self.count}"
        self.count += 1
        pnode("init", "--data-dir", str(d), "--genesis", str(self.root / "g" / "genesis.json"))
        peers = ["--peers", self.addrs[0]] if self.addrs else []
        log = open(self.root / f"{d.name}.log", "w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "node.cli", "start", "--data-dir", str(d), "--no-produce",
             "--listen", "/ip4/127.0.0.1/tcp/0",
             "--layers", f"{span[0]}:{span[1]}", "--threads", str(self.threads), *peers,
             *(["--gpu", str(self.gpu)] if self.gpu is not None else [])],
            cwd=_ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        addr_file = d / "node.addr"
        deadline = time.monotonic() + 120
        while not addr_file.exists() or not addr_file.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server {d} did not start: see {log.name}")
            time.sleep(0.1)
        self.addrs.append(addr_file.read_text().strip())
        return self.addrs[-1]

    def rss_mib(self, proc: subprocess.Popen) -> tuple[float, float]:
        fields = {}
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            fields[key] = value.strip()
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


def decode_rate(times: list[float]) -> float:
    """Tokens/s after the first token (0.0 for a one-token generation)."""
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0


def local_generate(model: LocalModel, tokens: int) -> tuple[list[int], float]:
    request = InferRequest(PROMPT, raw=True, max_tokens=tokens, sampling=Sampling())
    ids, times = [], []
    for token in model.generate(request):
        ids.append(token.id)
        times.append(time.perf_counter())
    return ids, decode_rate(times)


def local_worker(threads: int) -> None:
    """The baseline process: one local generation per line of stdin (a token count)."""
    torch.set_num_threads(threads)
    model = LocalModel()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        ids, rate = local_generate(model, int(line))
        print(json.dumps({"ids": ids, "rate": rate}), flush=True)


class Local:
    """`--local`'s engine in a process of its own (its own OpenMP settings)."""

    def __init__(self, threads: int):
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--local-worker", "--threads", str(threads)],
            cwd=_ROOT, env=USER_ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True)
        assert json.loads(self.proc.stdout.readline())["ready"]

    def run(self, tokens: int) -> tuple[list[int], float]:
        self.proc.stdin.write(f"{tokens}\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        return reply["ids"], reply["rate"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


async def remote_run(peer: str, parts: ClientParts, tokens: int, codec: str = "raw",
                     expect: int = 0, kill_at: int | None = None, procs=None,
                     push: bool = False, victim_start: int = 10):
    """One generation over the swarm; returns (ids, rate, generation, gaps). With
    ``kill_at``, the route's server of layers from ``victim_start`` is killed (SIGKILL)
    after that many tokens."""
    request = InferRequest(PROMPT, raw=True, max_tokens=tokens, sampling=Sampling())
    times: list[float] = []
    async with open_remote([peer], parts, config=ClientConfig(codec=codec, push=push)) as client:
        with trio.fail_after(30):
            while len(client.servers()) < expect:
                await trio.sleep(0.3)
                await client.refresh()

        def on_token(token) -> None:
            times.append(time.perf_counter())
            if kill_at is not None and len(times) == kill_at:
                victim = [h.peer_id for h in client.route if h.start == victim_start][0]
                os.kill(procs[victim].pid, signal.SIGKILL)
        result = await client.generate(request, on_token)
    gaps = [b - a for a, b in zip(times, times[1:])]
    return result.token_ids, decode_rate(times), result, gaps


def bench_routes(args, root: Path, parts: ClientParts, local: Local) -> dict:
    """The routes of --routes, each against local; the wire over the longest."""
    out: dict = {"routes": {}}
    for n in args.routes:
        spans = ROUTES[n]
        swarm = Swarm(root / f"route{n}", args.server_threads)
        try:
            for span in spans:
                swarm.start(span)
            rows = []
            for _ in range(args.repeats):  # alternate: local, remote, pushed (same load)
                want, local_rate = local.run(args.tokens)
                ids, rate, result, _ = trio.run(remote_run, swarm.addrs[0], parts, args.tokens,
                                                "raw", n)
                assert ids == want, f"{n}-server output differs from local"
                pushed = rate
                if n > 1:
                    ids, pushed, _, _ = trio.run(remote_run, swarm.addrs[0], parts, args.tokens,
                                                 "raw", n, None, None, True)
                    assert ids == want, f"{n}-server pushed output differs from local"
                rows.append((rate, local_rate, pushed))
            rss = [swarm.rss_mib(p) for p in swarm.procs]
            out["routes"][n] = {
                "remote_tok_s": statistics.median(r[0] for r in rows),
                "local_tok_s": statistics.median(r[1] for r in rows),
                "ratio": statistics.median(r[0] / r[1] for r in rows),
                "push_tok_s": statistics.median(r[2] for r in rows) if n > 1 else None,
                "push_ratio": statistics.median(r[2] / r[1] for r in rows) if n > 1 else None,
                "rss_mib": [round(r[0]) for r in rss], "peak_rss_mib": [round(r[1]) for r in rss],
            }
            print(f"{n} server(s): {out['routes'][n]}", flush=True)
            if n == max(args.routes):
                out["wire"] = bench_wire(args, swarm, parts, want, n)
        finally:
            swarm.close()
    return out


def bench_wire(args, swarm: Swarm, parts: ClientParts, want: list[int], servers: int) -> dict:
    wire = {}
    for codec in ("raw", "fp16", "bf16", "int8"):
        _, _, one, _ = trio.run(remote_run, swarm.addrs[0], parts, 1, codec, servers)
        ids, _, full, _ = trio.run(remote_run, swarm.addrs[0], parts, args.tokens, codec,
                                   servers)
        per_token = (full.wire_bytes - one.wire_bytes) / (len(ids) - 1)
        same = next((i for i, (a, b) in enumerate(zip(ids, want)) if a != b), len(want))
        wire[codec] = {"bytes_per_token": round(per_token), "greedy_equal_prefix": same,
                       "of": len(want)}
        print(f"wire {codec}: {wire[codec]}", flush=True)
    return wire


def bench_recovery(args, root: Path, parts: ClientParts, local: Local) -> dict:
    """The longest route of --routes and a spare for its middle span (3 servers: 10-19),
    whose server on the route is killed after the 8th token (half of a shorter run's)."""
    spans = ROUTES[max(args.routes)]
    spare = spans[len(spans) // 2]
    kill_at = min(8, args.tokens // 2)
    swarm = Swarm(root / "recovery", args.server_threads)
    try:
        for span in [*spans, spare]:
            swarm.start(span)
        procs = {a.rsplit("/p2p/", 1)[1]: p for a, p in zip(swarm.addrs, swarm.procs)}
        want, _ = local.run(args.tokens)
        ids, _, result, gaps = trio.run(remote_run, swarm.addrs[0], parts, args.tokens, "raw",
                                        len(spans) + 1, kill_at, procs, True,  # push: default
                                        spare[0])
        assert ids == want, "output after failover differs from local"
        recovery = gaps[kill_at - 1]
        median_gap = statistics.median(gaps[:kill_at - 1] + gaps[kill_at:])
        out = {"recovery_s": round(recovery, 3), "median_gap_s": round(median_gap, 4),
               "failovers": result.failovers, "output_equal": True}
        print(f"recovery: {out}", flush=True)
        return out
    finally:
        swarm.close()


def bench_sync(args, root: Path) -> dict:
    a, b = root / "sync-a", root / "sync-b"
    pnode("init", "--no-job", "--data-dir", str(a), "--chain-id", "bench-sync", "--slot-ms", "1")
    pnode("produce", "--data-dir", str(a), "--blocks", str(args.blocks))
    pnode("init", "--data-dir", str(b), "--genesis", str(a / "genesis.json"))
    swarm = Swarm(root / "sync-swarm", args.server_threads)
    procs = []
    try:
        pa = subprocess.Popen([sys.executable, "-m", "node.cli", "start", "--data-dir", str(a),
                               "--listen", "/ip4/127.0.0.1/tcp/0", "--no-produce", "--no-serve"], cwd=_ROOT, env=ENV,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(pa)
        while not (a / "node.addr").exists() or not (a / "node.addr").read_text().strip():
            time.sleep(0.05)
        began = time.monotonic()
        pb = subprocess.Popen([sys.executable, "-m", "node.cli", "start", "--data-dir", str(b),
                               "--listen", "/ip4/127.0.0.1/tcp/0", "--no-produce", "--no-serve",
                               "--peers",
                               (a / "node.addr").read_text().strip()],
                              cwd=_ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True)
        procs.append(pb)
        while True:
            r = pnode("status", "--data-dir", str(b), "--json", check=False)
            if r.returncode == 0 and json.loads(r.stdout).get("height") == args.blocks:
                break
            if time.monotonic() - began > 300:
                raise RuntimeError("sync did not finish")
            time.sleep(0.05)
        seconds = time.monotonic() - began
        out = {"blocks": args.blocks, "seconds": round(seconds, 2),
               "blocks_per_s": round(args.blocks / seconds)}
        print(f"sync: {out}", flush=True)
        return out
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=15)
        swarm.close()


def server_counts(text: str) -> tuple[int, ...]:
    """``--routes``: comma-separated server counts, each a key of ROUTES."""
    counts = tuple(int(x) for x in text.split(","))
    if not counts or not set(counts) <= set(ROUTES):
        raise argparse.ArgumentTypeError(f"route lengths are among {sorted(ROUTES)}")
    return counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--server-threads", type=int, default=2)
    p.add_argument("--blocks", type=int, default=2000)
    p.add_argument("--routes", type=server_counts, default=(1, 2, 3),
                   help="route lengths to run, of 1, 2, 3 (comma-separated)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--local-worker", action="store_true", help=argparse.SUPPRESS)
    smoke = {"tokens": 4, "repeats": 1, "threads": 1, "server_threads": 1, "blocks": 20,
             "routes": (2,)}
    args = benchkit.parse_args(p, smoke)
    if args.local_worker:
        return local_worker(args.threads)
    torch.set_num_threads(args.threads)
    local = Local(args.threads)
    parts = load_client_parts()
    try:
        with tempfile.TemporaryDirectory(prefix="swarm-bench-") as tmp:
            root = Path(tmp)
            results = bench_routes(args, root, parts, local)
            results["recovery"] = bench_recovery(args, root, parts, local)
            results["sync"] = bench_sync(args, root)
    finally:
        local.close()
    benchkit.report(args, results, lambda: print_tables(results, max(args.routes)))


def print_tables(results: dict, longest: int) -> None:
    print("\n| route | decode tok/s | pushed tok/s | local tok/s (same run) | ratio | "
          "ratio pushed | target | server RSS MiB (peak) |\n|---|---|---|---|---|---|---|---|")
    for n, r in results["routes"].items():
        rss = ", ".join(f"{a} ({b})" for a, b in zip(r["rss_mib"], r["peak_rss_mib"]))
        target = ">= 0.75x (Petals 0.46x)" if n == 3 else ""
        pushed = ("—", "—") if r["push_tok_s"] is None else (
            f"{r['push_tok_s']:.1f}", f"{r['push_ratio']:.2f}x")
        print(f"| {n} server(s) | {r['remote_tok_s']:.1f} | {pushed[0]} | "
              f"{r['local_tok_s']:.1f} | {r['ratio']:.2f}x | {pushed[1]} | {target} | {rss} |")
    print(f"\n| encoding | bytes/token on the wire ({longest} hops, both ways) | greedy tokens "
          "equal to local |\n|---|---|---|")
    for codec, w in results["wire"].items():
        print(f"| {codec} | {w['bytes_per_token']:,} | {w['greedy_equal_prefix']} of {w['of']} |")
    rec, syn = results["recovery"], results["sync"]
    print(f"\nrecovery after kill -9: {rec['recovery_s']} s (median token gap "
          f"{rec['median_gap_s']} s), output equal to local: {rec['output_equal']}")
    print(f"chain sync: {syn['blocks']} blocks in {syn['seconds']} s = {syn['blocks_per_s']} "
          "blocks/s (process start-up included)")


if __name__ == "__main__":
    main()
