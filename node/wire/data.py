"""The job-data protocol's messages: `/pnode/data/1.0.0`.

Owns `DataRequest` and `DataReply`: a node asks a peer for a byte range of
a file it names by its SHA-256 (a job's training text, `node.mine.data`),
and the peer answers with the file's total size and the range. A peer that
does not have the file answers a total of 0. The asker checks the whole
file's hash once it has every range (specs/consensus.md 5.6).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from ledger.codec import U32, U64, Hash32, MaxLen, wire

DATA_PROTOCOL = "/pnode/data/1.0.0"
#: Most bytes of one reply's range (the request's ``length`` is cut to it).
MAX_DATA_CHUNK = 1 << 20
#: Largest job data file a node fetches or serves.
MAX_DATA_FILE = 1 << 30
#: A request frame is far smaller; a reply carries one chunk and a little framing.
MAX_DATA_REQUEST, MAX_DATA_REPLY = 128, MAX_DATA_CHUNK + 1024


@wire(92)
@dataclass(frozen=True, slots=True)
class DataRequest:
    """Bytes ``[offset, offset + length)`` of the file whose SHA-256 is ``sha256``."""

    sha256: Hash32
    offset: U64
    length: U32


@wire(93)
@dataclass(frozen=True, slots=True)
class DataReply:
    """The file's size (0: not here) and the asked range of it (cut at its end)."""

    total: U64
    chunk: Annotated[bytes, MaxLen(MAX_DATA_CHUNK)]
