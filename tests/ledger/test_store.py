"""Contract tests for ledger.store: one suite, run against every backend.

Each test takes the `store` fixture, which yields a MemoryStore and a
LevelDBStore in turn; a stateful Hypothesis test checks both against a dict
model. LevelDB-only behaviour (persistence, locking, corruption) is at the end.
"""

from __future__ import annotations

import glob
import os
import random
import shutil
import subprocess
import sys
import tempfile

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ledger.errors import StoreClosedError, StoreCorruptError, StoreError, StoreLockedError
from ledger.store import KeyValueStore, LevelDBStore, MemoryStore, open_store


def make_store(backend: str, directory: str) -> KeyValueStore:
    if backend == "memory":
        return MemoryStore()
    return LevelDBStore(os.path.join(directory, "db"))


@pytest.fixture(params=["memory", "leveldb"])
def store(request, tmp_path):
    s = make_store(request.param, str(tmp_path))
    yield s
    s.close()


def items(s: KeyValueStore, prefix: bytes = b"", reverse: bool = False) -> list:
    return list(s.iterate(prefix, reverse=reverse))


# -- get / write ------------------------------------------------------------


def test_satisfies_protocol(store):
    assert isinstance(store, KeyValueStore)


def test_get_missing_is_none(store):
    assert store.get(b"nope") is None


def test_put_get_delete(store):
    store.write([(b"k", b"v")])
    assert store.get(b"k") == b"v"
    store.write([(b"k", None)])
    assert store.get(b"k") is None


def test_empty_value_is_not_missing(store):
    store.write([(b"k", b"")])
    assert store.get(b"k") == b""
    assert items(store) == [(b"k", b"")]


def test_delete_missing_key_is_noop(store):
    store.write([(b"ghost", None)], sync=False)
    assert items(store) == []


def test_write_accepts_any_iterable(store):
    store.write(((bytes([i]), b"x") for i in range(3)))
    assert [k for k, _ in items(store)] == [b"\x00", b"\x01", b"\x02"]


@pytest.mark.parametrize(
    "bad",
    [("k", b"v"), (b"k", "v"), (b"k", 1), (bytearray(b"k"), b"v"), (b"k",), [b"k", b"v"], b"kv"],
    ids=["str-key", "str-value", "int-value", "bytearray-key", "1-tuple", "list", "bytes"],
)
def test_bad_op_raises_and_applies_nothing(store, bad):
    store.write([(b"keep", b"1")])
    with pytest.raises(TypeError):
        store.write([(b"keep", None), (b"new", b"2"), bad, (b"after", b"3")])
    assert items(store) == [(b"keep", b"1")]


def test_iterable_failing_midway_applies_nothing(store):
    def ops():
        yield (b"a", b"1")
        raise RuntimeError("producer broke")

    with pytest.raises(RuntimeError):
        store.write(ops())
    assert items(store) == []


@pytest.mark.parametrize(
    "ops, expected",
    [
        ([(b"k", b"1"), (b"k", b"2")], b"2"),
        ([(b"k", b"1"), (b"k", None)], None),
        ([(b"k", b"1"), (b"k", None), (b"k", b"3")], b"3"),
        ([(b"k", None), (b"k", b"4")], b"4"),
    ],
)
def test_later_op_on_same_key_wins(store, ops, expected):
    store.write([(b"k", b"old")])
    store.write(ops)
    assert store.get(b"k") == expected


def test_non_bytes_arguments_rejected(store):
    with pytest.raises(TypeError):
        store.get("k")
    with pytest.raises(TypeError):
        store.iterate("k")


# -- iterate ----------------------------------------------------------------


def test_iterate_sorted_and_reversed(store):
    keys = [bytes([a, b]) for a in range(0, 256, 51) for b in (0, 7, 255)]
    shuffled = keys[:]
    random.Random(1).shuffle(shuffled)
    store.write([(k, k[::-1]) for k in shuffled])
    assert items(store) == [(k, k[::-1]) for k in sorted(keys)]
    assert items(store, reverse=True) == [(k, k[::-1]) for k in sorted(keys, reverse=True)]


