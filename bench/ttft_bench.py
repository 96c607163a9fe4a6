"""Time to first token over 3 servers on loopback: pnode against Petals, in one sitting.

Three `pnode start` servers (--servers; layers 0:10, 10:20, 20:30, one
chain that registers them and funds the client: `bench/paid_bench.py`'s)
and, with --petals-python, three Petals 2.x CPU servers of the same model
(blocks 0:10, 10:20, 20:30) run side by side; the runs alternate, round by
round:

  pnode warm    one client kept open (its connections to the servers stay
                up, as Petals' client keeps its own): a free generation;
  pnode paid    the same client paying (one tab, a voucher a step, settle);
  pnode cold    a new client per generation (dials every server, as a
                fresh `pwallet infer --peers` process does);
  Petals        Petals' client, model loaded once, a new inference session
                per generation (bench/petals_client.py in Petals' Python).

Every generation is greedy, N tokens after the same 6-token raw prompt.
Time to first token: from the generation's start (pnode: `generate`;
Petals: entering `inference_session`) to the first token; decode: tokens/s
after it. Medians over --repeats rounds after one warm-up round.

Petals is not a pnode dependency: give its environment's Python and an HF
checkpoint of SmolLM2-135M-Instruct (BENCHMARKS.md says how ours was made).
Without them the Petals rounds are skipped (said on stderr); so they are in
a smoke run whose Python cannot import Petals.

Usage:  .venv/bin/python bench/ttft_bench.py [--tokens 64] [--repeats 5]
            [--petals-python /tmp/pv/bin/python --petals-model /tmp/smol-hf]
            [--servers 3] [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import benchkit
from paid_bench import (  # also sets the client's CPU sharing
    SPANS, account, make_chain, registered_servers, start_servers,
)

import trio  # noqa: E402  (after paid_bench: it orders the imports before torch)

from compute.generate import Sampling  # noqa: E402
from ledger.crypto import SigningKey  # noqa: E402
from wallet.client import InferRequest  # noqa: E402
from wallet.payer import Payer  # noqa: E402
from wallet.client.remote import ClientConfig, load_client_parts, open_remote  # noqa: E402

PROMPT = "The history of the Roman Empire"  # 6 tokens; no stop token within 64 greedy ones
BENCH = Path(__file__).resolve().parent
CONFIG = ClientConfig(push=True, spot_check_rate=0.0)


class PetalsSwarm:
    """Three Petals servers (each in its own process group) and a warm client process."""

    FLAGS = ["--dht_prefix", "smol-hf", "--host_maddrs", "/ip4/127.0.0.1/tcp/0",
             "--torch_dtype", "float32", "--device", "cpu", "--throughput", "1",
             "--skip_reachability_check", "--no_auto_relay"]

    def __init__(self, python: str, model: str, root: Path, prompt_ids: list[int]):
        self.python, self.model, self.root = python, model, root
        self.servers: list[subprocess.Popen] = []
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        peer = self._serve("0:10", env, ["--new_swarm"])
        for span in ("10:20", "20:30"):
            self._serve(span, env, ["--initial_peers", peer], wait=False)
        for i in (1, 2):
            self._wait_started(i)
        self.client = subprocess.Popen(
            [python, str(BENCH / "petals_client.py"), model, peer, "smol-hf",
             ",".join(map(str, prompt_ids))], env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=open(root / "petals_client.log", "w"), text=True,
            start_new_session=True)  # with its p2pd: killed as a group
        assert json.loads(self.client.stdout.readline())["ready"]

    def _serve(self, span: str, env: dict, extra: list[str], wait: bool = True) -> str:
        log = self.root / f"petals_{len(self.servers)}.log"
        self.servers.append(subprocess.Popen(
            [self.python, "-m", "petals.cli.run_server", self.model, "--block_indices", span,
             *extra, *self.FLAGS], env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True))
        return self._wait_started(len(self.servers) - 1) if wait else ""

    def _wait_started(self, i: int) -> str:
        log, deadline = self.root / f"petals_{i}.log", time.monotonic() + 180
        while "[INFO] Started" not in log.read_text():
            if self.servers[i].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Petals server {i} did not start: see {log}")
            time.sleep(0.5)
        for line in log.read_text().splitlines():
            if "Running a server on" in line:
                return next(w.strip("[],'") for w in line.split() if "/p2p/" in w)
        return ""

    def generate(self, tokens: int) -> dict:
        self.client.stdin.write(f"{tokens}\n")
        self.client.stdin.flush()
        return json.loads(self.client.stdout.readline())

    def close(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for proc in [*self.servers, *([self.client] if hasattr(self, "client") else [])]:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(3 if sig == signal.SIGTERM else 0)


async def until_all(client, servers: int) -> None:
    with trio.fail_after(30):
        while len(client.servers()) < servers:
            await trio.sleep(0.2)
            await client.refresh()


async def timed(client, tokens: int) -> dict:
    """One greedy generation of ``tokens`` on ``client``: ids, first-token time, decode rate."""
    times: list[float] = []
    request = InferRequest(PROMPT, raw=True, max_tokens=tokens, sampling=Sampling())
    began = time.perf_counter()
    result = await client.generate(request, lambda t: times.append(time.perf_counter()))
    return {"ids": result.token_ids, "ttft": times[0] - began,
            "rate": (len(times) - 1) / (times[-1] - times[0])}


async def rounds(args, addr: str, dirs: list[Path], key: SigningKey, parts, registry,
                 petals: PetalsSwarm | None) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {"pnode warm": [], "pnode paid": [], "pnode cold": []}
    if petals:
        runs["Petals"] = []
    async with open_remote([addr], parts, registered=registry, config=CONFIG) as warm:
        await until_all(warm, len(registry))
        for r in range(args.repeats + 1):  # round 0 warms up, not counted
            got: dict[str, dict] = {}
            warm.payer = None
            got["pnode warm"] = await timed(warm, args.tokens)
            view = await trio.to_thread.run_sync(account, dirs[0], key)
            warm.payer = Payer(key, view["chain_id"], view["next_nonce"], view["height"], 5,
                               floor=5, balance=view["balance"])
            got["pnode paid"] = await timed(warm, args.tokens)
            async with open_remote([addr], parts, registered=registry, config=CONFIG) as cold:
                await until_all(cold, len(registry))
                got["pnode cold"] = await timed(cold, args.tokens)
            if petals:
                got["Petals"] = await trio.to_thread.run_sync(petals.generate, args.tokens)
            if r:
                for name, run in got.items():
                    runs[name].append(run)
    return runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--petals-python", help="Python of an environment with Petals 2.x.")
    p.add_argument("--petals-model", help="An HF checkpoint of SmolLM2-135M-Instruct.")
    p.add_argument("--servers", type=int, default=len(SPANS), help="pnode servers of the route")
    p.add_argument("--json", action="store_true")
    args = benchkit.parse_args(p, {"tokens": 3, "repeats": 1, "servers": 2})
    if bool(args.petals_python) != bool(args.petals_model):
        p.error("--petals-python and --petals-model go together")
    with_petals = petals_here(args)
    spans = benchkit.even_spans(args.servers)
    key = SigningKey(os.urandom(32))
    parts = load_client_parts()
    prompt_ids = parts.tokenizer.encode(PROMPT)
    with tempfile.TemporaryDirectory() as tmp:
        dirs = make_chain(Path(tmp), key, spans)
        procs, addrs = start_servers(dirs, spans)
        petals = None
        try:
            if with_petals:
                petals = PetalsSwarm(args.petals_python, args.petals_model, Path(tmp), prompt_ids)
            registry = registered_servers(dirs[0])
            runs = trio.run(rounds, args, addrs[0], dirs, key, parts, registry, petals)
        finally:
            if petals:
                petals.close()
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=20)
    report(args, runs, len(prompt_ids))


def petals_here(args) -> bool:
    """Whether the Petals rounds run: their Python was given and, in a smoke run, imports
    Petals (a smoke run goes on without an optional baseline; a full run fails on it)."""
    if not args.petals_python:
        benchkit.skipped("Petals", "no --petals-python given")
        return False
    if args.smoke and subprocess.run([args.petals_python, "-c", "import petals"],
                                     capture_output=True).returncode != 0:
        benchkit.skipped("Petals", f"{args.petals_python} cannot import petals")
        return False
    return True


def report(args, runs: dict[str, list[dict]], prompt_len: int) -> None:
    med = {name: {"ttft_ms": 1000 * statistics.median(x["ttft"] for x in v),
                  "rate": statistics.median(x["rate"] for x in v),
                  "ttfts_ms": [round(1000 * x["ttft"]) for x in v]} for name, v in runs.items()}
    reference = runs["pnode warm"][0]["ids"]
    same = {name: all(x["ids"] == reference for x in v) for name, v in runs.items()}
    base = med.get("Petals")
    doc = {"servers": args.servers, "tokens": args.tokens, "prompt_tokens": prompt_len,
           "repeats": args.repeats, "runs": med, "same_ids_as_pnode_warm": same,
           "ids": {name: v[0]["ids"] for name, v in runs.items()}}

    def table() -> None:
        print(f"{args.servers} servers on loopback, {prompt_len}-token prompt, {args.tokens} "
              f"greedy tokens, {args.repeats} alternated rounds (medians)")
        print(f"{'':14}{'first token ms':>16}{'decode tok/s':>14}"
              + (f"{'TTFT / Petals':>15}{'decode / Petals':>17}" if base else "") + "  same ids")
        for name, m in med.items():
            ratios = (f"{m['ttft_ms'] / base['ttft_ms']:15.2f}{m['rate'] / base['rate']:17.2f}"
                      if base else "")
            print(f"{name:14}{m['ttft_ms']:16.0f}{m['rate']:14.2f}{ratios}  {same[name]}")
    benchkit.report(args, doc, table)


if __name__ == "__main__":
    main()
