"""The transport: a libp2p host on trio with Noise, pnode's yamux, gossipsub and length framing.

Sub-modules: `host` (`Host`, `open_host`: dial, listen, request/response,
gossip), `identity` (`PeerIdentity`), `listen` (a taken port is an error),
`framing` (length-prefixed frames on a stream), `yamux` (the muxer).
Nothing here knows the chain, the model or the node's other parts.
"""

from node.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "node.net.framing": (
        "DEFAULT_MAX_FRAME_SIZE", "FrameEOF", "FrameReader", "FrameStreamError", "FrameTimeout",
        "FrameTooLarge", "FramingError", "read_frame", "write_frame",
    ),
    "node.net.host": (
        "DialError", "GossipError", "Host", "LocalFault", "RequestError", "ResponseTooLarge",
        "open_host",
    ),
    "node.net.identity": ("HostError", "PeerIdentity"),
    "node.net.listen": ("AddressInUse", "check_port_free"),
})
