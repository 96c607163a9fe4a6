"""Where a `PolArchive` puts what it keeps: in memory, or in a node's data dir.

Owns `MemoryStore` (nothing outlives the process: tests, benches, the
archive a window file is judged from) and `DirStore`, a node's ``D/pol/``
(specs/pol.md 8):

    D/pol/journal          the archive's index: one JSON record a line (`PolArchive`'s)
    D/pol/tensors/<hex>    a kept tensor, named by its `tensor_digest`, as a raw wire
                           tensor (compute/wiretensor.py: bit-exact, what /pnode/pol sends)
    D/pol/certs/<hex>      a certificate's encoding, named by its `cert_hash`
    D/pol/evidence/<hex>   an evidence's encoding, named by its `evidence_hash`

A store holds payloads by key and knows no rules: which keys are kept, with
which step, is the archive's, and reaches disk only as journal records.

Crash safety. A payload file is written to a temporary name, fsynced and
renamed, and its directory is fsynced before the journal line that names it
is appended (and fsynced): so a crash leaves a file whole or absent, and a
line never names a file that a crash can take back. A torn journal line
does not parse and is skipped. A file whose line never came is an orphan,
deleted at open (`sweep`), as are temporary files. Every read re-checks a
file against its name (a tensor must decode and have its digest, an object
must hash to its key under its domain); a file that does not (torn by a
disk that lies about fsync, rotted, truncated by hand) is deleted and read
as missing: the store may lose a payload, it never serves a wrong one.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from compute.wiretensor import WireTensorError, decode_tensor, encode_tensor
from ledger.crypto import H_CERT, H_EVIDENCE, domain_hash
from proof_of_learning.units import tensor_digest

log = logging.getLogger(__name__)

__all__ = ["CERT", "DirStore", "EVIDENCE", "MemoryStore", "OBJECT_KINDS"]

#: The kinds of object (encoded, kept by hash) and the domain each hash is taken under.
CERT, EVIDENCE = "cert", "evidence"
OBJECT_KINDS = {CERT: H_CERT, EVIDENCE: H_EVIDENCE}
_DIRS = {"tensor": "tensors", CERT: "certs", EVIDENCE: "evidence"}
JOURNAL = "journal"
_TMP = ".tmp"


class MemoryStore:
    """Payloads in dictionaries: what a `PolArchive` without a directory keeps."""

    durable = False

    def __init__(self) -> None:
        self._tensors: dict[bytes, torch.Tensor] = {}
        self._objects: dict[tuple[str, bytes], bytes] = {}
        self.appended = 0

    def put_tensors(self, tensors: Mapping[bytes, torch.Tensor]) -> set[bytes]:
        """Keep CPU tensors by digest (the first kept of a digest stays); returns the digests."""
        for digest, t in tensors.items():
            self._tensors.setdefault(digest, t)
        return set(tensors)

    def tensor(self, digest: bytes) -> torch.Tensor | None:
        return self._tensors.get(digest)

    def put_object(self, kind: str, key: bytes, data: bytes) -> bool:
        self._objects[(kind, key)] = data
        return True

    def object(self, kind: str, key: bytes) -> bytes | None:
        return self._objects.get((kind, key))

    def drop_tensors(self, digests: Iterable[bytes]) -> None:
        for d in digests:
            self._tensors.pop(d, None)

    def drop_objects(self, kind: str, keys: Iterable[bytes]) -> None:
        for key in keys:
            self._objects.pop((kind, key), None)

    def append(self, records: list[dict]) -> bool:
        return True

    def records(self) -> list[dict]:
        return []

    def rewrite(self, records: list[dict]) -> bool:
        return True

    def sweep(self, tensors: set[bytes], objects: Mapping[str, set[bytes]]) -> int:
        return 0


class DirStore:
    """Payloads in files under ``path`` (module docstring), and the journal that indexes them.

    Every method that writes catches `OSError` (a full disk, a directory
    made read-only), logs it and reports what it could not do: an archive
    that cannot write forfeits those audits, the node mines on.
    """

    durable = True

    def __init__(self, path: str | os.PathLike[str], *, sync_each: bool = True):
        """
        Args:
            path: the archive's directory (made if missing).
            sync_each: fsync every write before it returns (the default);
                False leaves durability to `flush`, which the node calls
                every `SYNC_S` seconds: a crash of the process loses
                nothing (the page cache outlives it), a crash of the
                machine loses at most the last seconds' units, each then
                read as missing (the digest check on read), never served
                wrong.
        """
        self.path = Path(path)
        self.sync_each = sync_each
        for sub in _DIRS.values():
            (self.path / sub).mkdir(parents=True, exist_ok=True)
        self.journal = self.path / JOURNAL
        self.appended = 0  # journal lines since the last rewrite
        self._dirty: set[Path] = set()  # directories with renames not yet fsynced

    def _file(self, kind: str, key: bytes) -> Path:
        return self.path / _DIRS[kind] / key.hex()

    # -- payloads -----------------------------------------------------------------------

    def put_tensors(self, tensors: Mapping[bytes, torch.Tensor]) -> set[bytes]:
        """Write each tensor under its digest; returns the digests written.

        A tensor the wire cannot carry (non-finite values, another dtype) is
        left out, and logged: `/pnode/pol` could not have served it either.
        """
        files = {}
        for digest, t in tensors.items():
            try:
                files[self._file("tensor", digest)] = digest, encode_tensor(t)
            except WireTensorError as exc:
                log.warning("pol archive: tensor %s.. not kept: %s", digest.hex()[:16], exc)
        written = self._write({path: data for path, (_, data) in files.items()})
        return {files[path][0] for path in written}

    def tensor(self, digest: bytes) -> torch.Tensor | None:
        """The tensor kept under ``digest``; None when absent or not what its name says
        (then deleted)."""
        path = self._file("tensor", digest)
        data = self._read(path)
        if data is None:
            return None
        try:
            t = decode_tensor(data)
        except WireTensorError as exc:
            return self._bad(path, f"does not decode ({exc})")
        if tensor_digest(t) != digest:
            return self._bad(path, "holds another tensor than its name's")
        return t

    def put_object(self, kind: str, key: bytes, data: bytes) -> bool:
        """Write an encoded certificate or evidence (``kind``) under its hash."""
        return bool(self._write({self._file(kind, key): data}))

    def object(self, kind: str, key: bytes) -> bytes | None:
        """An object's encoding; None when absent or not hashing to ``key`` (then deleted)."""
        path = self._file(kind, key)
        data = self._read(path)
        if data is None:
            return None
        if domain_hash(OBJECT_KINDS[kind], data) != key:
            return self._bad(path, f"does not hash to its name under the {kind} domain")
        return data

    def drop_tensors(self, digests: Iterable[bytes]) -> None:
        for d in digests:
            self._unlink(self._file("tensor", d))

    def drop_objects(self, kind: str, keys: Iterable[bytes]) -> None:
        for key in keys:
            self._unlink(self._file(kind, key))

    # -- the journal --------------------------------------------------------------------

    def append(self, records: list[dict]) -> bool:
        """Append records, one JSON line each, fsynced, after the files they name are
        durable.

        Returns:
            False when they could not be written (then `rewrite` before the next).
        """
        try:
            self._sync_dirs()
            with open(self.journal, "ab") as f:
                f.write(b"".join(_line(r) for r in records))
                f.flush()
                if self.sync_each:
                    os.fsync(f.fileno())
        except OSError as exc:
            log.warning("pol archive: journal not written (%s): rewritten at the next "
                        "change", exc)
            return False
        self.appended += len(records)
        return True

    def records(self) -> list[dict]:
        """The journal's records in order; a line that does not parse (torn) is skipped."""
        try:
            raw = self.journal.read_bytes()
        except FileNotFoundError:
            return []
        out, bad = [], 0
        for line in raw.split(b"\n"):
            if not line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if isinstance(record, dict):
                out.append(record)
            else:
                bad += 1
        if bad:
            log.warning("pol archive: %d journal line(s) in %s skipped (torn or damaged)",
                        bad, self.journal)
        return out

    def rewrite(self, records: list[dict]) -> bool:
        """Replace the journal by ``records`` (what the archive keeps now), atomically."""
        if not self._write({self.journal: b"".join(_line(r) for r in records)}):
            return False
        try:
            self._sync_dirs()
        except OSError as exc:
            log.warning("pol archive: %s not synced: %s", self.path, exc)
            return False
        self.appended = 0
        return True

    def sweep(self, tensors: set[bytes], objects: Mapping[str, set[bytes]]) -> int:
        """Delete every file no record names, and temporary files; returns how many."""
        wanted = {"tensor": tensors, **objects}
        gone = 0
        for kind, sub in _DIRS.items():
            keep = {k.hex() for k in wanted.get(kind, ())}
            for entry in os.scandir(self.path / sub):
                if entry.name not in keep:
                    gone += self._unlink(Path(entry.path))
        for entry in os.scandir(self.path):
            if entry.name.endswith(_TMP):
                gone += self._unlink(Path(entry.path))
        return gone

    # -- files --------------------------------------------------------------------------

    def _write(self, files: Mapping[Path, bytes]) -> set[Path]:
        """Write each file through a temporary one, fsynced, then renamed over it; returns
        those written (one that fails, a full disk, is left out and logged).

        All are written before any is fsynced: one commit of the filesystem's
        journal then serves many, where a write and an fsync each cost one
        commit each (ten times the time, measured on ext4)."""
        written, done, failed = [], set(), None
        for path, data in files.items():
            tmp = path.with_name(path.name + _TMP)
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                written.append((tmp, path))
            except OSError as exc:
                failed = exc
                self._unlink(tmp)
        for tmp, path in written:
            try:
                if self.sync_each:
                    fd = os.open(tmp, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                os.replace(tmp, path)
                done.add(path)
            except OSError as exc:
                failed = exc
                self._unlink(tmp)
        if failed is not None:
            log.warning("pol archive: %d of %d files not written in %s: %s",
                        len(files) - len(done), len(files), self.path, failed)
        self._dirty.update(path.parent for path in done)
        return done

    def flush(self) -> None:
        """Make every write so far durable (`sync_each` False): the files' data, their
        names and the journal, by one `os.sync` (safe from any thread: no Python state)."""
        os.sync()

    def _sync_dirs(self) -> None:
        """fsync the directories renamed into, so the names are as durable as the data."""
        if not self.sync_each:
            self._dirty.clear()  # `flush` syncs them
            return
        while self._dirty:
            where = self._dirty.pop()
            fd = os.open(where, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _read(self, path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("pol archive: %s not read: %s", path, exc)
            return None

    def _bad(self, path: Path, why: str) -> None:
        log.warning("pol archive: %s %s: deleted, read as missing", path, why)
        self._unlink(path)
        return None

    def _unlink(self, path: Path) -> int:
        try:
            path.unlink()
            return 1
        except FileNotFoundError:
            return 0
        except OSError as exc:
            log.warning("pol archive: %s not deleted: %s", path, exc)
            return 0


def _line(record: dict) -> bytes:
    return json.dumps(record, separators=(",", ":"), sort_keys=True).encode() + b"\n"
