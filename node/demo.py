"""`make demo`: a guided run of what pnode does today, with the real CLIs.

Starts a fresh private chain in the demo directory, makes a second wallet,
sends it coins, seals the transfers into signed blocks, shows balances,
history and a block, and re-verifies the whole chain from genesis; then runs
SmolLM2 locally and a short training run of the default job. Each step runs
the installed `pnode` / `pwallet` commands exactly as a user would.

Usage:  python -m node.demo [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from rich.console import Console

console = Console()
BIN = Path(sys.executable).parent


def step(title: str, *argv: str, capture_json: bool = False) -> dict | None:
    """Print and run one CLI command; stop the demo if it fails."""
    console.rule(f"[bold]{title}")
    console.print(f"[cyan]$ {' '.join(argv)}")
    exe = BIN / argv[0]
    result = subprocess.run([str(exe) if exe.exists() else argv[0], *argv[1:]],
                            capture_output=True, text=True)
    console.print(result.stdout.rstrip(), highlight=False, markup=False)
    if result.returncode != 0:
        console.print(f"[red]{result.stderr.strip()}")
        sys.exit(result.returncode)
    return json.loads(result.stdout) if capture_json else None


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
    console.rule("[bold green]demo done")
    console.print(f"The chain is in {root}. Try: pnode --help, pwallet --help")


if __name__ == "__main__":
    main()
