"""The peer book: the peers a node reached, kept across restarts in ``D/peers/``.

A small LevelDB of its own (`ledger.store.LevelDBStore`), not a prefix of
the chain store: the chain store holds consensus data only (`pnode verify
chain`, strict recovery and a fresh ``pnode init`` all concern it, and a
peer list must not be in their way), and the peer book is written without
an fsync per entry (losing the last entries in a crash costs a redial, never
a block). specs/network.md section 5a states the format and the policy.

    peer/<full multiaddr, UTF-8, with /p2p/<id>>  ->  last seen, ms, 8-byte big-endian

An entry that does not parse (a key that is not UTF-8 or lacks ``/p2p/``, a
value that is not 8 bytes) is skipped when read, never fatal: the book is a
hint, and a damaged hint must not keep a node from starting.
"""

from __future__ import annotations

import logging
import os

from ledger.store import LevelDBStore

log = logging.getLogger(__name__)

__all__ = ["MAX_PEERS", "PEER_PREFIX", "PeerBook"]

PEER_PREFIX = b"peer/"
#: Most entries kept; recording one more drops the least recently seen.
MAX_PEERS = 256
_MAX_ADDR = 512  # bytes; a longer key is not an address this node wrote


def _parse(key: bytes, value: bytes) -> tuple[str, int] | None:
    """``(addr, last_seen_ms)`` of one entry, or None when it is malformed."""
    if not key.startswith(PEER_PREFIX) or len(value) != 8 or len(key) > _MAX_ADDR:
        return None
    try:
        addr = key[len(PEER_PREFIX):].decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not addr.startswith("/") or "/p2p/" not in addr or not addr.rsplit("/p2p/", 1)[1]:
        return None
    return addr, int.from_bytes(value, "big")


class PeerBook:
    """The addresses of peers this node reached, with when it last did.

    Args:
        path: the LevelDB directory (``D/peers``); created when missing.
        limit: most entries kept (oldest dropped first).

    Raises:
        StoreError: the directory is locked by another process or cannot be opened.
    """

    def __init__(self, path: str | os.PathLike[str], *, limit: int = MAX_PEERS) -> None:
        self.store = LevelDBStore(path)
        self.limit = limit

    def entries(self) -> dict[str, int]:
        """Every well-formed entry: address -> last seen (ms); malformed ones skipped."""
        found: dict[str, int] = {}
        for key, value in self.store.iterate(PEER_PREFIX):
            parsed = _parse(key, value)
            if parsed is None:
                log.warning("peer book: skipping a malformed entry %r", key[:80])
                continue
            found[parsed[0]] = parsed[1]
        return found

    def addrs(self) -> list[str]:
        """The stored addresses, most recently seen first."""
        found = self.entries()
        return sorted(found, key=lambda a: (-found[a], a))

    def record(self, addr: str, seen_ms: int) -> None:
        """Note that ``addr`` (a full multiaddr with ``/p2p/``) was reached at ``seen_ms``.

        Beyond ``limit`` entries the least recently seen go, malformed ones first.

        Raises:
            ValueError: ``addr`` is not a full multiaddr with ``/p2p/<id>``.
        """
        key = PEER_PREFIX + addr.encode("utf-8")
        if _parse(key, seen_ms.to_bytes(8, "big")) is None:
            raise ValueError(f"not a full peer multiaddr: {addr!r}")
        ops: list[tuple[bytes, bytes | None]] = [(key, seen_ms.to_bytes(8, "big"))]
        kept: list[tuple[int, bytes]] = []
        for k, v in self.store.iterate(PEER_PREFIX):
            if k == key:
                continue
            parsed = _parse(k, v)
            if parsed is None:
                ops.append((k, None))  # a malformed entry: dropped while we are here
            else:
                kept.append((parsed[1], k))
        kept.sort()
        for _, old in kept[:max(0, len(kept) + 1 - self.limit)]:
            ops.append((old, None))
        self.store.write(ops, sync=False)

    def close(self) -> None:
        self.store.close()
