"""LevelDBStore on real disk faults: a full disk, a damaged log or table, a lost CURRENT.

The full-disk tests mount a small tmpfs (root only; skipped, with the reason,
where mounting is not allowed) and unmount it whatever happens.
"""

from __future__ import annotations

import os
import re

import plyvel
import pytest

from ledger.errors import StoreCorruptError, StoreError, StoreFailedError, StoreRecoveryError
from ledger.store import LevelDBStore
from tests.ledger.fskit import fill_until_free, small_fs  # noqa: F401  (a fixture)


def value(i: int, size: int = 1500) -> bytes:
    """Incompressible bytes (snappy stores them raw), different for every i."""
    return os.urandom(size - 8) + i.to_bytes(8, "big")


def key(i: int) -> bytes:
    return b"k%06d" % i


# -- a full disk --------------------------------------------------------------


def test_a_failed_write_closes_the_store_and_no_acknowledged_write_is_lost(small_fs):
    path = small_fs / "db"
    filler = fill_until_free(small_fs, 2 * 1024 * 1024)
    acked: dict[bytes, bytes] = {}
    store = LevelDBStore(path)
    with pytest.raises(StoreFailedError, match="No space left on device"):
        for i in range(10_000):
            store.write([(key(i), v := value(i))])
            acked[key(i)] = v
    assert acked, "the disk filled before the first write"
    os.remove(filler)  # the space comes back, as when an operator frees some
    # Before the fix, this write succeeded after the torn one and the next
    # open dropped everything from the tear on (acknowledged writes included).
    for op in (lambda: store.write([(b"later", b"x")]), lambda: store.get(key(0)),
               lambda: list(store.iterate())):
        with pytest.raises(StoreFailedError, match="was closed when a write failed"):
            op()
    store.close()
    with LevelDBStore(path, create=False, strict=True) as again:
        assert again.recovery_loss is None
        assert dict(again.iterate(b"k")) == acked
        assert again.get(b"later") is None


def test_a_store_that_cannot_recover_for_lack_of_space_says_so(small_fs):
    path = small_fs / "db"
    with LevelDBStore(path) as store:
        store.write([(key(i), value(i)) for i in range(400)])  # 600 KB, all in the log
    fill_until_free(small_fs, 64 * 1024)  # recovery writes a table of it: no room
    with pytest.raises(StoreError, match="No space left on device"):
        LevelDBStore(path, create=False)


# -- damage found on open or read ---------------------------------------------


def _damage_log(path) -> None:
    """Flip bytes in the middle of the store's log (what a torn or bad write leaves)."""
    (log,) = [n for n in os.listdir(path) if n.endswith(".log")]
    with open(path / log, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(size // 3)
        f.write(b"\xff" * 64)


def test_log_damage_is_reported_on_open_and_refused_when_strict(tmp_path):
    path = tmp_path / "db"
    with LevelDBStore(path) as store:
        for i in range(300):
            store.write([(key(i), value(i, 500))])
    _damage_log(path)
    with pytest.raises(StoreRecoveryError, match="refused in strict mode"):
        LevelDBStore(path, create=False, strict=True)
    with LevelDBStore(path, create=False) as store:
        assert store.recovery_loss is not None
        assert re.search(r"dropped \d+ bytes of damaged records", store.recovery_loss)
        kept = len(list(store.iterate(b"k")))
        assert 0 < kept < 300
        store.write([(b"after", b"ok")])  # recovered: usable again
    with LevelDBStore(path, create=False, strict=True) as store:  # and clean from now on
        assert store.recovery_loss is None
        assert store.get(b"after") == b"ok"


def test_a_flipped_byte_in_a_table_reads_as_corrupt_not_as_other_data(tmp_path):
    path = tmp_path / "db"
    db = plyvel.DB(str(path), create_if_missing=True)
    for i in range(50):
        db.put(key(i), value(i, 200))
    db.compact_range()  # into a table file
    db.close()
    (table,) = [n for n in os.listdir(path) if n.endswith(".ldb")]
    with open(path / table, "r+b") as f:
        f.seek(100)  # inside the first data block, in a value
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0x01]))
    with LevelDBStore(path, create=False) as store:
        with pytest.raises(StoreCorruptError, match="corrupt"):
            store.get(key(0))
        with pytest.raises(StoreCorruptError, match="corrupt"):
            list(store.iterate())


def test_a_lost_current_file_is_named_and_its_data_left_alone(tmp_path):
    path = tmp_path / "db"
    with LevelDBStore(path) as store:
        store.write([(b"a", b"1")])
    os.remove(path / "CURRENT")
    for create in (False, True):  # create=True must not start a new database over it
        with pytest.raises(StoreError, match="lost its CURRENT file") as info:
            LevelDBStore(path, create=create)
    command = re.search(r"`echo (MANIFEST-\d+) > (\S+)`", str(info.value))
    assert command is not None and command.group(2) == str(path / "CURRENT")
    (path / "CURRENT").write_text(command.group(1) + "\n")  # what the message says to do
    with LevelDBStore(path, create=False) as store:
        assert store.get(b"a") == b"1"
