"""`make demo`: a guided run of what pnode does today, with the real CLIs.

Starts a fresh private chain in the demo directory, makes a second wallet,
sends it coins, seals the transfers into signed blocks, shows balances,
history and a block, and re-verifies the whole chain from genesis. Then the
main job: a local swarm on loopback, three `pnode start` processes each
serving a third of SmolLM2's layers (the first also producing blocks), a
transfer through the running node, the other two servers registering
themselves once their wallets are funded, and `pwallet infer --peers`
generating over the three servers (the same text as the local run; the
client routes only through servers registered on the chain it follows,
Alice's), paid by Bob (the servers ask 5, 6 and 7 base units per position
per layer: one tab, a voucher a step, each server's claim), with the
balances before and after and, once the swarm stops, a server's claim
proven in its block (`pnode proof`, `pnode verify proof`); then a short
training run of the default job, and the same job mined by a three-node
devnet (`pnode devnet`), where a tenth of the units are re-executed by
another node (Proof of Learning): a node's coins are its accepted units
plus a fee per verdict it signed. Each step runs the installed `pnode` /
`pwallet` commands exactly as a user would.

Usage:  python -m node.cli.demo [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

console = Console()
BIN = Path(sys.executable).parent
#: What the three servers ask: base units (1e-6 coin) per position per layer.
PRICES = (5, 6, 7)


def step(title: str, *argv: str, capture_json: bool = False, quiet: bool = False) -> dict | None:
    """Print and run one CLI command; stop the demo if it fails."""
    console.rule(f"[bold]{title}")
    console.print(f"[cyan]$ {' '.join(argv)}")
    exe = BIN / argv[0]
    result = subprocess.run([str(exe) if exe.exists() else argv[0], *argv[1:]],
                            capture_output=True, text=True)
    if not quiet:
        console.print(result.stdout.rstrip(), highlight=False, markup=False)
    if result.returncode != 0:
        console.print(f"[red]{result.stderr.strip()}")
        sys.exit(result.returncode)
    return json.loads(result.stdout) if capture_json else None


def start_swarm(root: Path, alice: str) -> list[subprocess.Popen]:
    """Alice's node (producing, layers 0-9) and two more joining her chain (10-19, 20-29)."""
    console.rule("[bold]A local swarm on loopback: three `pnode start` processes")
    procs: list[subprocess.Popen] = []
    spans = ["0:10", "10:20", "20:30"]
    for i, (span, price) in enumerate(zip(spans, PRICES)):
        data = alice if i == 0 else str(root / f"server{i}")
        if i:
            step("", "pnode", "init", "--data-dir", data, "--genesis", f"{alice}/genesis.json")
        peers = ["--peers", (Path(alice) / "node.addr").read_text().strip()] if i else []
        argv = [str(BIN / "pnode"), "start", "--data-dir", data, "--layers", span,
                "--price", str(price), *peers]
        console.print(f"[cyan]$ pnode start --data-dir {data} --layers {span} --price {price} "
                      f"{'--peers <alice>' if i else ''} &")
        log = open(root / f"node{i}.log", "w")
        procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
        wait_for_addr(Path(data), procs[-1], root / f"node{i}.log")
    time.sleep(2)  # a couple of announcement rounds
    for i in range(len(spans)):
        console.print((root / f"node{i}.log").read_text().rstrip(), highlight=False,
                      markup=False)
    return procs


