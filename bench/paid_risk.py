"""What a paid server serves unpaid per lane against a client that cheats, before and after issue 28.

Each attack is a client script run against one lane's `Bill` (the rule a
server takes each step's voucher by, node/serve/billing.py) at SmolLM2's
shape of a hop: 10 layers, a bid of --bid base units per position per layer,
a cap of --cap-coins coins. "after" is this checkout's rule; "before" is the
rule of commit 2c1ffcb (the last before issue 28), read from git and run in
the same process (skipped where the checkout has no history). Unpaid = the
positions delivered x layers x bid that no checked voucher pays, once the
client is gone and every signature was checked. Real Ed25519 signatures.

  long first step   one step of 2048 positions, no voucher, gone
  stops paying      decode steps vouched for honestly, then no more vouchers
  two sessions      two sessions of one tab, each the longest step the server
                    takes (from 2048 positions down), both running at once
  forged voucher    honest decode steps, then a 2048-position step whose
                    voucher's signature is forged, then gone
  greedy            no voucher ever: the longest step the server takes, again
                    and again, until refused (the worst a non-payer gets)

Usage:  .venv/bin/python bench/paid_risk.py [--bid 1000] [--cap-coins 100] [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import benchkit  # noqa: E402

from ledger.codec import encode  # noqa: E402
from ledger.crypto import SigningKey  # noqa: E402
from ledger.tab import Lane, OpenTab, Voucher, sign_voucher  # noqa: E402
from ledger.types import ZERO_SIG, sign, tx_hash  # noqa: E402
from node.serve import billing  # noqa: E402
from node.wire import charge  # noqa: E402

BEFORE = "2c1ffcb"  # the last commit before issue 28
LAYERS = 10
CLIENT, SERVER, FORGER = (SigningKey(bytes([i]) * 32) for i in (1, 2, 3))
ATTACKS = ("long first step", "stops paying", "two sessions", "forged voucher", "greedy")


class Lane_:
    """One lane's bill behind the two rules' interfaces (old: `deliver(positions, layers)`)."""

    def __init__(self, module, tab: OpenTab, bid: int):
        self.bill, self.old = module.Bill.of(tab, 0, bid), module is not billing
        self.tab, self.bid = tab, bid
        self.refused = module.PaymentError

    def take(self, raw: bytes, positions: int):
        step = self.bill.take(raw, positions, LAYERS)
        return positions if self.old else step

    def deliver(self, token) -> None:
        if self.old:
            self.bill.deliver(token, LAYERS)
        else:
            self.bill.deliver(token)
        self.bill.verify_pending()

    def unpaid(self) -> int:
        self.bill.verify_pending()
        return self.bill.owed - self.bill.paid


def voucher(tab: OpenTab, amount: int, key: SigningKey = CLIENT) -> bytes:
    return encode(sign_voucher(key, Voucher(tab.chain_id, tx_hash(tab), (amount,), ZERO_SIG)))


def attack(name: str, lane: Lane_) -> int:
    """Run attack ``name`` against ``lane``; the base units served unpaid."""
    def step(raw: bytes, n: int) -> bool:
        try:
            lane.deliver(lane.take(raw, n))
            return True
        except lane.refused:
            return False

    if name == "long first step":
        step(b"", 2048)
    elif name == "stops paying":
        for _ in range(16):
            step(voucher(lane.tab, lane.bill.owed), 1)
        while step(voucher(lane.tab, lane.bill.paid), 1):
            pass
    elif name == "two sessions":
        tokens = []
        for _ in range(2):  # each the longest step the server takes, both before either ends
            size = 2048
            while size:
                try:
                    tokens.append(lane.take(b"", size))
                    break
                except lane.refused:
                    size //= 2
        for token in tokens:
            lane.deliver(token)
    elif name == "forged voucher":
        for _ in range(16):
            step(voucher(lane.tab, lane.bill.owed), 1)
        step(voucher(lane.tab, 10**15, FORGER), 2048)
    elif name == "greedy":
        size = 2048
        while size:
            if not step(b"", size):
                size //= 2
    return lane.unpaid()


def old_billing():
    """node/serve/billing.py as of `BEFORE`, loaded from git (None: no history here)."""
    try:
        source = subprocess.run(["git", "show", f"{BEFORE}:node/serve/billing.py"], cwd=_ROOT,
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        benchkit.skipped("the before column", f"no commit {BEFORE} in this checkout: {exc}")
        return None
    path = Path(tempfile.mkdtemp()) / "billing_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("billing_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bid", type=int, default=1000, help="base units per position per layer")
    parser.add_argument("--cap-coins", type=int, default=100, help="the lane's cap, coins")
    parser.add_argument("--json", action="store_true")
    args = benchkit.parse_args(parser, {})
    cap = args.cap_coins * 10**6
    tab = sign(OpenTab("pnode-bench", CLIENT.public, bytes(32), (Lane(SERVER.public, cap),),
                       1000, 0, ZERO_SIG), CLIENT)
    rules = {"after": billing, "before": old_billing()}
    rows = {name: {rule: (attack(name, Lane_(module, tab, args.bid)) if module else None)
                   for rule, module in rules.items()} for name in ATTACKS}
    step = charge(1, LAYERS, args.bid)

    def table() -> None:
        print(f"unpaid per lane, base units (positions): {LAYERS} layers, bid {args.bid}, "
              f"cap {args.cap_coins} coins")
        print(f"{'attack':18} {'before':>22} {'after':>22}")
        for name, row in rows.items():
            cells = [("-" if v is None else f"{v:,} ({v // step:,})") for v in
                     (row["before"], row["after"])]
            print(f"{name:18} {cells[0]:>22} {cells[1]:>22}")
    benchkit.report(args, {"layers": LAYERS, "bid": args.bid, "cap": cap, "unpaid": rows}, table)


if __name__ == "__main__":
    main()
