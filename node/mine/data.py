"""A node's job data: text files kept by their SHA-256, served to peers and fetched from them.

Owns `DataShelf` (specs/consensus.md 5.6). A job whose data is a file names
it on chain by content only (`DataSpec(source="file", sha256=H)`; the
path is a local matter and not part of the job's spec), so every miner must
get the same bytes: the submitter's `pnode job submit` puts the file on its
node's shelf (``DATA_DIR/data/<sha256>``), every node serves its shelf over
`/pnode/data/1.0.0`, and a miner that lacks a job's file fetches it there,
range by range, from its peers, and keeps it only if the whole file has
the hash. Whitepaper 3.3 leaves data storage open; this is the simplest
answer that keeps the data verifiable: content addressing, held by whoever
posted or mined the job. A job's initial model (``init``, a model file by
SHA-256) travels the same way (`DataShelf.resolve_model`). No torch here
(`resolve_model` imports `compute.pretrained` when a miner calls it).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import trio

from compute.hashing import file_sha256
from ledger.codec import decode, encode
from ledger.errors import DecodeError
from node.errors import DataUnavailable
from node.net import Host, RequestError
from node.wire import (
    DATA_PROTOCOL, MAX_DATA_CHUNK, MAX_DATA_FILE, MAX_DATA_REPLY, MAX_DATA_REQUEST, DataReply,
    DataRequest,
)

log = logging.getLogger(__name__)

#: Ranges a fetch asks for at once.
IN_FLIGHT = 8

__all__ = ["DataShelf", "file_sha256"]


class DataShelf:
    """Job data files of one data dir, by SHA-256 (module docstring).

    Args:
        root: the shelf's directory (``DATA_DIR/data``; made when first written).
        host: the node's host, to serve and fetch (None: local use only).
    """

    def __init__(self, root: Path, host: Host | None = None) -> None:
        self.root, self.host = Path(root), host
        self.served = 0  # bytes sent to peers

    def path(self, sha256: str) -> Path:
        """Where the file of ``sha256`` (64 hex digits) is, or would be, kept."""
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise ValueError(f"not a SHA-256 in hex: {sha256!r}")
        return self.root / sha256

    def has(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def add(self, src: Path) -> str:
        """Keep a copy of ``src`` on the shelf; return its SHA-256 (hex)."""
        sha = file_sha256(src)
        if not self.has(sha):
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = self.root / f".{sha}.part"
            shutil.copyfile(src, tmp)
            os.replace(tmp, self.path(sha))
        return sha

    async def resolve_model(self, sha256: str, peers: Iterable) -> Path:
        """Make the model file of ``sha256`` (a job's ``init``) known to `compute.pretrained`:
        the bundled one, one already known, the shelf's, or fetched from ``peers``.

        A job may start from any model file by hash (an earlier job's export, say):
        its submitter's node keeps the file on its shelf, as it does the data.

        Raises:
            DataUnavailable: no peer sent a file with that hash.
        """
        from compute.errors import ModelFileError
        from compute.pretrained import model_file, register_model_file

        try:
            return await trio.to_thread.run_sync(model_file, sha256)
        except ModelFileError:
            pass
        path = await self.fetch(sha256, peers)  # the shelf's, or checked by hash on arrival
        register_model_file(path, sha256)
        return path

    # -- serving ------------------------------------------------------------------------

    def install(self) -> None:
        """Answer `/pnode/data/1.0.0` on the host (any peer may ask: job data is public)."""
        self.host.set_request_handler(DATA_PROTOCOL, self.serve,
                                      max_request_size=MAX_DATA_REQUEST, public=True)

    async def serve(self, peer, request: bytes) -> bytes:
        """One range of a kept file; a total of 0 when the file is not here.

        Raises:
            DecodeError: not a `DataRequest` (the host resets the stream and scores the peer).
        """
        req = decode(request, DataRequest)
        path = self.path(req.sha256.hex())
        length = min(req.length, MAX_DATA_CHUNK)

        def read() -> tuple[int, bytes]:
            try:
                with open(path, "rb") as f:
                    total = os.fstat(f.fileno()).st_size
                    f.seek(req.offset)
                    return total, f.read(length)
            except FileNotFoundError:
                return 0, b""
        total, chunk = await trio.to_thread.run_sync(read)
        self.served += len(chunk)
        return encode(DataReply(total, chunk))

    # -- fetching -----------------------------------------------------------------------

    async def fetch(self, sha256: str, peers: Iterable, timeout_s: float = 30.0) -> Path:
        """The file of ``sha256``: from the shelf, else from the first of ``peers`` that has it.

        Raises:
            DataUnavailable: no peer sent a file with that hash.
        """
        if self.has(sha256):
            return self.path(sha256)
        for peer in peers:
            try:
                return await self._fetch_from(peer, sha256, timeout_s)
            except (RequestError, DecodeError, DataUnavailable) as exc:
                log.info("data %s.. from %s: %s", sha256[:16], peer, exc)
        raise DataUnavailable(f"no peer has the file {sha256[:16]}.. (the job's submitter's "
                              "node serves it while it runs)")

    async def _fetch_from(self, peer, sha256: str, timeout_s: float) -> Path:
        """The whole file from ``peer``: the first range says its size, the rest come
        ``IN_FLIGHT`` at a time (one round trip each would leave the link idle)."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{sha256}.{os.getpid()}.part"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                first = await self._range(peer, sha256, 0, None, timeout_s)
                total = first.total
                os.pwrite(fd, first.chunk, 0)
                limiter = trio.CapacityLimiter(IN_FLIGHT)

                async def one(offset: int) -> None:
                    async with limiter:
                        reply = await self._range(peer, sha256, offset, total, timeout_s)
                        await trio.to_thread.run_sync(os.pwrite, fd, reply.chunk, offset)
                async with trio.open_nursery() as nursery:
                    for offset in range(len(first.chunk), total, MAX_DATA_CHUNK):
                        nursery.start_soon(one, offset)
            finally:
                os.close(fd)
            got = await trio.to_thread.run_sync(file_sha256, tmp)
            if got != sha256:
                raise DataUnavailable(f"its file has another SHA-256, {got[:16]}..")
            os.replace(tmp, self.path(sha256))
            return self.path(sha256)
        finally:
            tmp.unlink(missing_ok=True)

    async def _range(self, peer, sha256: str, offset: int, total: int | None,
                     timeout_s: float) -> DataReply:
        """One range of the file, checked to be the whole range asked for (cut at the end)."""
        reply = decode(await self.host.request(
            peer, DATA_PROTOCOL, encode(DataRequest(bytes.fromhex(sha256), offset,
                                                    MAX_DATA_CHUNK)),
            timeout=timeout_s, max_response_size=MAX_DATA_REPLY), DataReply)
        if not 0 < reply.total <= MAX_DATA_FILE or (total is not None and reply.total != total):
            raise DataUnavailable(f"it has no such file (size {reply.total})")
        if len(reply.chunk) != min(MAX_DATA_CHUNK, reply.total - offset):
            raise DataUnavailable(f"the range at {offset} of {reply.total} bytes came "
                                  f"{len(reply.chunk)} bytes long")
        return reply
