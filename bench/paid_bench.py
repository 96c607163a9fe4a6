"""Paid against free inference over a 3-server pushed route of `pnode start` processes.

One chain whose genesis registers --servers servers (default three: layers
0:10, 10:20, 20:30) and funds a client; each server is a `pnode start`
process asking 0 (so free sessions are served) and producing blocks every
300 ms. The client
(this process) alternates, --repeats times each, a free generation and a
paid one (`wallet.payer.Payer` with a floor bid of --bid base units per
position per layer to every server: one tab, a voucher on every step, a
`Settle` at the end, a closing claim per server). Measured side by side:

  1. decode tokens/s (after the first token) and time to first token (from
     `generate` to the first token: route opening, tab admission, prefill),
     medians, paid / free;
  2. settlement on chain per session: transactions (1 tab + 1 claim per
     server) and their encoded bytes;
  3. voucher bytes per decoded token against the hidden state's (raw
     float32: 576 x 4 bytes per position, each way, per hop);
  4. claim inclusion latency: blocks from the paid generation's last token
     (the chain's height then) to the block where the last claim landed (the
     client's balance reaches its final value).

Usage:  .venv/bin/python bench/paid_bench.py [--tokens 64] [--repeats 5] [--bid 5]
            [--servers 3] [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import os
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

share_cpus_politely(CLIENT_SPIN_COUNT)  # as `pwallet infer --peers` does, before torch

import trio  # noqa: E402

from compute.generate import Sampling  # noqa: E402
from ledger.codec import decode, encode  # noqa: E402
from ledger.crypto import SigningKey  # noqa: E402
from ledger.genesis import DEFAULT_PARAMS, chain_params, new_genesis, node_registration  # noqa: E402
from ledger.tab import Claim, Voucher  # noqa: E402
from ledger.types import COIN, ZERO_SIG, sign  # noqa: E402
from node.clock import now_ms  # noqa: E402
from node.control import control_call, control_request  # noqa: E402
from node.datadir import DataDir  # noqa: E402
from wallet.client import InferRequest  # noqa: E402
from wallet.payer import Payer  # noqa: E402
from wallet.registry import registry_from_view  # noqa: E402
from wallet.client.remote import ClientConfig, load_client_parts, open_remote  # noqa: E402

PROMPT = "The history of the Roman Empire"
SPANS = benchkit.even_spans(3)  # --servers 3: 0-10, 10-20, 20-30
PASS = "bench"
ENV = dict(os.environ, PYTHONUNBUFFERED="1", PNODE_PASSPHRASE=PASS)


def make_chain(root: Path, client: SigningKey, spans=SPANS) -> list[Path]:
    """A server data dir per span, on one genesis that registers them and funds ``client``."""
    keys = [tuple(SigningKey(os.urandom(32)) for _ in range(3)) for _ in spans]
    chain_id = f"bench-paid-{os.urandom(3).hex()}"
    regs = [node_registration(chain_id, w, n, p, span, 10 * COIN)
            for (w, n, p), span in zip(keys, spans)]
    params = chain_params(DEFAULT_PARAMS, keys[0][0].public, slot_ms=300)
    genesis = new_genesis(chain_id, now_ms(), params,
                          [(w.public, 10 * COIN) for w, _, _ in keys] + [(client.public,
                                                                         1000 * COIN)], regs)
    dirs = []
    for i, (wallet, node, peer) in enumerate(keys):
        dd = DataDir(root / f"s{i}")
        dd.initialise(genesis, node, peer, wallet.seed(), PASS)
        dirs.append(dd.path)
    return dirs


def start_servers(dirs: list[Path], spans=SPANS) -> tuple[list[subprocess.Popen], list[str]]:
    procs, addrs = [], []
    for d, span in zip(dirs, spans):
        peers = ["--peers", addrs[0]] if addrs else []
        log = open(d / "node.log", "w")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "node.cli", "start", "--data-dir", str(d),
             "--listen", "/ip4/127.0.0.1/tcp/0", "--layers",
             f"{span[0]}:{span[1]}", "--threads", "2", "--block-interval-ms", "300", *peers,
             "--log-file", ""],  # its output goes to node.log above
            cwd=_ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 120
        while not (d / "node.addr").exists() or not (d / "node.addr").read_text().strip():
            if procs[-1].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server {d} did not start: see {d / 'node.log'}")
            time.sleep(0.1)
        addrs.append((d / "node.addr").read_text().strip())
    return procs, addrs


def account(d: Path, key: SigningKey) -> dict:
    return control_call(d, "account", address=key.public.hex())


def registered_servers(d: Path) -> dict:
    """The registered servers, from the node running on ``d`` (its ``view`` op)."""
    return registry_from_view(control_call(d, "view", name="registry")["view"])


async def one(addr: str, parts, registry, tokens: int, payer: Payer | None,
              watch: tuple[Path, SigningKey] | None = None) -> dict:
    """One generation; with ``watch`` (a server's data dir, the client's key) the chain
    height when its last token came (before the client settles) is kept too."""
    request = InferRequest(PROMPT, raw=True, max_tokens=tokens, sampling=Sampling())
    times: list[float] = []
    heights: list[int] = []
    last = trio.Event()

    def on_token(token) -> None:
        times.append(time.perf_counter())
        if len(times) == tokens:
            last.set()

    async def height_at_last_token() -> None:
        await last.wait()  # runs at the client's next checkpoint: before its claims land
        d, key = watch
        heights.append((await control_request(d, "account", address=key.public.hex()))["height"])
    async with open_remote([addr], parts, registered=registry, payer=payer,
                           config=ClientConfig(push=True, spot_check_rate=0.0)) as client:
        with trio.fail_after(30):
            while len(client.servers()) < len(registry):
                await trio.sleep(0.2)
                await client.refresh()
        began = time.perf_counter()
        async with trio.open_nursery() as nursery:
            if watch:
                nursery.start_soon(height_at_last_token)
            result = await client.generate(request, on_token)
    return {"ids": result.token_ids, "ttft": times[0] - began, "height": heights,
            "rate": (len(times) - 1) / (times[-1] - times[0]), "result": result}


def settle_latency(d: Path, client: SigningKey, balance: int, spent: int, start: int) -> int:
    """Blocks from ``start`` until the client's balance is ``balance - spent`` (every
    claim in, every lane's rest back)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        view = account(d, client)
        if view["balance"] == balance - spent:
            return view["height"] - start
        time.sleep(0.05)
    raise RuntimeError("the claims did not land within 60 s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--bid", type=int, default=5)
    p.add_argument("--servers", type=int, default=len(SPANS), help="servers of the route")
    p.add_argument("--json", action="store_true")
    args = benchkit.parse_args(p, {"tokens": 3, "repeats": 1, "servers": 2})
    spans = benchkit.even_spans(args.servers)
    client = SigningKey(os.urandom(32))
    parts = load_client_parts()
    with tempfile.TemporaryDirectory() as tmp:
        dirs = make_chain(Path(tmp), client, spans)
        procs, addrs = start_servers(dirs, spans)
        try:
            registered = registered_servers(dirs[0])
            runs = {"free": [], "paid": []}
            latencies, settlement = [], []
            for r in range(args.repeats + 1):  # the first round warms up, not counted
                free = trio.run(one, addrs[0], parts, registered, args.tokens, None)
                view = account(dirs[0], client)
                payer = Payer(client, view["chain_id"], view["next_nonce"], view["height"],
                              args.bid, floor=args.bid, balance=view["balance"])
                paid = trio.run(one, addrs[0], parts, registered, args.tokens, payer,
                                (dirs[0], client))
                assert paid["ids"] == free["ids"], "paid output differs from free"
                spent = sum(x["amount"] for x in paid["result"].payments)
                assert all(x["amount"] == x["server_counted"] for x in paid["result"].payments)
                latencies.append(settle_latency(dirs[0], client, view["balance"], spent,
                                                paid["height"][0]))
                tab = payer.tabs[0]
                # A claim's size: a server's node key and signature are as long as these.
                claim = encode(sign(Claim(tab.tab.chain_id, client.public,
                                          decode(tab.voucher(), Voucher), True, ZERO_SIG),
                                    client))
                settlement.append((1 + len(tab.tab.lanes),
                                   len(encode(tab.tab)) + len(tab.tab.lanes) * len(claim),
                                   len(tab.voucher())))
                if r:
                    runs["free"].append(free)
                    runs["paid"].append(paid)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=20)
    report(args, runs, latencies[1:], settlement[1:])


