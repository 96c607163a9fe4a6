"""`make demo`: what pnode is for, with the real CLIs, on a fresh chain on loopback.

1. `pnode init` makes a new chain, whose genesis carries its own training
   job (the built-in default job), and `pnode start` runs its first node:
   it mines that job from block 1 (one coin per accepted unit) and serves
   SmolLM2-135M's layers 0-9, asking 5 base units per position per layer.
2. Two more nodes join the chain (`pnode init --genesis`), are funded by
   node 0 (`pwallet send --wait`: the transfer's block and inclusion
   proof), and serve layers 10-19 and 20-29 asking 6 and 7; each registers
   itself once its coins arrive.
3. Bob gets 2 coins and pays the three servers for an answer (`pwallet
   infer --max-price 10`: one tab, a voucher a step, each server's claim),
   with the cost per hop and the balances before and after.
4. While the nodes run, every read goes through node 0's control socket:
   the job's progress, the mining rewards in its history, a receipt's and
   a claim's inclusion proofs, checked with `pnode verify proof`. The job's
   model is exported as trained so far (`pnode job export`) and run here.
5. The nodes stop; the last node's copy of the chain re-validates from
   genesis (`pnode verify chain`).

Each step runs the installed `pnode` / `pwallet` commands exactly as a user
would, and prints them so they can be pasted.

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
SPANS = ("0:10", "10:20", "20:30")
ANY_PORT = "/ip4/127.0.0.1/tcp/0"


def heading(title: str) -> None:
    """A section's title, whole (a rule would cut a long one at the terminal's width)."""
    if title:
        console.print(f"\n[bold]## {title}", highlight=False)


def step(title: str, *argv: str, capture_json: bool = False, quiet: bool = False) -> dict | None:
    """Print and run one CLI command; stop the demo if it fails.

    ``quiet``: a lookup behind the story (a balance for a table): neither the
    command nor its output is printed.
    """
    if not quiet:
        heading(title)
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


def start_node(root: Path, data: str, i: int, peer: str | None) -> subprocess.Popen:
    """`pnode start` for node ``i``: serving its span at its price, in the background."""
    args = ["pnode", "start", "--data-dir", data, "--layers", SPANS[i], "--price",
            str(PRICES[i])]
    shown = shlex.join(args)
    if peer is not None:  # one machine: the first node has the default port, 4411
        args += ["--listen", ANY_PORT, "--peers", peer]
        first = shlex.quote(str(Path(data).parent / "node0" / "node.addr"))
        shown += f' --listen {ANY_PORT} --peers "$(cat {first})"'
    console.print(f"$ {shown} &", style="cyan", highlight=False, markup=False)
    log = open(root / f"node{i}.out", "w")
    proc = subprocess.Popen([str(BIN / "pnode"), *args[1:]], stdout=log, stderr=subprocess.STDOUT)
    wait_for_addr(Path(data), proc, root / f"node{i}.out")
    return proc


def show_output(root: Path, i: int, lines: int = 8) -> None:
    """The first lines node ``i`` printed."""
    for line in (root / f"node{i}.out").read_text().splitlines()[:lines]:
        console.print(f"  {line}", highlight=False, markup=False)


def wait_until(what: str, check, limit: float = 90) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    console.print(f"[red]{what} did not happen within {limit:.0f} s")
    sys.exit(1)


def cli_json(*argv: str) -> dict:
    """A command's --json answer, or {} when it failed (for the waits)."""
    result = subprocess.run([str(BIN / argv[0]), *argv[1:], "--json"], capture_output=True,
                            text=True)
    return json.loads(result.stdout) if result.returncode == 0 else {}