def test_prefix_isolation(store):
    keys = [b"a", b"a/", b"a/1", b"a/2", b"a0", b"ab", b"b", b"`"]
    store.write([(k, b"") for k in keys])
    assert [k for k, _ in items(store, b"a/")] == [b"a/", b"a/1", b"a/2"]
    assert [k for k, _ in items(store, b"a/", reverse=True)] == [b"a/2", b"a/1", b"a/"]
    assert [k for k, _ in items(store, b"ab")] == [b"ab"]
    # plyvel 1.5.1's own reverse prefix iterator returns [] for this one
    assert [k for k, _ in items(store, b"ab", reverse=True)] == [b"ab"]
    assert [k for k, _ in items(store, b"b", reverse=True)] == [b"b"]
    assert [k for k, _ in items(store, b"a")] == [b"a", b"a/", b"a/1", b"a/2", b"a0", b"ab"]
    assert items(store, b"c") == [] and items(store, b"0") == []
    assert [k for k, _ in items(store, b"")] == sorted(keys)


def test_binary_keys_with_zero_and_ff_bytes(store):
    keys = [b"", b"\x00", b"\x00\x00", b"\x00\xff", b"\xfe\xff", b"\xff", b"\xff\x00", b"\xff\xff"]
    store.write([(k, b"v" + k) for k in keys])
    for k in keys:
        assert store.get(k) == b"v" + k
    assert [k for k, _ in items(store)] == sorted(keys)
    assert [k for k, _ in items(store, b"\xff")] == [b"\xff", b"\xff\x00", b"\xff\xff"]
    assert [k for k, _ in items(store, b"\xff", reverse=True)] == (
        [b"\xff\xff", b"\xff\x00", b"\xff"]
    )
    assert [k for k, _ in items(store, b"\x00")] == [b"\x00", b"\x00\x00", b"\x00\xff"]
    assert [k for k, _ in items(store, b"\xff\xff", reverse=True)] == [b"\xff\xff"]
    assert [k for k, _ in items(store, b"\xfe", reverse=True)] == [b"\xfe\xff"]


def test_reverse_over_only_the_empty_key(store):
    store.write([(b"", b"e")])
    assert items(store, reverse=True) == [(b"", b"e")]


def test_iteration_is_a_snapshot(store):
    store.write([(b"p/%d" % i, b"old") for i in range(5)])
    it = store.iterate(b"p/")
    first = next(it)
    store.write([(b"p/1", b"new"), (b"p/3", None), (b"p/10", b"added"), (b"p/0", None)])
    assert [first, *it] == [(b"p/%d" % i, b"old") for i in range(5)]


def test_snapshot_taken_at_call_not_first_next(store):
    store.write([(b"k", b"old")])
    it = store.iterate(reverse=True)
    store.write([(b"k", b"new"), (b"z", b"z")])
    assert list(it) == [(b"k", b"old")]


def test_large_and_small_batches_keep_order(store):
    # Crosses the memory backend's re-sort threshold both ways.
    store.write([(b"%05d" % i, b"") for i in range(0, 400, 2)])
    store.write([(b"%05d" % i, b"") for i in (1, 3, 399)])
    store.write([(b"%05d" % i, None) for i in range(0, 200, 2)])
    store.write([(b"%05d" % 0, b""), (b"%05d" % 3, None)])
    expected = sorted({b"%05d" % i for i in [*range(200, 400, 2), 1, 399, 0]})
    assert [k for k, _ in items(store)] == expected


# -- close ------------------------------------------------------------------


def test_closed_store_raises(store):
    store.close()
    with pytest.raises(StoreClosedError):
        store.get(b"k")
    with pytest.raises(StoreClosedError):
        store.write([(b"k", b"v")])
    with pytest.raises(StoreClosedError):
        store.iterate()


def test_close_is_idempotent(store):
    store.close()
    store.close()


def test_close_during_iteration_raises(store):
    store.write([(b"a", b""), (b"b", b"")])
    it = store.iterate()
    next(it)
    store.close()
    with pytest.raises(StoreClosedError):
        next(it)


def test_context_manager_closes(store):
    with store as s:
        assert s is store
        s.write([(b"k", b"v")])
    with pytest.raises(StoreClosedError):
        store.get(b"k")


# -- model-based ------------------------------------------------------------

