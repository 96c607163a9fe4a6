"""The key-value storage layer (L1) under everything the ledger persists.

This module owns the `KeyValueStore` contract and its two backends:
`MemoryStore` (tests, throwaway nodes) and `LevelDBStore` (on disk, via
plyvel). Keys and values are opaque bytes; what they mean belongs to the
layers above. Every write is an atomic, ordered batch, and every iteration
reads one consistent snapshot, so callers never see half a block.

On disk faults `LevelDBStore` is strict (specs/ledger.md, "Storage faults"):
a write that fails closes the handle for good (`StoreFailedError`), so no
later write can land after a torn one; it opens with LevelDB's paranoid
checks, so recovery that would drop damaged log records is noticed and
reported (`recovery_loss`), or refused in strict mode; and every read checks
block checksums, so a flipped byte reads as `StoreCorruptError`, never as
other data.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import re
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, Self, runtime_checkable

import plyvel

from ledger.errors import (
    StoreClosedError, StoreCorruptError, StoreError, StoreFailedError, StoreLockedError,
    StoreRecoveryError,
)

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
    """A store in a LevelDB directory, one process at a time.

    Attributes:
        recovery_loss: None when the store opened cleanly; else one line
            saying what LevelDB's recovery dropped (damaged log records) to
            open it, which the owner must report.
    """

    __slots__ = ("_path", "_db", "_failed", "recovery_loss")

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True,
                 strict: bool = False) -> None:
        """Open (or create) the database at `path`.

        Args:
            path: the LevelDB directory.
            create: create the database when it does not exist.
            strict: refuse to open a store whose recovery would drop data,
                rather than open it and report the loss in `recovery_loss`.

        Raises:
            StoreLockedError: another process (or handle) has it open.
            StoreError: it does not exist and create is False, or cannot open.
            StoreRecoveryError: strict, and recovery would drop damaged records.
            StoreCorruptError: its files are damaged beyond what recovery skips.
        """
        self._path = os.fspath(path)
        self._failed: str | None = None
        self.recovery_loss: str | None = None
        if not os.path.exists(os.path.join(self._path, "CURRENT")):
            # Without CURRENT, create_if_missing would start an empty database
            # over the old one and delete its tables as obsolete.
            lost = _lost_current_message(self._path)
            if lost or not create:
                raise StoreError(lost or f"store {self._path} does not exist")
        try:
            with self._translate():
                self._db = plyvel.DB(self._path, create_if_missing=create, paranoid_checks=True)
            return
        except StoreCorruptError as exc:
            damage = str(exc)
        if strict:
            raise StoreRecoveryError(f"{damage}; opening it would drop what is damaged "
                                     "(refused in strict mode)")
        with self._translate():  # what a non-paranoid open skips, LOG tells
            plyvel.DB(self._path, paranoid_checks=False).close()
        dropped = _dropped_bytes(os.path.join(self._path, "LOG"))
        what = f"{dropped} bytes of damaged records" if dropped else "damaged records"
        self.recovery_loss = f"{damage}: LevelDB recovery dropped {what} to open it"
        with self._translate():  # recovered: from here on, paranoid again
            self._db = plyvel.DB(self._path, paranoid_checks=True)

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
        if self._failed is not None:
            raise StoreFailedError(f"store {self._path} was closed when a write failed "
                                   f"({self._failed}): open it again once the cause is fixed")
        if self._db.closed:
            raise StoreClosedError(f"store {self._path} is closed")
        return self._db

    def get(self, key: bytes) -> bytes | None:
        """See KeyValueStore.get; LevelDB failures raise StoreError."""
        db = self._require_open()
        _check_bytes("key", key)
        with self._translate():
            return db.get(key, verify_checksums=True)

    def write(self, ops: Iterable[Op], *, sync: bool = True) -> None:
        """See KeyValueStore.write; `sync` fsyncs LevelDB's log.

        Raises:
            StoreFailedError: LevelDB failed to write (the batch may be torn
                in its log); the store is closed from now on, see the class.
        """
        db = self._require_open()
        batch = _validated(ops)
        try:
            with db.write_batch(transaction=True, sync=sync) as wb:
                for key, value in batch:
                    if value is None:
                        wb.delete(key)
                    else:
                        wb.put(key, value)
        except plyvel.Error as e:
            self._failed = _msg(e)
            db.close()
            raise StoreFailedError(f"store {self._path}: a write failed ({self._failed}); "
                                   "the store is closed so that no later write lands "
                                   "after a torn one") from e

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
            with self._translate(), snapshot.raw_iterator(verify_checksums=True) as it:
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
        if getattr(self, "_db", None) is not None:
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


_DROPPED = re.compile(rb"\(ignoring error\).*dropping (\d+) bytes")


def _dropped_bytes(log_file: str) -> int:
    """The bytes LevelDB's last open says it dropped ("(ignoring error) ... dropping N bytes")."""
    try:
        with open(log_file, "rb") as f:
            return sum(int(m.group(1)) for m in _DROPPED.finditer(f.read()))
    except OSError:
        return 0


def _lost_current_message(path: str) -> str | None:
    """What to do about a store whose CURRENT file is gone but whose data is there; None if no data."""
    try:
        manifests = sorted(n for n in os.listdir(path) if n.startswith("MANIFEST-"))
    except OSError:
        manifests = []
    if not manifests:
        return None
    # CURRENT names the live manifest; the newest one is it unless a crash
    # came mid-switch, which LevelDB's own repair also assumes.
    return (f"store {path} has lost its CURRENT file, though its data is there "
            f"({len(manifests)} manifest(s)): restore it with "
            f"`echo {manifests[-1]} > {os.path.join(path, 'CURRENT')}` and start again")


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
