"""`make demo`: a guided run of what pnode does today, with the real CLIs.

Starts a fresh private chain in the demo directory, makes a second wallet,
sends it coins, seals the transfers into signed blocks, shows balances,
history and a block, re-verifies the whole chain from genesis and runs
SmolLM2 locally. Then a short training run of the default job, and the
same job mined by a three-node devnet (`pnode devnet`), where a tenth of the
units are re-executed by another node (Proof of Learning): a node's coins
are its accepted units plus a fee per verdict it signed. Then the main job:
the three miners, restarted as `pnode start` servers of SmolLM2's layers
0-9, 10-19 and 20-29 asking 5, 6 and 7 base units per position per layer, a
local swarm on loopback; miner 0 sends Bob 2 of the coins it mined, and Bob
pays the three servers for an answer (`pwallet infer --peers --wallet bob
--max-price 10`: one tab, a voucher a step, each server's claim), with the
balances before and after and, once the swarm stops, a server's claim
proven in its block (`pnode proof`, `pnode verify proof`). Each step runs
the installed `pnode` / `pwallet` commands exactly as a user would.

Usage:  python -m node.cli.demo [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

console = Console(soft_wrap=True)  # commands and hashes stay on one line when piped
BIN = Path(sys.executable).parent
#: What the three servers ask: base units (1e-6 coin) per position per layer.
PRICES = (5, 6, 7)


def step(title: str, *argv: str, capture_json: bool = False, quiet: bool = False) -> dict | None:
    """Print and run one CLI command; stop the demo if it fails.

    ``quiet``: a lookup behind the story (a balance for a table): neither the
    command nor its output is printed.
    """
    if not quiet:
        console.rule(f"[bold]{title}")
        console.print(f"$ {shlex.join(argv)}", style="cyan", highlight=False, markup=False)
    exe = BIN / argv[0]
    result = subprocess.run([str(exe) if exe.exists() else argv[0], *argv[1:]],
                            capture_output=True, text=True)
    if not quiet:
        console.print(result.stdout.rstrip(), highlight=False, markup=False)
    if result.returncode != 0:
        console.print(f"[red]{result.stderr.strip()}")
        sys.exit(result.returncode)
    return json.loads(result.stdout) if capture_json else None


def start_swarm(root: Path, miners: list[str]) -> list[subprocess.Popen]:
    """The devnet's three miners, restarted as servers of SmolLM2's layers 0-9, 10-19, 20-29."""
    console.rule("[bold]The three miners serve SmolLM2 on loopback, each asking a price")
    procs: list[subprocess.Popen] = []
    spans = ["0:10", "10:20", "20:30"]
    for i, (data, span, price) in enumerate(zip(miners, spans, PRICES)):
        # Miner 0 listens on the default port (4411); the others, on one machine, on any.
        peers = ["--listen", "/ip4/127.0.0.1/tcp/0", "--peers",
                 (Path(miners[0]) / "node.addr").read_text().strip()] if i else []
        argv = [str(BIN / "pnode"), "start", "--data-dir", data, "--layers", span,
                "--price", str(price), "--no-mine", *peers]
        dial = (f' --listen /ip4/127.0.0.1/tcp/0 --peers "$(cat {miners[0]}/node.addr)"'
                if i else "")
        console.print(f"[cyan]$ pnode start --data-dir {data} --layers {span} --price {price} "
                      f"--no-mine{dial} &", highlight=False)
        log = open(root / f"server{i}.log", "w")
        procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
        wait_for_addr(Path(data), procs[-1], root / f"server{i}.log")
    time.sleep(2)  # a couple of announcement rounds
    for i in range(len(spans)):
        console.print(f"[bold]server {i}:")
        lines = (root / f"server{i}.log").read_text().splitlines()
        produced = [line for line in lines if line.startswith("produced block")]
        for line in lines:
            if line not in produced:
                console.print(f"  {line}", highlight=False, markup=False)
        console.print(f"  ({len(produced)} blocks produced so far)")
    return procs


def wait_for_addr(data: Path, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 120
    while not (data / "node.addr").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            console.print(f"[red]node on {data} did not start:\n{log.read_text()}")
            sys.exit(1)
        time.sleep(0.1)


def wait_funded(data: str, wallet: list[str], limit: float = 60) -> None:
    """Wait until the wallet's balance on the chain is above zero (its transfer sealed)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        result = subprocess.run([str(BIN / "pwallet"), "balance", "--data-dir", data, *wallet,
                                 "--json"], capture_output=True, text=True)
        if result.returncode == 0 and json.loads(result.stdout)["balance"] > 0:
            return
        time.sleep(0.5)
    console.print(f"[red]the transfer to {' '.join(wallet)} was not sealed within {limit:.0f} s")
    sys.exit(1)


