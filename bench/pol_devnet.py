"""The attack battery over real devnets (issue 16): one `pnode devnet` per attack.

Each run is ``--nodes`` node processes on 127.0.0.1 (default 4: node0 holds
section 0, node1 section 1, the others the whole model, so every section
has at least two holders and section 0 three) mining the devnet's job with
every receipt audited (``--audit-bps 10000``); node ``--cheater`` (default
2, a holder of the whole model, so every attack finds units to act on)
cheats in one way of `node.pol.attacks` (``--byzantine`` and ``--attack``
with empty places for the honest nodes before it). The first run is
honest: the baseline, in the same sitting (``--no-honest`` leaves it
out). For each run the table shows the verdicts, the cheater's slash and
jail, the most any honest node lost, and the last loss (an attack that
changes the training changes it).

Usage:  .venv/bin/python bench/pol_devnet.py [--steps 6] [--nodes 4] [--cheater 2]
                                              [--attacks KIND,...] [--no-honest] [--json]
                                              [--smoke]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import benchkit  # noqa: E402
from node.pol.attacks import WORKER_ATTACKS  # noqa: E402


def devnet(kind: str | None, steps: int, nodes: int, cheater: int, root: Path) -> dict:
    """One devnet's JSON summary, with its wall time (``kind`` None: honest)."""
    args = [sys.executable, "-m", "node.cli", "devnet", "--nodes", str(nodes),
            "--steps", str(steps), "--audit-bps", "10000",
            "--data-dir", str(root / (kind or "honest")), "--json"]
    if kind is not None:
        args += ["--byzantine", str(cheater + 1), "--attack", "," * cheater + kind]
    began = time.monotonic()
    try:
        r = subprocess.run(args, cwd=_ROOT, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return {"error": ["did not end within 900 s"]}
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1:] or ["no output"]}
    info = json.loads(r.stdout)
    info["seconds"] = time.monotonic() - began
    return info


def row(kind: str | None, info: dict, at: int) -> dict:
    if "error" in info:
        return {"attack": kind or "none (honest)", "error": info["error"][0]}
    cheater = info["nodes"][at]
    honest = [n for i, n in enumerate(info["nodes"]) if i != at]
    return {"attack": kind or "none (honest)", "finished": info["finished"],
            "pass": info["verdicts"]["pass"], "fail": info["verdicts"]["fail"],
            "unavailable": info["verdicts"]["unavailable"],
            "reasons": sorted(r for r in info["verdicts"]["reasons"] if r != "pass"),
            "cheater_slashed": cheater["slashed"], "cheater_jailed": cheater["jailed"],
            "honest_slashed": max(n["slashed"] for n in honest),
            "loss_last": info["loss_last"], "seconds": round(info["seconds"], 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--cheater", type=int, default=2, help="which node cheats")
    ap.add_argument("--attacks", default=",".join(WORKER_ATTACKS),
                    help="comma-separated worker attacks [default: all]")
    ap.add_argument("--no-honest", dest="honest", action="store_false",
                    help="leave out the honest baseline run")
    ap.add_argument("--json", action="store_true")
    # Smoke: one attacked devnet (it runs every flag an honest one does, and the attack's).
    args = benchkit.parse_args(ap, {"steps": 1, "nodes": 2, "cheater": 1,
                                    "attacks": "scaled-gradients", "honest": False})
    kinds = [None] * args.honest + [k for k in args.attacks.split(",") if k]
    rows = []
    with tempfile.TemporaryDirectory(prefix="pol-devnet-") as tmp:
        for kind in kinds:
            info = devnet(kind, args.steps, args.nodes, args.cheater, Path(tmp))
            rows.append(row(kind, info, args.cheater))
            if not args.json:
                print(json.dumps(rows[-1]), file=sys.stderr)
    benchkit.report(args, {"rows": rows}, lambda: print_table(rows), indent=1)
    if any("error" in r for r in rows):
        sys.exit("pol_devnet: a devnet failed (its row says how)")


def print_table(rows: list[dict]) -> None:
    print(f"{'attack':18} {'pass':>5} {'fail':>5} {'unav':>5}  {'cheater slashed/jailed':>22} "
          f"{'honest slashed':>15} {'loss last':>10}  reasons")
    for r in rows:
        if "error" in r:
            print(f"{r['attack']:18} error: {r['error']}")
            continue
        print(f"{r['attack']:18} {r['pass']:>5} {r['fail']:>5} {r['unavailable']:>5}  "
              f"{r['cheater_slashed']:>14g} / {str(r['cheater_jailed']):<5} "
              f"{r['honest_slashed']:>15g} {r['loss_last']:>10.4f}  {', '.join(r['reasons'])}")


if __name__ == "__main__":
    main()
