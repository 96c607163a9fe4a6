"""Benchmark ledger.merkle against the raw SHA-256 rate of this machine.

Measures:
  1. hashlib SHA-256 on 32-byte messages (hashes/s): the ceiling for any
     Python loop that makes one hashlib call per hash;
  2. merkle_root of N raw leaves (default 1,000,000): seconds, effective
     hashes/s counting the 2N - 1 hashes, and the ratio to the ceiling;
  3. inclusion proofs verified per second, for proofs of random leaves of
     an N-leaf tree generated before timing starts.

Usage:  .venv/bin/python bench/merkle_bench.py [--leaves N] [--json] [--smoke]
A combined benchmark can put bench/ on sys.path and call
``merkle_bench.run(leaves)``, which returns the figures as a dict.
"""

from __future__ import annotations

import argparse
import hashlib
import platform
import random
import ssl
import sys
import time
from pathlib import Path
from typing import Any, Callable

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))  # run as a script without an install

import benchkit  # noqa: E402
from ledger import merkle  # noqa: E402

DEFAULT_LEAVES = 1_000_000
DEFAULT_PROOFS = 20_000
SEED = 6962


def _best_time(fn: Callable[[], Any], repeats: int) -> float:
    """Return the fastest of ``repeats`` wall-clock timings of ``fn()``."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def raw_sha256_rate(count: int, repeats: int = 3) -> float:
    """Hashes per second for hashlib SHA-256 over ``count`` 32-byte messages."""
    messages = [i.to_bytes(32, "big") for i in range(count)]
    sha = hashlib.sha256

    def hash_all() -> None:
        for m in messages:
            sha(m).digest()

    return count / _best_time(hash_all, repeats)


def root_timing(leaves: list[bytes], repeats: int = 3) -> tuple[float, bytes]:
    """Best time in seconds for merkle_root(leaves), and the root itself."""
    root = merkle.merkle_root(leaves)
    return _best_time(lambda: merkle.merkle_root(leaves), repeats), root


def verify_rate(leaves: list[bytes], root: bytes, proofs: int, repeats: int = 3) -> float:
    """Inclusion proofs verified per second for random leaves of the tree.

    Proofs come from one prebuilt set of tree levels (the module's own
    helpers), since building each proof from scratch costs a whole tree.
    """
    levels = merkle._tree_levels(merkle._hash_leaves(leaves))
    rng = random.Random(SEED)
    n = len(leaves)
    cases = [(i, merkle._path_from_levels(levels, i)) for i in (rng.randrange(n) for _ in range(proofs))]
    verify = merkle.verify_inclusion

    def verify_all() -> None:
        for i, path in cases:
            if not verify(leaves[i], i, n, path, root):
                raise AssertionError(f"proof for leaf {i} failed to verify")

    return proofs / _best_time(verify_all, repeats)


def make_leaves(count: int) -> list[bytes]:
    """Deterministic 32-byte leaves, like transaction ids."""
    return [hashlib.sha256(i.to_bytes(8, "big")).digest() for i in range(count)]


def run(leaves: int = DEFAULT_LEAVES, proofs: int = DEFAULT_PROOFS, repeats: int = 3) -> dict[str, Any]:
    """Run all three measurements and return the figures.

    Args:
        leaves: number of leaves N in the benchmark tree.
        proofs: number of inclusion proofs to verify.
        repeats: timings per measurement; the fastest is kept.
    Returns:
        A JSON-serialisable dict of the measured figures.
    """
    if leaves < 1:
        raise ValueError("leaves must be at least 1")
    raw = raw_sha256_rate(leaves, repeats)
    data = make_leaves(leaves)
    seconds, root = root_timing(data, repeats)
    hashes = 2 * leaves - 1
    return {
        "leaves": leaves,
        "sha256_raw_hashes_per_s": raw,
        "merkle_root_s": seconds,
        "merkle_root_hashes_per_s": hashes / seconds,
        "merkle_root_ratio_to_raw": hashes / seconds / raw,
        "merkle_root_hex": root.hex(),
        "inclusion_proofs": proofs,
        "inclusion_verify_per_s": verify_rate(data, root, proofs, repeats),
        "python": platform.python_version(),
        "openssl": ssl.OPENSSL_VERSION,
        "machine": platform.machine(),
    }


def _rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """Format the figures as (measure, value) rows for display."""
    n = r["leaves"]
    return [
        ("SHA-256 raw, 32-byte messages", f"{r['sha256_raw_hashes_per_s']:,.0f} hashes/s"),
        (f"merkle_root, {n:,} leaves", f"{r['merkle_root_s']:.3f} s"),
        ("  effective rate (2N-1 hashes)", f"{r['merkle_root_hashes_per_s']:,.0f} hashes/s"),
        ("  ratio to raw SHA-256", f"{r['merkle_root_ratio_to_raw']:.2f}"),
        (f"verify_inclusion, {n:,}-leaf tree", f"{r['inclusion_verify_per_s']:,.0f} proofs/s"),
    ]


def _print_table(r: dict[str, Any]) -> None:
    """Print the figures with rich if available, else as plain text."""
    title = f"ledger.merkle (Python {r['python']}, {r['openssl']})"
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        for name, value in _rows(r):
            print(f"  {name:<40} {value:>24}")
        return
    table = Table(title=title)
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name, value in _rows(r):
        table.add_row(name, value)
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaves", type=int, default=DEFAULT_LEAVES, help="tree size N")
    parser.add_argument("--proofs", type=int, default=DEFAULT_PROOFS, help="proofs to verify")
    parser.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    args = benchkit.parse_args(parser, {"leaves": 1000, "proofs": 100}, argv)
    result = run(args.leaves, proofs=args.proofs)
    benchkit.report(args, result, lambda: _print_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