def paid_question(miners: list[str], addr: str) -> str | None:
    """Bob pays the three miners, with coins they mined, for an answer; cost per hop.

    Returns:
        The id of one server's claim (its inclusion proof comes once the nodes stop).
    """
    node0 = miners[0]
    wallets = [step("", "pwallet", "balance", "--data-dir", d, "--json", capture_json=True,
                    quiet=True)["address"] for d in miners]
    before = balances(node0, ["--wallet", "bob"], wallets)
    # --data-dir node0: the client routes only through the servers registered on the
    # chain that node follows (the three miners, at genesis); --max-price: it pays up to
    # 10 base units per position per layer, from Bob's wallet, through one tab.
    step("Bob asks the swarm, paying: layers 0-9, 10-19, 20-29 on three servers asking 5, 6 "
         "and 7 base units per position per layer",
         "pwallet", "infer", "What is the capital of France?", "--peers", addr,
         "--data-dir", node0, "--wallet", "bob", "--max-price", "10", "--greedy",
         "--max-tokens", "24")
    doc = step("... again with --json: the route, the cost per hop, the tab and the claims",
               "pwallet", "infer", "What is the capital of France?", "--peers", addr,
               "--data-dir", node0, "--wallet", "bob", "--max-price", "10", "--greedy",
               "--max-tokens", "24", "--json", capture_json=True, quiet=True)
    console.print("The cost per hop, from an identical second run with --json:")
    for hop in doc["cost"]:
        console.print(f"  {hop['peer_id'][:20]}..  {hop['layers']} layers x {hop['positions']} "
                      f"positions x bid {hop['bid']} = {hop['amount']} base units  claim "
                      f"{(hop['claim'] or 'pending')[:16]}")
    time.sleep(3)  # the claims land in the next blocks
    after = balances(node0, ["--wallet", "bob"], wallets)
    console.rule("[bold]Balances before and after the two paid answers (coins)")
    for name, b, a in zip(("bob", "miner 0 (0-9)", "miner 1 (10-19)", "miner 2 (20-29)"),
                          before, after):
        console.print(f"  {name:18} {b:>14}  ->  {a:>14}")
    return next((c for c in doc["claims"]), None)


def prove_claim(data: str, claim: str | None, root: Path) -> None:
    """`pnode proof` of a server's claim, written to a file, then `pnode verify proof`."""
    if claim is None:
        return
    console.rule("[bold]The claim that paid a server, proven in its block (Merkle path + header)")
    console.print(f"[cyan]$ pnode proof {claim} --data-dir {data} > claim.proof",
                  highlight=False)
    result = subprocess.run([str(BIN / "pnode"), "proof", claim, "--data-dir", data],
                            capture_output=True, text=True)
    if result.returncode != 0:
        console.print(f"[red]{result.stderr.strip()}")
        sys.exit(result.returncode)
    (root / "claim.proof").write_text(result.stdout)
    step("", "pnode", "verify", "proof", str(root / "claim.proof"), "--data-dir", data)


def balances(data: str, bob: list[str], wallets: list[str]) -> list[str]:
    docs = [step("", "pwallet", "balance", "--data-dir", data, *bob, "--json",
                 capture_json=True, quiet=True)]
    docs += [step("", "pwallet", "balance", w, "--data-dir", data, "--json", capture_json=True,
                  quiet=True) for w in wallets]
    return [f"{d['balance'] / 1e6:.6f}" for d in docs]


