"""Every message between peers and clients, with its protocol id or topic (no trio, libp2p or torch).

Sub-modules: `sync` (chain sync, block and transaction topics), `serve`
(swarm announcements and inference sessions), `span` (`ServerInfo`: the span
record servers and clients read from an announcement), `train` (training
pushes and state sync), `averaging` (replica averaging). Each message is a frozen,
slotted dataclass registered with the ledger codec, so ``decode(data, T)``
refuses any other tag, a field out of range, or trailing bytes. Limits live
next to the shapes they bound, so both ends agree on them.

Codec tags (the ledger's own objects use 1-40; a tag is never reused):

    50-53  sync: TipRequest, TipResponse, BlocksRequest, BlocksResponse
    57-65  serve: Announce, SwarmRequest, SwarmResponse, OpenSession,
           SessionAccepted, Busy, Step, StepResult, SessionError
    66-68  averaging: AverageOffer, AverageReply, NamedTensor
    69-71  train: StepTensors, StateRequest, StateReply
    72-74  serve (push routing): Link, Linked, PushOpen
"""

from node.wire.averaging import (
    AVERAGING_PROTOCOL, MAX_AVERAGING_FRAME, AverageOffer, AverageReply, Named, NamedTensor,
)
from node.wire.serve import (
    ANNOUNCE_TOPIC, INFERENCE_PROTOCOL, MAX_ANNOUNCES, MAX_CHUNKS, MAX_HIDDEN_BYTES,
    MAX_INFERENCE_FRAME, MAX_SWARM_FRAME, PUSH_PROTOCOL, S_ANNOUNCE, SWARM_PROTOCOL, Addrs,
    Announce, Busy, ClientMessage, Link, Linked, ModelId, OpenSession, PushOpen, SessionAccepted,
    SessionError, sign_announce, Step, StepResult, SwarmRequest, SwarmResponse, Text,
)
from node.wire.span import ServerInfo, SpanError
from node.wire.sync import (
    BLOCKS_TOPIC, MAX_BLOCKS_PER_REQUEST, MAX_BLOCKS_RESPONSE_BYTES, MAX_SYNC_REQUEST_FRAME,
    MAX_SYNC_RESPONSE_FRAME, SYNC_PROTOCOL, TXS_TOPIC, BlocksRequest, BlocksResponse,
    encode_blocks_response, SyncRequest, TipRequest, TipResponse, Weight,
)
from node.wire.train import (
    ACTIVATION, ATTN_PARTIAL, ATTN_SHARE, CLIENT, EMBED_GRADS, GRADIENT, HEAD_GRADS,
    MAX_TRAIN_FRAME, MLP_PARTIAL, MLP_SHARE, SECTION_GRADS, STATE_PROTOCOL, TRAIN_PROTOCOL,
    WHATS, StateReply, StateRequest, StepTensors,
)

__all__ = [
    "ACTIVATION", "ANNOUNCE_TOPIC", "ATTN_PARTIAL", "ATTN_SHARE", "AVERAGING_PROTOCOL", "Addrs",
    "Announce", "AverageOffer", "AverageReply", "BLOCKS_TOPIC", "BlocksRequest",
    "BlocksResponse", "Busy", "CLIENT", "ClientMessage", "EMBED_GRADS", "GRADIENT",
    "HEAD_GRADS", "INFERENCE_PROTOCOL", "Link", "Linked", "MAX_ANNOUNCES", "MAX_AVERAGING_FRAME",
    "MAX_BLOCKS_PER_REQUEST", "MAX_BLOCKS_RESPONSE_BYTES", "MAX_CHUNKS", "MAX_HIDDEN_BYTES",
    "MAX_INFERENCE_FRAME", "MAX_SWARM_FRAME", "MAX_SYNC_REQUEST_FRAME",
    "MAX_SYNC_RESPONSE_FRAME", "MAX_TRAIN_FRAME", "MLP_PARTIAL", "MLP_SHARE", "ModelId", "Named",
    "NamedTensor", "OpenSession", "PUSH_PROTOCOL", "PushOpen", "SECTION_GRADS", "STATE_PROTOCOL",
    "SWARM_PROTOCOL", "SYNC_PROTOCOL", "S_ANNOUNCE", "SessionAccepted", "SessionError",
    "StateReply", "StateRequest", "Step", "StepResult", "StepTensors", "SwarmRequest",
    "SwarmResponse", "SyncRequest", "TRAIN_PROTOCOL", "TXS_TOPIC", "Text", "TipRequest",
    "TipResponse", "WHATS", "Weight", "encode_blocks_response", "sign_announce",
]