EDGE_KEYS = [b"", b"a", b"a/", b"ab", b"\x00", b"\xff", b"\xff\xff"]
KEYS = st.binary(max_size=3) | st.sampled_from(EDGE_KEYS)
OPS = st.lists(st.tuples(KEYS, st.none() | st.binary(max_size=4)), max_size=24)


class StoreMachine(RuleBasedStateMachine):
    """Random batches against a dict model; LevelDB also reopens."""

    backend = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp()
        self.store = make_store(self.backend, self.dir)
        self.model: dict[bytes, bytes] = {}

    @rule(ops=OPS, sync=st.booleans())
    def write(self, ops, sync):
        self.store.write(ops, sync=sync)
        for k, v in ops:
            if v is None:
                self.model.pop(k, None)
            else:
                self.model[k] = v

    @rule(ops=OPS, data=st.data())
    def bad_write(self, ops, data):
        at = data.draw(st.integers(0, len(ops)))
        with pytest.raises(TypeError):
            self.store.write([*ops[:at], ("bad", b""), *ops[at:]])

    @rule(key=KEYS)
    def get(self, key):
        assert self.store.get(key) == self.model.get(key)

    @rule(prefix=st.binary(max_size=2), reverse=st.booleans())
    def iterate(self, prefix, reverse):
        want = sorted(((k, v) for k, v in self.model.items() if k.startswith(prefix)),
                      reverse=reverse)
        assert list(self.store.iterate(prefix, reverse=reverse)) == want

    @precondition(lambda self: self.backend == "leveldb")
    @rule()
    def reopen(self):
        self.store.close()
        self.store = make_store(self.backend, self.dir)

    @invariant()
    def matches_model(self):
        assert list(self.store.iterate()) == sorted(self.model.items())

    def teardown(self):
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class LevelDBMachine(StoreMachine):
    backend = "leveldb"


_machine_settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
TestMemoryStoreModel = StoreMachine.TestCase
TestMemoryStoreModel.settings = _machine_settings
TestLevelDBStoreModel = LevelDBMachine.TestCase
TestLevelDBStoreModel.settings = _machine_settings


# -- LevelDB only -----------------------------------------------------------


def test_leveldb_persists_across_reopen(tmp_path):
    path = tmp_path / "db"
    with LevelDBStore(path) as s:
        s.write([(b"a", b"1"), (b"b", b"2"), (b"b", None)])
    with LevelDBStore(path, create=False) as s:
        assert items(s) == [(b"a", b"1")]


def test_leveldb_second_open_is_locked(tmp_path):
    path = tmp_path / "db"
    with LevelDBStore(path):
        with pytest.raises(StoreLockedError, match=str(path)):
            LevelDBStore(path)
    LevelDBStore(path).close()  # the lock went with the first handle


def test_leveldb_locked_by_another_process(tmp_path):
    path = tmp_path / "db"
    LevelDBStore(path).close()
    hold = "import sys, plyvel; db = plyvel.DB(sys.argv[1]); print('open', flush=True); input()"
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout.readline() == b"open\n"
        with pytest.raises(StoreLockedError, match=str(path)):
            LevelDBStore(path)
    finally:
        holder.communicate(b"\n", timeout=10)
    LevelDBStore(path).close()


def test_leveldb_missing_without_create(tmp_path):
    path = tmp_path / "missing"
    with pytest.raises(StoreError, match="does not exist") as info:
        LevelDBStore(path, create=False)
    assert not isinstance(info.value, StoreLockedError)
    assert not path.exists()


def test_leveldb_corruption_is_reported(tmp_path):
    path = tmp_path / "db"
    with LevelDBStore(path) as s:
        s.write([(b"k%d" % i, b"v" * 100) for i in range(100)])
    for manifest in glob.glob(str(path / "MANIFEST-*")):
        with open(manifest, "wb") as f:
            f.write(b"garbage" * 10)
    with pytest.raises(StoreCorruptError):
        LevelDBStore(path)


def test_open_store_picks_backend(tmp_path):
    with open_store(None) as s:
        assert isinstance(s, MemoryStore)
    with open_store(str(tmp_path / "db")) as s:
        assert isinstance(s, LevelDBStore)
