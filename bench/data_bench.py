"""Job data over `/pnode/data/1.0.0` against a raw TCP socket on loopback, in one sitting.

Two real libp2p hosts (Noise, pnode's yamux) in one process: one keeps a
random file of --mb MiB on its shelf, the other fetches it range by range
(1 MiB each) and checks its SHA-256 (`node.mine.DataShelf.fetch`). The
baseline moves the same bytes over a plain trio TCP connection on
127.0.0.1 and hashes them too. Medians over --repeats runs, alternating.

Usage:  .venv/bin/python bench/data_bench.py [--mb 64] [--repeats 3] [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import benchkit  # noqa: E402
from node.mine import DataShelf  # noqa: E402
from node.net import PeerIdentity, open_host  # noqa: E402


async def over_pnode(src: Path, sha: str, tmp: Path, run: int) -> float:
    """Seconds for one fetch of ``src`` between two hosts (the asker's shelf emptied first)."""
    async with open_host(PeerIdentity.from_seed(bytes([1]) * 32)) as a, \
            open_host(PeerIdentity.from_seed(bytes([2]) * 32)) as b:
        owner = DataShelf(tmp / "owner", a)
        owner.add(src)
        owner.install()
        await b.connect(a.addrs[0])
        miner = DataShelf(tmp / f"miner{run}", b)
        began = time.perf_counter()
        await miner.fetch(sha, [a.peer_id])
        return time.perf_counter() - began


async def over_tcp(src: Path, sha: str) -> float:
    """Seconds to send ``src`` over one loopback TCP connection and hash what arrives."""
    data = src.read_bytes()
    done = trio.Event()
    digest = {}

    async def serve(stream: trio.SocketStream) -> None:
        await stream.send_all(data)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, serve, 0)
        port = listeners[0].socket.getsockname()[1]
        began = time.perf_counter()
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        h = hashlib.sha256()
        while chunk := await stream.receive_some(1 << 20):
            h.update(chunk)
        digest["sha"] = h.hexdigest()
        elapsed = time.perf_counter() - began
        done.set()
        nursery.cancel_scope.cancel()
    assert digest["sha"] == sha
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = benchkit.parse_args(parser, {"mb": 1, "repeats": 1})
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "data.txt"
        src.write_bytes(os.urandom(args.mb << 20))
        sha = hashlib.sha256(src.read_bytes()).hexdigest()
        pnode, tcp = [], []
        for run in range(args.repeats):
            pnode.append(trio.run(over_pnode, src, sha, Path(tmp), run))
            tcp.append(trio.run(over_tcp, src, sha))
    mb = args.mb * (1 << 20) / 1e6
    rows = {"pnode /pnode/data/1.0.0": mb / statistics.median(pnode),
            "raw TCP (baseline)": mb / statistics.median(tcp)}
    ratio = rows["pnode /pnode/data/1.0.0"] / rows["raw TCP (baseline)"]

    def table() -> None:
        print(f"{args.mb} MiB, medians of {args.repeats}; both hash what arrives")
        for name, rate in rows.items():
            print(f"  {name:26} {rate:8.1f} MB/s")
        print(f"  ratio pnode / raw TCP      {ratio:8.2f}x")
    benchkit.report(args, {"mb": mb, "mb_per_s": rows, "ratio": ratio}, table)


if __name__ == "__main__":
    main()