def report(args, runs: dict, latencies: list[int], settlement: list[tuple]) -> None:
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("rate", "ttft")}
           for k, v in runs.items()}
    txs, settle_bytes, voucher = settlement[0]
    hidden = 576 * 4  # raw float32 per position, one way, one hop
    doc = {"servers": args.servers, "tokens": args.tokens, "repeats": args.repeats,
           "bid": args.bid, "free": med["free"], "paid": med["paid"],
           "paid_over_free_rate": med["paid"]["rate"] / med["free"]["rate"],
           "ttft_paid_minus_free_ms": 1000 * (med["paid"]["ttft"] - med["free"]["ttft"]),
           "settlement_txs": txs, "settlement_bytes": settle_bytes,
           "voucher_bytes_per_token": voucher, "hidden_bytes_per_token_per_hop_way": hidden,
           "claim_inclusion_blocks": {"median": statistics.median(latencies),
                                      "max": max(latencies)},
           "rates": {k: [round(x["rate"], 2) for x in v] for k, v in runs.items()},
           "ttfts_ms": {k: [round(1000 * x["ttft"]) for x in v] for k, v in runs.items()}}
    benchkit.report(args, doc, lambda: print_table(args, doc))


def print_table(args, doc: dict) -> None:
    med = {k: doc[k] for k in ("free", "paid")}
    txs, settle_bytes = doc["settlement_txs"], doc["settlement_bytes"]
    voucher, hidden = doc["voucher_bytes_per_token"], doc["hidden_bytes_per_token_per_hop_way"]
    print(f"{args.servers}-server pushed route, {args.tokens} greedy tokens, {args.repeats} "
          f"alternated repeats, bid {args.bid} base units/position/layer")
    print(f"{'':22}{'free':>12}{'paid':>12}{'paid/free':>12}")
    print(f"{'decode tokens/s':22}{med['free']['rate']:12.2f}{med['paid']['rate']:12.2f}"
          f"{doc['paid_over_free_rate']:12.3f}")
    print(f"{'first token (ms)':22}{1000 * med['free']['ttft']:12.0f}"
          f"{1000 * med['paid']['ttft']:12.0f}{doc['ttft_paid_minus_free_ms']:+11.0f} ms")
    print(f"settlement per session: {txs} txs, {settle_bytes} bytes on chain")
    print(f"voucher per token: {voucher} bytes (hidden state: {hidden} bytes per position, "
          f"each way, each hop: {voucher / hidden:.3f}x)")
    print(f"claim inclusion: median {doc['claim_inclusion_blocks']['median']} blocks, "
          f"max {doc['claim_inclusion_blocks']['max']}")


if __name__ == "__main__":
    main()