def stop_swarm(procs: list[subprocess.Popen]) -> None:
    console.rule("[bold]Stopping the swarm (SIGTERM: each node stops cleanly)")
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="out/demo", help="Where the demo chain lives.")
    args = parser.parse_args()
    root = Path(args.data_dir)
    if root.exists():
        shutil.rmtree(root)  # a fresh chain every run
    os.environ.setdefault("PNODE_PASSPHRASE", "demo passphrase")
    alice = str(root / "alice")

    info = step("A new private chain: keys, genesis, chain store", "pnode", "init",
                "--data-dir", alice, "--chain-id", "pnode-demo", "--slot-ms", "200", "--json",
                capture_json=True)
    bob = step("A second wallet, encrypted with a passphrase", "pwallet", "create",
               "--data-dir", alice, "--name", "bob", "--json", capture_json=True)["address"]
    step("Signed transfers, checked against the chain and queued", "pwallet", "send", bob,
         "12.5", "--data-dir", alice)
    step("", "pwallet", "send", bob, "0.75", "--data-dir", alice)
    step("Node status: tip, balance, bond, queued transactions", "pnode", "status",
         "--data-dir", alice)
    console.rule("[bold]An overspend is refused with the rule it breaks")
    overspend = subprocess.run([str(BIN / "pwallet"), "send", bob, "5000", "--data-dir", alice],
                               capture_output=True, text=True)
    console.print(f"[yellow]$ pwallet send {bob[:12]}.. 5000  ->  exit {overspend.returncode}: "
                  f"{overspend.stderr.strip()}", highlight=False)
    step("The node seals the mempool into signed blocks", "pnode", "produce",
         "--data-dir", alice, "--blocks", "2")
    step("Balances", "pwallet", "balance", bob, "--data-dir", alice)
    step("", "pwallet", "balance", info["address"], "--data-dir", alice)
    step("History of the node's wallet", "pwallet", "history", "--data-dir", alice)
    step("Block 1: header with txs, log and state roots", "pnode", "ledger", "show", "1",
         "--data-dir", alice)
    step("Re-validate everything from genesis (signatures, producers, roots, supply)",
         "pnode", "verify", "chain", "--data-dir", alice)
    step("SmolLM2-135M-Instruct, run locally from its GGUF (streams tokens)", "pwallet",
         "infer", "What is the capital of France?", "--local", "--greedy", "--max-tokens", "24")
    step("The default training job, locally: the loss falls", "pnode", "train",
         "--steps", "60")
    devnet = root / "devnet"
    step("Mining: three nodes train that job, audit a tenth of each other's units, earn coins",
         "pnode", "devnet", "--nodes", "3", "--steps", "20", "--data-dir", str(devnet))
    miners = [str(devnet / f"node{i}") for i in range(3)]
    step("Each miner's chain re-validates: every receipt's assignment, the supply",
         "pnode", "verify", "chain", "--data-dir", miners[2])
    bob_mined = step("Spending mined coins: a wallet for Bob on the miners' chain", "pwallet",
                 "create", "--data-dir", miners[0], "--name", "bob", "--json",
                 capture_json=True)["address"]
    nodes = start_swarm(root, miners)
    claim = None
    try:
        step("A running miner's live status: peers, what it serves, the swarm it sees",
             "pnode", "status", "--data-dir", miners[0])
        step("Miner 0 sends Bob 2 of the coins it mined, through its running node",
             "pwallet", "send", bob_mined, "2", "--data-dir", miners[0])
        wait_funded(miners[0], ["--wallet", "bob"])
        step("Bob's balance, once the transfer is sealed", "pwallet", "balance",
             "--data-dir", miners[0], "--wallet", "bob")
        addr = (Path(miners[0]) / "node.addr").read_text().strip()
        claim = paid_question(miners, addr)
    finally:
        stop_swarm(nodes)
    prove_claim(miners[0], claim, root)
    console.rule("[bold green]demo done")
    console.print(f"The chain is in {root}. Try: pnode --help, pwallet --help")


if __name__ == "__main__":
    main()
