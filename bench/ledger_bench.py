"""Ledger benchmark: signed transfers validated and applied per second.

Measures, in one run on this machine:
  1. the raw Ed25519 verify rate (OpenSSL through ``cryptography``, key
     parsing included, one core): the ceiling, since every transfer costs
     one verify and verify holds the GIL;
  2. blocks of ``--block-txs`` signed transfers (default 1,000), received as
     bytes, then decoded, fully validated and applied to a LevelDB chain
     (one atomic, fsynced batch per block), every sender a key the node has
     not seen before: transfers per second and the ratio to the ceiling;
  3. the Merkle figures of ``merkle_bench`` (root of 1,000,000 leaves and
     inclusion proofs verified per second, against raw SHA-256).

Usage:  .venv/bin/python bench/ledger_bench.py [--blocks N] [--block-txs N]
                                                [--leaves N] [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
for path in (_ROOT, _ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import benchkit  # noqa: E402
import merkle_bench  # noqa: E402
from ledger.chaindb import ChainDB  # noqa: E402
from ledger.codec import decode, encode  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey  # noqa: E402

from ledger import crypto  # noqa: E402
from ledger.crypto import SigningKey  # noqa: E402
from ledger.store import LevelDBStore, MemoryStore  # noqa: E402
from ledger.types import COIN, ZERO_SIG, Allocation, Block, Transfer, sign  # noqa: E402
from tests.ledger.chainkit import CHAIN, make_net, next_block  # noqa: E402


def ed25519_verify_rate(count: int = 5000) -> float:
    """Raw OpenSSL verifies per second (key parsing included), 150-byte messages."""
    keys = [SigningKey(i.to_bytes(4, "big") * 8) for i in range(1, count + 1)]
    items = [(k.public, k.sign(b"", bytes(150))) for k in keys]
    start = time.perf_counter()
    for public, signature in items:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, bytes(150))
    return count / (time.perf_counter() - start)


def make_blocks(n_blocks: int, block_txs: int):
    """A genesis with ``block_txs`` funded users and ``n_blocks`` blocks of transfers."""
    net = make_net(n_nodes=3, n_users=0, max_block_txs=max(5000, block_txs))
    users = [SigningKey((10_000 + i).to_bytes(4, "big") * 8) for i in range(block_txs)]
    allocations = tuple(Allocation(u.public, 1000 * COIN) for u in users)
    net.genesis = replace(net.genesis, allocations=net.genesis.allocations + allocations)
    builder = ChainDB.create(MemoryStore(), net.genesis)
    raw_blocks = []
    for b in range(n_blocks):
        txs = [sign(Transfer(CHAIN, u.public, users[(i + 1) % block_txs].public, 1000 + b, b,
                             ZERO_SIG), u) for i, u in enumerate(users)]
        applied = next_block(builder, net, txs)
        builder.add_block(applied.block, now_ms=None)
        assert len(applied.block.txs) == block_txs
        raw_blocks.append(encode(applied.block))
    return net.genesis, raw_blocks


def apply_rate(genesis, raw_blocks: list[bytes], block_txs: int) -> dict:
    """Decode, validate and apply every block into a fresh LevelDB chain."""
    with tempfile.TemporaryDirectory() as tmp:
        with ChainDB.create(LevelDBStore(Path(tmp) / "chain"), genesis) as db:
            crypto._public_key.cache_clear()  # a receiving node has not seen these keys
            start = time.perf_counter()
            for raw in raw_blocks:
                db.add_block(decode(raw, Block), now_ms=None)
            elapsed = time.perf_counter() - start
    return {"blocks": len(raw_blocks), "txs": len(raw_blocks) * block_txs,
            "seconds": elapsed, "txs_per_s": len(raw_blocks) * block_txs / elapsed}


def run(blocks: int, block_txs: int, leaves: int) -> dict:
    genesis, raw_blocks = make_blocks(blocks, block_txs)
    ceiling = ed25519_verify_rate()
    applied = apply_rate(genesis, raw_blocks, block_txs)
    return {
        "ed25519_verify_per_s": ceiling,
        "transfers": applied,
        "transfers_ratio_to_verify": applied["txs_per_s"] / ceiling,
        "merkle": merkle_bench.run(leaves),
    }


def print_table(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    m = r["merkle"]
    table = Table(title="ledger benchmark (this machine, one run)")
    for col in ("measure", "value", "baseline (same run)", "ratio"):
        table.add_column(col)
    table.add_row(f"transfers validated+applied ({r['transfers']['blocks']} blocks of "
                  f"{r['transfers']['txs'] // r['transfers']['blocks']}, LevelDB)",
                  f"{r['transfers']['txs_per_s']:,.0f} tx/s",
                  f"Ed25519 verify {r['ed25519_verify_per_s']:,.0f}/s",
                  f"{r['transfers_ratio_to_verify']:.2f}")
    table.add_row(f"Merkle root of {m['leaves']:,} leaves", f"{m['merkle_root_s']:.2f} s "
                  f"({m['merkle_root_hashes_per_s']:,.0f} hashes/s)",
                  f"SHA-256 {m['sha256_raw_hashes_per_s']:,.0f}/s",
                  f"{m['merkle_root_ratio_to_raw']:.2f}")
    table.add_row("inclusion proofs verified", f"{m['inclusion_verify_per_s']:,.0f}/s",
                  f"SHA-256 {m['sha256_raw_hashes_per_s']:,.0f}/s", "")
    Console().print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--block-txs", type=int, default=1000)
    parser.add_argument("--leaves", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = benchkit.parse_args(parser, {"blocks": 1, "block_txs": 50, "leaves": 1000})
    if args.blocks < 1 or args.block_txs < 1 or args.leaves < 1:
        parser.error("--blocks, --block-txs and --leaves must be at least 1")
    result = run(args.blocks, args.block_txs, args.leaves)
    benchkit.report(args, result, lambda: print_table(result))


if __name__ == "__main__":
    main()
