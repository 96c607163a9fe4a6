"""The transport: a libp2p host on trio with Noise, pnode's yamux, gossipsub and length framing.

Sub-modules: `host` (`Host`, `open_host`: dial, listen, request/response,
gossip), `identity` (`PeerIdentity`), `framing` (length-prefixed frames on a
stream), `yamux` (the muxer). Nothing here knows the chain, the model or the
node's other parts.
"""

from node.net.framing import (
    DEFAULT_MAX_FRAME_SIZE, FrameEOF, FrameReader, FrameStreamError, FrameTimeout, FrameTooLarge,
    FramingError, read_frame, write_frame,
)
from node.net.host import DialError, GossipError, Host, open_host, RequestError
from node.net.identity import HostError, PeerIdentity

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE", "DialError", "FrameEOF", "FrameReader", "FrameStreamError",
    "FrameTimeout", "FrameTooLarge", "FramingError", "GossipError", "Host", "HostError",
    "PeerIdentity", "RequestError", "open_host", "read_frame", "write_frame",
]