def wait_for_addr(data: Path, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 120
    while not (data / "node.addr").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            console.print(f"[red]node on {data} did not start:\n{log.read_text()}")
            sys.exit(1)
        time.sleep(0.1)


def wait_registered(data: Path, log: Path, limit: float = 60) -> None:
    """Wait until the node on ``data`` is registered on the chain; stop the demo if it never is."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        result = subprocess.run([str(BIN / "pnode"), "status", "--data-dir", str(data), "--json"],
                                capture_output=True, text=True)
        if result.returncode == 0 and json.loads(result.stdout).get("registered"):
            return
        time.sleep(0.5)
    console.print(f"[red]node on {data} did not register within {limit:.0f} s:\n"
                  f"{log.read_text()}")
    sys.exit(1)


def paid_question(root: Path, alice: str, addr: str) -> str | None:
    """Bob pays the three servers for an answer; balances before and after, cost per hop.

    Returns:
        The id of one server's claim (its inclusion proof comes once the nodes stop).
    """
    wallets = [step("", "pwallet", "balance", "--data-dir", d, "--json", capture_json=True,
                    quiet=True)["address"] for d in (alice, str(root / "server1"),
                                                     str(root / "server2"))]
    before = balances(alice, ["--wallet", "bob"], wallets)
    # --data-dir alice: the client routes only through the servers registered on the
    # chain that node follows (all three now); --max-price: it pays up to 10 base units
    # per position per layer, from Bob's wallet, through one tab.
    step("The same question over the swarm, paid by Bob: layers 0-9, 10-19, 20-29 on three "
         "servers asking 5, 6 and 7 base units per position per layer",
         "pwallet", "infer", "What is the capital of France?", "--peers", addr,
         "--data-dir", alice, "--wallet", "bob", "--max-price", "10", "--greedy",
         "--max-tokens", "24")
    doc = step("... again with --json: the route, the cost per hop, the tab and the claims",
               "pwallet", "infer", "What is the capital of France?", "--peers", addr,
               "--data-dir", alice, "--wallet", "bob", "--max-price", "10", "--greedy",
               "--max-tokens", "24", "--json", capture_json=True, quiet=True)
    for hop in doc["cost"]:
        console.print(f"  {hop['peer_id'][:20]}..  {hop['layers']} layers x {hop['positions']} "
                      f"positions x bid {hop['bid']} = {hop['amount']} base units  claim "
                      f"{(hop['claim'] or 'pending')[:16]}")
    time.sleep(3)  # the claims land in the next blocks
    after = balances(alice, ["--wallet", "bob"], wallets)
    console.rule("[bold]Balances before and after the two paid answers (coins)")
    for name, b, a in zip(("bob", "alice (0-9)", "server 1 (10-19)", "server 2 (20-29)"),
                          before, after):
        console.print(f"  {name:18} {b:>14}  ->  {a:>14}")
    return next((c for c in doc["claims"]), None)


def prove_claim(alice: str, claim: str | None, root: Path) -> None:
    """`pnode proof` of a server's claim, written to a file, then `pnode verify proof`."""
    if claim is None:
        return
    console.rule("[bold]The claim that paid a server, proven in its block (Merkle path + header)")
    console.print(f"[cyan]$ pnode proof {claim[:16]}.. --data-dir {alice} > claim.proof")
    result = subprocess.run([str(BIN / "pnode"), "proof", claim, "--data-dir", alice],
                            capture_output=True, text=True)
    if result.returncode != 0:
        console.print(f"[red]{result.stderr.strip()}")
        sys.exit(result.returncode)
    (root / "claim.proof").write_text(result.stdout)
    step("", "pnode", "verify", "proof", str(root / "claim.proof"), "--data-dir", alice)


def balances(alice: str, bob: list[str], wallets: list[str]) -> list[str]:
    docs = [step("", "pwallet", "balance", "--data-dir", alice, *bob, "--json",
                 capture_json=True, quiet=True)]
    docs += [step("", "pwallet", "balance", w, "--data-dir", alice, "--json", capture_json=True,
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
    nodes = start_swarm(root, alice)
    claim = None
    try:
        step("A running node's live status: peers, what it serves, the swarm it sees",
             "pnode", "status", "--data-dir", alice)
        step("A transfer through the running node, which gossips it and seals it",
             "pwallet", "send", bob, "1", "--data-dir", alice)
        for i in (1, 2):
            server = str(root / f"server{i}")
            address = step("", "pwallet", "balance", "--data-dir", server, "--json",
                           capture_json=True, quiet=True)["address"]
            step(f"Fund server {i}'s wallet: the node registers itself once it can pay the bond",
                 "pwallet", "send", address, "12", "--data-dir", alice)
        for i in (1, 2):
            wait_registered(root / f"server{i}", root / f"node{i}.log")
            for line in (root / f"node{i}.log").read_text().splitlines():
                if "regist" in line:
                    console.print(f"  server {i}: {line}", highlight=False, markup=False)
        step("", "pwallet", "balance", bob, "--data-dir", alice)
        addr = (Path(alice) / "node.addr").read_text().strip()
        claim = paid_question(root, alice, addr)
    finally:
        stop_swarm(nodes)
    prove_claim(alice, claim, root)
    step("The default training job, locally: the loss falls", "pnode", "train",
         "--steps", "60")
    step("Mining: three nodes train that job, audit a tenth of each other's units, earn coins",
         "pnode", "devnet", "--nodes", "3", "--steps", "20", "--data-dir",
         str(root / "devnet"))
    step("Each miner's chain re-validates: every receipt's assignment, the supply",
         "pnode", "verify", "chain", "--data-dir", str(root / "devnet" / "node2"))
    console.rule("[bold green]demo done")
    console.print(f"The chain is in {root}. Try: pnode --help, pwallet --help")


if __name__ == "__main__":
    main()
