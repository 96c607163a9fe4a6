"""`pnode start` on a failing store, as real processes: a full disk, a damaged store.

The reproductions of issue 15, part 1: a node whose data dir fills up must
stop with one clear line and, once restarted with space, hold every block it
announced; a node whose store is damaged must say so and never score (or
ban) the honest peer that syncs from it; an edited genesis.json is refused.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from node.datadir import DataDir
from tests.ledger.fskit import fill_until_free, small_fs  # noqa: F401  (a fixture)
from tests.node.prockit import live_status, node_addr, read, stop

PRODUCED = re.compile(r"produced block (\d+) ([0-9a-f]{16})")


def announced(out: str) -> dict[int, str]:
    """The blocks a node said it made: height -> hash prefix (the last word for a height wins)."""
    return {int(h): p for h, p in PRODUCED.findall(out)}


def test_a_full_disk_stops_the_node_and_loses_no_announced_block(small_fs, pnode, spawn):
    a = small_fs / "A"
    r = pnode("init", "--no-job", "--data-dir", str(a), "--chain-id", "t-full", "--slot-ms", "20")
    assert r.code == 0, r.err
    filler = fill_until_free(small_fs, 160 * 1024)
    proc, out, err = spawn("a", "--no-serve", "--no-mine", "--data-dir", str(a))
    code = proc.wait(timeout=120)  # it stops by itself once the disk is full
    made = announced(read(out))
    assert code == 2, read(err)
    assert len(made) > 20, read(out)  # it did produce before the disk filled
    lines = [ln for ln in read(err).splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "the chain store failed and the node stopped" in lines[0]
    assert "No space left on device" in lines[0], lines

    os.remove(filler)
    proc, out2, err2 = spawn("a2", "--no-serve", "--no-mine", "--data-dir", str(a), "--strict")
    node_addr(a, proc)  # it opens (strict: nothing was dropped on recovery) and runs
    assert "dropped" not in read(err2)
    assert stop(proc) == 0, read(err2)
    chain = DataDir(a).open_chain(strict=True)
    try:
        for height, prefix in made.items():
            stored = chain.hash_at(height)
            assert stored is not None and stored.hex().startswith(prefix), height
        chain.verify_chain()
    finally:
        chain.close()


@pytest.fixture
def chain_a(tmp_path, pnode):
    a = tmp_path / "A"
    r = pnode("init", "--no-job", "--data-dir", str(a), "--chain-id", "t-faults", "--slot-ms", "50")
    assert r.code == 0, r.err
    r = pnode("produce", "--data-dir", str(a), "--blocks", "40")
    assert r.code == 0, r.err
    return a


def _flip_table_bytes(chain_dir) -> None:
    """Compact the store into tables, then flip a byte in each (a bad disk sector)."""
    import plyvel
    db = plyvel.DB(str(chain_dir))
    db.compact_range()
    db.close()
    for name in os.listdir(chain_dir):
        if name.endswith(".ldb"):
            with open(chain_dir / name, "r+b") as f:
                f.seek(200)
                b = f.read(1)
                f.seek(200)
                f.write(bytes([b[0] ^ 0x40]))


def test_a_damaged_store_blames_no_peer(tmp_path, pnode, spawn, chain_a):
    a, b = chain_a, tmp_path / "B"
    _flip_table_bytes(a / "chain")
    r = pnode("init", "--data-dir", str(b), "--genesis", str(a / "genesis.json"))
    assert r.code == 0, r.err
    proc_a, out_a, err_a = spawn("a", "--no-serve", "--no-mine", "--no-produce",
                                 "--data-dir", str(a))
    try:
        addr = node_addr(a, proc_a, limit=30)
    except AssertionError:  # the damage was met on open: it says so and stops
        assert proc_a.wait(timeout=10) == 2
        assert "damaged" in read(err_a)
        return
    proc_b, out_b, err_b = spawn("b", "--no-serve", "--no-mine", "--no-produce",
                                 "--data-dir", str(b), "--peers", addr)
    code = proc_a.wait(timeout=60)  # B's sync reads the damaged blocks: A stops
    assert code == 2, read(err_a)
    lines = [ln for ln in read(err_a).splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "the chain store is damaged and the node stopped" in lines[0]
    status = live_status(pnode, b)
    # A never scored B: nothing of B's was refused as misbehaviour, and B runs on.
    assert "misbehav" not in read(err_a).lower() and "banned" not in read(err_a).lower()
    assert proc_b.poll() is None and status["running"]
    assert stop(proc_b) == 0, read(err_b)


def test_an_edited_genesis_file_is_refused(tmp_path, pnode, spawn, chain_a):
    doc = json.loads((chain_a / "genesis.json").read_text())
    doc["chain_id"] = "someone-else"
    (chain_a / "genesis.json").write_text(json.dumps(doc))
    proc, out, err = spawn("a", "--no-serve", "--no-mine", "--data-dir", str(chain_a))
    assert proc.wait(timeout=60) == 2
    assert "is not the genesis of the chain stored" in read(err)
    assert "'someone-else' in the file, 't-faults' in the store" in read(err)


def test_a_lost_current_file_is_explained(tmp_path, pnode, chain_a):
    os.remove(chain_a / "chain" / "CURRENT")
    r = pnode("status", "--data-dir", str(chain_a))
    assert r.code == 2
    assert "lost its CURRENT file" in r.err and "echo MANIFEST-" in r.err


def test_strict_refuses_a_store_that_lost_blocks_on_recovery(tmp_path, pnode, spawn, chain_a,
                                                            caplog):
    proc, out, err = spawn("a", "--no-serve", "--no-mine", "--data-dir", str(chain_a))
    node_addr(chain_a, proc)
    _wait_for_blocks(out, 30)
    assert stop(proc) == 0, read(err)
    height = max(announced(read(out)))
    chain = chain_a / "chain"  # not opened since: the node's blocks are in its log
    (log,) = [n for n in os.listdir(chain) if n.endswith(".log")]
    with open(chain / log, "r+b") as f:  # what a bad write leaves in the middle of the log
        size = f.seek(0, os.SEEK_END)
        f.seek(size // 2)
        f.write(b"\xff" * 64)
    proc, out, err = spawn("s", "--no-serve", "--no-mine", "--data-dir", str(chain_a), "--strict")
    assert proc.wait(timeout=60) == 2
    assert "refused in strict mode" in read(err)
    r = pnode("status", "--data-dir", str(chain_a), "--json")
    assert r.code == 0, r.err  # without --strict it opens, and says what was lost
    said = r.err + caplog.text  # a warning line (stderr outside pytest's log capture)
    assert "LevelDB recovery dropped" in said or "the chain store lost blocks" in said, said
    assert r.json()["height"] < height


def _wait_for_blocks(out, n: int) -> None:
    from tests.node.prockit import wait_for
    wait_for(lambda: len(announced(read(out))) >= n, f"{n} blocks", limit=60)
