"""The transport: a libp2p host on trio with Noise, pnode's yamux, gossipsub and length framing.

Sub-modules: `host` (`Host`, `open_host`: dial, listen, request/response),
`gossip` (the host's topics: join, subscribe, publish, validators), `bans`
(misbehaviour points and bans), `peers` (`PeerKeeper`: joining a node's
peers, redialling lost ones, syncing again now and then; `AloneWatch`), `identity` (`PeerIdentity`), `listen`
(a taken port is an error), `framing` (length-prefixed frames on a
stream), `yamux` (the muxer).
Nothing here knows the chain, the model or the node's other parts.
"""

from node.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "node.net.framing": (
        "DEFAULT_MAX_FRAME_SIZE", "MIN_TRANSFER_RATE", "FrameEOF", "FrameReader",
        "FrameStreamError", "FrameTimeout", "FrameTooLarge", "FramingError", "frame_deadline",
        "read_frame", "write_frame",
    ),
    "node.net.host": (
        "DialError", "Host", "LocalFault", "RequestError", "RequestTimeout", "ResponseTooLarge",
        "open_host",
    ),
    "node.net.gossip": ("GossipError",),
    "node.net.identity": ("HostError", "PeerIdentity"),
    "node.net.peers": ("REDIAL_CAP_S", "AloneWatch", "PeerKeeper"),
    "node.net.listen": ("AddressInUse", "check_port_free"),
})
