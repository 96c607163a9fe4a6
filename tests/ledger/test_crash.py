"""Crash safety, for real: SIGKILL a writer at random moments, then reopen.

Each round starts ``crash_writer`` on the same LevelDB directory, lets it
commit blocks for a random while, and kills it with SIGKILL. After every
kill the store must open (the tip state matching its header), pass full
re-validation from genesis, and hold every block the writer reported as
committed, at the height and with the hash it reported.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ledger.chaindb import ChainDB
from ledger.store import LevelDBStore

ROOT = Path(__file__).resolve().parents[2]
KILLS = 16


def _run_and_kill(path: Path, rng: random.Random) -> list[tuple[int, str]]:
    """Start the writer, kill it after a random delay, return what it reported."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.ledger.crash_writer", str(path)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ,  # the repo first, then wherever the caller's packages are
             "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                         os.environ.get("PYTHONPATH")]))},
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 30
    while not lines and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)  # wait until it has opened the store
    assert lines and lines[0].startswith("open"), proc.stderr.read() if proc.poll() else lines
    time.sleep(rng.uniform(0.0, 0.4))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    reader.join(timeout=5)
    committed = [line.split() for line in lines if line.startswith("committed")]
    return [(int(h), block_hash) for _, h, block_hash in committed]


def test_sigkill_at_random_moments_loses_nothing_committed(tmp_path):
    rng = random.Random(2026)
    path = tmp_path / "chain"
    reported: dict[int, str] = {}
    for _ in range(KILLS):
        for height, block_hash in _run_and_kill(path, rng):
            reported[height] = block_hash
        with ChainDB(LevelDBStore(path)) as db:  # raises if the tip state is inconsistent
            db.verify_chain()
            top = max(reported, default=0)
            assert db.height >= top, f"lost committed blocks: tip {db.height} < {top}"
            for height, block_hash in reported.items():
                assert db.hash_at(height).hex() == block_hash
    assert max(reported) > KILLS  # the writer made real progress between kills