def wait_for_addr(data: Path, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 120
    while not (data / "node.addr").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            console.print(f"[red]node on {data} did not start:\n{log.read_text()}")
            sys.exit(1)
        time.sleep(0.1)


def paid_question(nodes: list[str], addr: str) -> str | None:
    """Bob pays the three servers for an answer; the cost per hop, the balances.

    Returns:
        The id of one server's claim.
    """
    node0 = nodes[0]
    wallets = [step("", "pwallet", "balance", "--data-dir", d, "--json", capture_json=True,
                    quiet=True)["address"] for d in nodes]
    before = balances(node0, ["--wallet", "bob"], wallets)
    # --data-dir node0: the client routes only through the servers registered on the
    # chain that node follows (the three nodes); --max-price: it pays up to
    # 10 base units per position per layer, from Bob's wallet, through one tab.
    step("Bob asks the swarm, paying: layers 0-9, 10-19, 20-29 on three servers asking 5, 6 "
         "and 7 base units per position per layer",
         "pwallet", "infer", "What is the capital of France?", "--peers", addr,
         "--data-dir", node0, "--wallet", "bob", "--max-price", "10", "--greedy",
         "--max-tokens", "24")
    mid = balance_units(node0, ["--wallet", "bob"], wallets)
    doc = step("... again with --json: the route, the cost per hop, the tab and the claims",
               "pwallet", "infer", "What is the capital of France?", "--peers", addr,
               "--data-dir", node0, "--wallet", "bob", "--max-price", "10", "--greedy",
               "--max-tokens", "24", "--json", capture_json=True, quiet=True)
    console.print("The cost per hop, from an identical second run with --json:")
    for hop in doc["cost"]:
        console.print(f"  {hop['peer_id'][:20]}..  {hop['layers']} layers x {hop['positions']} "
                      f"positions x bid {hop['bid']} = {hop['amount_units']} base units  claim "
                      f"{(hop['claim'] or 'pending')[:16]}")
    # The story holds only if every server was paid what it ran: its claim landed (an
    # unclaimed tab would give Bob his coins back and the demo would say so and fail).
    owed = sum(hop["amount_units"] for hop in doc["cost"])
    if len(doc["cost"]) != 3 or owed == 0:
        console.print(f"[red]the paid answer paid {len(doc['cost'])} servers {owed} base units")
        sys.exit(1)
    wait_until("every server paid for the second answer, and Bob charged", lambda: all(
        now >= was + hop for now, was, hop in zip(
            balance_units(node0, ["--wallet", "bob"], wallets)[1:], mid[1:],
            [h["amount_units"] for h in doc["cost"]])) and
        balance_units(node0, ["--wallet", "bob"], wallets)[0] <= mid[0] - owed, limit=60)
    after = balances(node0, ["--wallet", "bob"], wallets)
    heading("Balances before and after the two paid answers (coins)")
    for name, b, a in zip(("bob", "node 0 (0-9)", "node 1 (10-19)", "node 2 (20-29)"),
                          before, after):
        console.print(f"  {name:18} {b:>14}  ->  {a:>14}")
    return next((c for c in doc["claims"]), None)


def prove(root: Path, data: str, txid: str, name: str, title: str) -> None:
    """`pnode proof` of ``txid``, written to a file, then `pnode verify proof` of it."""
    heading(f"{title}")
    console.print(f"$ pnode proof {txid} --data-dir {data} > {root / name}.proof", style="cyan",
                  highlight=False, markup=False)
    deadline = time.monotonic() + 30  # a claim lands a block or two after the answer
    while True:
        result = subprocess.run([str(BIN / "pnode"), "proof", txid, "--data-dir", data],
                                capture_output=True, text=True)
        if result.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if result.returncode != 0:
        console.print(f"[red]{result.stderr.strip()}")
        sys.exit(result.returncode)
    (root / f"{name}.proof").write_text(result.stdout)
    step("", "pnode", "verify", "proof", str(root / f"{name}.proof"), "--data-dir", data)


def balance_units(data: str, bob: list[str], wallets: list[str]) -> list[int]:
    """Bob's balance, then each wallet's, in base units."""
    docs = [step("", "pwallet", "balance", "--data-dir", data, *bob, "--json",
                 capture_json=True, quiet=True)]
    docs += [step("", "pwallet", "balance", w, "--data-dir", data, "--json", capture_json=True,
                  quiet=True) for w in wallets]
    return [d["balance_units"] for d in docs]


def balances(data: str, bob: list[str], wallets: list[str]) -> list[str]:
    return [f"{units / 1e6:.6f}" for units in balance_units(data, bob, wallets)]


def stop_swarm(procs: list[subprocess.Popen]) -> None:
    heading("Stopping the swarm (SIGTERM: each node stops cleanly)")
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
    root.mkdir(parents=True)
    os.environ.setdefault("PNODE_PASSPHRASE", "demo passphrase")
    nodes = [str(root / f"node{i}") for i in range(3)]
    procs: list[subprocess.Popen] = []
    try:
        story(root, nodes, procs)
    finally:
        stop_swarm(procs)
    step("The last node's copy of the chain re-validates from genesis: every signature, "
         "assignment, receipt, reward and the supply", "pnode", "verify", "chain",
         "--data-dir", nodes[2])
    console.rule("[bold green]demo done")
    console.print(f"The chain is in {root}. Try: pnode --help, pwallet --help, pnode job --help")


def story(root: Path, nodes: list[str], procs: list[subprocess.Popen]) -> str | None:
    """Parts 1-4 of the module docstring; returns a server's claim id."""
    step("A new chain: keys, genesis with its own training job, chain store", "pnode",
         "init", "--data-dir", nodes[0], "--chain-id", "pnode-demo", "--slot-ms", "300",
         "--layers", SPANS[0])
    job = cli_json("pnode", "job", "list", "--data-dir", nodes[0])["jobs"][0]["id"]
    heading("Node 0 starts: it mines the chain's job from block 1 and serves "
                 "SmolLM2's layers 0-9")
    procs.append(start_node(root, nodes[0], 0, None))
    wait_until("the first training steps", lambda: cli_json(
        "pnode", "job", "show", job, "--data-dir", nodes[0]).get("step", 0) >= 3)
    show_output(root, 0)
    peer = (Path(nodes[0]) / "node.addr").read_text().strip()
    step("The job's progress, asked of the running node", "pnode", "job", "status", job[:16],
         "--data-dir", nodes[0])
    for i in (1, 2):
        step(f"Node {i} joins the chain", "pnode", "init", "--data-dir", nodes[i],
             "--genesis", str(Path(nodes[0]) / "genesis.json"))
        address = cli_json("pwallet", "balance", "--data-dir", nodes[i])["address"]
        step(f"Node 0 sends node {i} the coins for its bond", "pwallet", "send", address, "20",
             "--data-dir", nodes[0])
    heading("Nodes 1 and 2 serve layers 10-19 and 20-29; each registers itself")
    for i in (1, 2):
        procs.append(start_node(root, nodes[i], i, peer))
    wait_until("three registered servers", lambda: len(cli_json(
        "pnode", "status", "--data-dir", nodes[0]).get("swarm") or []) == 3)
    step("Node 0's live status: chain, what it serves and mines, the swarm it sees", "pnode",
         "status", "--data-dir", nodes[0])
    bob = step("A wallet for Bob", "pwallet", "create", "--data-dir", nodes[0], "--name", "bob",
               "--json", capture_json=True)["address"]
    step("Node 0 sends Bob 2 coins and waits for the block: its height and inclusion proof",
         "pwallet", "send", bob, "2", "--wait", "--data-dir", nodes[0])
    claim = paid_question(nodes, peer)
    step("Bob's history: the transfer, his tab, the servers' claims and his refund",
         "pwallet", "history", "--data-dir", nodes[0], "--wallet", "bob")
    step("The chain's jobs (asked of the running node)", "pnode", "job", "list",
         "--data-dir", nodes[0])
    model = str(root / "model.safetensors")
    step("The job's model as trained so far, exported by the running node", "pnode", "job",
         "export", job[:16], "--out", model, "--data-dir", nodes[0])
    step("... and run here (the default job is a 0.8M-parameter byte-level toy: this early it "
         "has learnt letters and spaces, not words)",
         "pwallet", "infer", "The ", "--local", "--raw", "--greedy", "--max-tokens", "48",
         "--model", model)
    rewards = [r for r in cli_json("pwallet", "history", "--data-dir", nodes[0])["history"]
               if r["type"] == "Reward"]
    heading("Node 0's mining rewards so far (from `pwallet history --json`)")
    latest = rewards[-1] if rewards else {"height": "-", "counterparty": "minted"}
    payer = "minted for the chain's own job" if latest["counterparty"] == "minted" else \
        f"paid by {latest['counterparty'][:16]}.."
    console.print(f"  {len(rewards)} rewards of 1 coin, one per accepted unit; the latest at "
                  f"height {latest['height']}, {payer}", highlight=False)
    receipt = cli_json("pnode", "receipts", "--data-dir", nodes[0])["receipts"][-1]["id"]
    prove(root, nodes[0], receipt, "receipt", "A unit's receipt, proven in the receipt log "
                                              "(against the tip's log root)")
    if claim is not None:
        prove(root, nodes[0], claim, "claim", "The claim that paid a server, proven in its "
                                              "block (Merkle path + header)")
    return claim


if __name__ == "__main__":
    main()
