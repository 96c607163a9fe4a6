"""The yamux wire format (specs/network.md section 1a), and what a stream needs of its connection.

Owns the frame header and its constants, `YamuxProtocolError`, `take` (the
cheap lock acquire every writer uses) and `StreamOwner`: the calls a
`node.net.yamux.stream.YamuxStream` makes on the connection that owns it.
Naming the connection by a protocol keeps the stream module free of the
connection module (no import circle), while `YamuxConnection` implements it.
"""

from __future__ import annotations

import struct
from typing import Any, Protocol

import trio
from libp2p.stream_muxer.exceptions import MuxedStreamError

PROTOCOL_ID = "/yamux/1.0.0"
HEADER = struct.Struct(">BBHII")  # version, type, flags, stream id, length
VERSION = 0
DATA, WINDOW_UPDATE, PING, GO_AWAY = 0, 1, 2, 3
SYN, ACK, FIN, RST = 1, 2, 4, 8
GO_AWAY_NORMAL, GO_AWAY_PROTOCOL_ERROR = 0, 1
INITIAL_WINDOW = 256 * 1024  # the spec's initial (and here also maximum) stream window
MAX_CHUNK = 65_535 - 16 - HEADER.size  # one data frame fits one Noise message


class YamuxProtocolError(MuxedStreamError):
    """A frame that breaks the yamux protocol; the connection ends."""


class StreamOwner(Protocol):
    """The connection side of a stream: what `YamuxStream` calls."""

    buffered: int  # bytes received and not yet read, over all streams

    def queue(self, kind: int, flags: int, stream_id: int, length: int) -> None:
        """Queue a frame that must not wait (window update, RST)."""

    async def send_frame(self, kind: int, flags: int, stream_id: int, length: int,
                         body: Any = b"") -> None:
        """Write one frame whole."""

    def forget_if_done(self, stream: Any) -> None:
        """Drop ``stream`` from the connection once it is done both ways."""

    def get_remote_address(self) -> tuple[str, int] | None:
        """The peer's address, as libp2p's muxed connections give it."""


async def take(lock: trio.Lock) -> None:
    """Acquire ``lock``; a free one (the usual case) costs no trip through trio."""
    try:
        lock.acquire_nowait()
    except trio.WouldBlock:
        await lock.acquire()
