"""The key-value storage layer (L1) under everything the ledger persists.

This module owns the `KeyValueStore` contract and its two backends:
`MemoryStore` (tests, throwaway nodes) and `LevelDBStore` (on disk, via
plyvel). Keys and values are opaque bytes; what they mean belongs to the
layers above. Every write is an atomic, ordered batch, and every iteration
reads one consistent snapshot, so callers never see half a block.
"""

from __future__ import annotations

import bisect
import contextlib
import os
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, Self, runtime_checkable

import plyvel

from ledger.errors import StoreClosedError, StoreCorruptError, StoreError, StoreLockedError

Op = tuple[bytes, bytes | None]  # value None means delete
Item = tuple[bytes, bytes]


@runtime_checkable
class KeyValueStore(Protocol):
    """An ordered bytes-to-bytes map with atomic batch writes.

    Every method of a closed store raises StoreClosedError, except close().
    Backends subclass this to inherit the context-manager methods.
    """

    __slots__ = ()

    def get(self, key: bytes) -> bytes | None:
        """Return the value at `key`, or None when absent.

        Raises:
            TypeError: key is not bytes.
        """

    def write(self, ops: Iterable[Op], *, sync: bool = True) -> None:
        """Apply puts and deletes in order, all or nothing.

        Args:
            ops: (key, value) pairs, value None to delete; later ops win.
            sync: make the batch durable before returning.

        Raises:
            TypeError: an op is malformed; nothing is applied.
        """

    def iterate(self, prefix: bytes = b"", *, reverse: bool = False) -> Iterator[Item]:
        """Walk the keys starting with `prefix` in byte order, on a snapshot.

        The snapshot is taken by this call, not the first next().

        Args:
            prefix: only keys starting with these bytes (b"" for all).
            reverse: descending instead of ascending order.

        Returns:
            An iterator of (key, value); next() raises StoreClosedError once
            the store is closed.

        Raises:
            TypeError: prefix is not bytes.
        """

    def close(self) -> None:
        """Release the store; calling it again does nothing."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _check_bytes(name: str, value: object) -> None:
    if not isinstance(value, bytes):
        raise TypeError(f"{name} must be bytes, not {type(value).__name__}")


def _validated(ops: Iterable[Op]) -> list[Op]:
    """Return the batch as a list, or raise TypeError on a malformed op."""
    # Collect first: a generator failing midway, or a bad last op, must fail
    # before the backend has seen a single op.
    batch = list(ops)
    for i, op in enumerate(batch):
        if not isinstance(op, tuple) or len(op) != 2:
            raise TypeError(f"op {i} must be a (key, value) tuple, not {op!r}")
        key, value = op
        _check_bytes(f"op {i} key", key)
        if value is not None:
            _check_bytes(f"op {i} value", value)
    return batch


class MemoryStore(KeyValueStore):
    """A dict-backed store; nothing survives close()."""

    __slots__ = ("_data", "_keys", "_closed")

    # Above this many added/removed keys in one batch, re-sorting the whole
    # key list beats shifting it once per key.
    _INSORT_LIMIT = 16

    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}
        self._keys: list[bytes] = []  # always sorted, same keys as _data
        self._closed = False

    def _require_open(self) -> None:
        if self._closed:
            raise StoreClosedError("memory store is closed")

    def get(self, key: bytes) -> bytes | None:
        """See KeyValueStore.get."""
        self._require_open()
        _check_bytes("key", key)
        return self._data.get(key)

    def write(self, ops: Iterable[Op], *, sync: bool = True) -> None:
        """See KeyValueStore.write; `sync` is moot in memory."""
        self._require_open()
        batch = _validated(ops)
        data = self._data
        existed: dict[bytes, bool] = {}  # first touch of each key: was it there?
        for key, value in batch:
            existed.setdefault(key, key in data)
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        added = [k for k, was in existed.items() if not was and k in data]
        removed = [k for k, was in existed.items() if was and k not in data]
        self._reindex(added, removed)

    def _reindex(self, added: list[bytes], removed: list[bytes]) -> None:
        if len(added) + len(removed) > self._INSORT_LIMIT:
            self._keys = sorted(self._data)
            return
        for key in removed:
            del self._keys[bisect.bisect_left(self._keys, key)]
        for key in added:
            bisect.insort(self._keys, key)

    def iterate(self, prefix: bytes = b"", *, reverse: bool = False) -> Iterator[Item]:
        """See KeyValueStore.iterate; the snapshot is a copy of the range."""
        self._require_open()
        _check_bytes("prefix", prefix)
        keys, end = self._keys, _prefix_end(prefix)
        start = bisect.bisect_left(keys, prefix)
        stop = len(keys) if end is None else bisect.bisect_left(keys, end, start)
        snapshot = [(k, self._data[k]) for k in keys[start:stop]]
        if reverse:
            snapshot.reverse()
        return self._walk(snapshot)

    def _walk(self, snapshot: list[Item]) -> Iterator[Item]:
        for item in snapshot:
            self._require_open()
            yield item

    def close(self) -> None:
        """Drop the contents; further use raises StoreClosedError."""
        self._closed, self._data, self._keys = True, {}, []


class LevelDBStore(KeyValueStore):
    """A store in a LevelDB directory, one process at a time."""

    __slots__ = ("_path", "_db")

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True) -> None:
        """Open (or create) the database at `path`.

        Args:
            path: the LevelDB directory.
            create: create the database when it does not exist.

        Raises:
            StoreLockedError: another process (or handle) has it open.
            StoreError: it does not exist and create is False, or cannot open.
            StoreCorruptError: its files are damaged.
        """
        self._path = os.fspath(path)
        # LevelDB leaves a LOCK and LOG behind even when it refuses to create
        # the database; CURRENT is the file every LevelDB database has.
        if not create and not os.path.exists(os.path.join(self._path, "CURRENT")):
            raise StoreError(f"store {self._path} does not exist")
        with self._translate():
            self._db = plyvel.DB(self._path, create_if_missing=create)

    @contextlib.contextmanager
    def _translate(self) -> Iterator[None]:
        """Turn plyvel's exceptions into the ledger's store errors."""
        try:
            yield
        except plyvel.CorruptionError as e:
            raise StoreCorruptError(f"store {self._path} is corrupt: {_msg(e)}") from e
        except plyvel.Error as e:
            msg = _msg(e)
            if isinstance(e, plyvel.IOError) and "lock" in msg.lower():
                raise StoreLockedError(f"store {self._path} is locked: open elsewhere") from e
            raise StoreError(f"store {self._path}: {msg}") from e
        except RuntimeError as e:
            # plyvel's only signal for "used after close" is RuntimeError.
            if getattr(self, "_db", None) is not None and self._db.closed:
                raise StoreClosedError(f"store {self._path} is closed") from e
            raise

    def _require_open(self) -> plyvel.DB:
        if self._db.closed:
            raise StoreClosedError(f"store {self._path} is closed")
        return self._db

    def get(self, key: bytes) -> bytes | None:
        """See KeyValueStore.get; LevelDB failures raise StoreError."""
        db = self._require_open()
        _check_bytes("key", key)
        with self._translate():
            return db.get(key)

    def write(self, ops: Iterable[Op], *, sync: bool = True) -> None:
        """See KeyValueStore.write; `sync` fsyncs LevelDB's log.

        Raises:
            StoreError: LevelDB failed; the batch is not applied.
        """
        db = self._require_open()
        batch = _validated(ops)
        with self._translate(), db.write_batch(transaction=True, sync=sync) as wb:
            for key, value in batch:
                if value is None:
                    wb.delete(key)
                else:
                    wb.put(key, value)

    def iterate(self, prefix: bytes = b"", *, reverse: bool = False) -> Iterator[Item]:
        """See KeyValueStore.iterate; reads a LevelDB snapshot."""
        db = self._require_open()
        _check_bytes("prefix", prefix)
        with self._translate():
            snapshot = db.snapshot()
        return self._walk(snapshot, prefix, reverse)

    def _walk(self, snapshot: Any, prefix: bytes, reverse: bool) -> Iterator[Item]:
        # A raw iterator, not iterator(prefix=..., reverse=True): plyvel 1.5.1
        # yields nothing in reverse when exactly one key lies in the range.
        try:
            with self._translate(), snapshot.raw_iterator() as it:
                _seek_first(it, prefix, reverse)
                step = it.prev if reverse else it.next
                while it.valid() and (key := it.key()).startswith(prefix):
                    yield key, it.value()
                    step()
        finally:
            if not self._db.closed:
                snapshot.close()

    def close(self) -> None:
        """Close the database; calling it again does nothing."""
        self._db.close()


def _seek_first(it: Any, prefix: bytes, reverse: bool) -> None:
    """Put `it` on the first key of the prefix range in walking order."""
    end = _prefix_end(prefix)
    if not reverse:
        it.seek(prefix)
    elif end is None:
        it.seek_to_last()
    else:
        it.seek(end)  # lands on the first key past the range, if there is one
        if it.valid():
            it.prev()
        else:
            it.seek_to_last()


def _prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key above every key starting with `prefix`; None if none."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _msg(e: Exception) -> str:
    """plyvel puts LevelDB's status text in args[0] as bytes."""
    arg = e.args[0] if e.args else ""
    return arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)


def open_store(path: str | os.PathLike[str] | None) -> KeyValueStore:
    """Open the store a node was configured with.

    Args:
        path: a LevelDB directory (created if missing), or None for memory.

    Returns:
        A MemoryStore when path is None, else a LevelDBStore.

    Raises:
        StoreError: the LevelDB store cannot be opened (see LevelDBStore).
    """
    if path is None:
        return MemoryStore()
    return LevelDBStore(path)
