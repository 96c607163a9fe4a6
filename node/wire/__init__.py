"""Every message between peers and clients, with its protocol id or topic (no trio, libp2p or torch).

Sub-modules: `sync` (chain sync, block and transaction topics), `wallet`
(a light client's account, registry and submissions), `serve`
(swarm announcements and inference sessions), `span` (`ServerInfo`: the span
record servers and clients read from an announcement), `train` (training
pushes and state sync), `averaging` (replica averaging), `pol`
(Proof-of-Learning fetches), `data` (a job's training text by its hash). Each message is a frozen, slotted dataclass
registered with the ledger codec, so ``decode(data, T)`` refuses any other
tag, a field out of range, or trailing bytes. Limits live next to the
shapes they bound, so both ends agree on them.

Tag 84 is `node.serve.cashier.KeptTab`, a record a server keeps on disk, not
a message. Step (63) and the spot-check evidence (75-77) are defined in
`ledger.spot` (a `SpotFraud` transaction carries them) and re-exported by
`serve`; their tags stay here. Codec tags (the ledger's own objects use
1-49; a tag is never reused):

    50-53  sync: TipRequest, TipResponse, BlocksRequest, BlocksResponse
    57-65  serve: Announce, SwarmRequest, SwarmResponse, OpenSession,
           SessionAccepted, Busy, Step, StepResult, SessionError
    66-68  averaging: AverageOffer, AverageReply, NamedTensor
    69-71  train: StepTensors, StateRequest, StateReply
    72-74  serve (push routing): Link, Linked, PushOpen
    75-77  serve (spot checks): StepClaim, SignedAnswer, SpotEvidence
    78-81  pol: PolRequest, PolReply, PolWindow, NamedSet
    82-83  serve (paid sessions): Settle, Settled
    85-91  wallet desk: AccountQuery, AccountInfo, SubmitTx, TxResult, RegistryQuery,
           RegisteredEntry, RegistryInfo
    92-93  data: DataRequest, DataReply
    94-94  serve (spot checks): StepCopy
"""

from node.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "node.wire.averaging": (
        "AVERAGING_PROTOCOL", "MAX_AVERAGING_FRAME", "AverageOffer", "AverageReply", "Named",
        "NamedTensor",
    ),
    "node.wire.serve": (
        "ANNOUNCE_TOPIC", "INFERENCE_PROTOCOL", "MAX_ANNOUNCES", "MAX_CHUNKS", "MAX_HIDDEN_BYTES",
        "MAX_INFERENCE_FRAME", "MAX_OPEN_FRAME", "MAX_POSITIONS", "MAX_TAB_BYTES",
        "MAX_VOUCHER_BYTES", "MAX_SWARM_FRAME", "PUSH_PROTOCOL",
        "SWARM_PROTOCOL", "S_ANNOUNCE", "Addrs", "Announce", "Busy", "ClientMessage", "Link",
        "Linked", "ModelId", "OpenSession", "PushOpen", "SessionAccepted", "SessionError", "Step",
        "StepResult", "SwarmRequest", "SwarmResponse", "Text", "sign_announce", "Settle",
        "Settled",
        "S_STEP", "SignedAnswer", "SpotEvidence", "StepClaim", "TAB_ENDS", "TAB_REFUSED",
        "session_id", "step_claim", "EMPTY_HISTORY", "MAX_EVIDENCE_BYTES", "MAX_EVIDENCE_STEPS",
        "InputHistory", "StepCopy", "check_evidence", "history_of", "input_hash",
        "next_history", "step_positions",
    ),
    "node.wire.pol": (
        "CERT", "EVIDENCE", "MAX_POL_FRAME", "MAX_POL_REQUEST", "MAX_WINDOW_ITEMS",
        "MAX_WINDOW_JOB", "NAMED",
        "POL_KINDS", "POL_PROTOCOL", "STATE", "TENSOR", "NamedSet", "PolReply", "PolRequest",
        "PolWindow",
    ),
    "node.wire.span": ("CLAIM_MARGIN", "CREDIT_POSITIONS", "ServerInfo", "SpanError",
                       "TAB_LANDING", "charge", "credit", "serve_until"),
    "node.wire.wallet": (
        "MAX_REGISTRY", "MAX_TX_BYTES", "MAX_WALLET_REQUEST", "WALLET_PROTOCOL", "AccountInfo",
        "AccountQuery", "RegisteredEntry", "RegistryInfo", "RegistryQuery", "SubmitTx",
        "TxResult",
    ),
    "node.wire.sync": (
        "BLOCKS_TOPIC", "MAX_BLOCKS_PER_REQUEST", "MAX_BLOCKS_RESPONSE_BYTES",
        "MAX_SYNC_REQUEST_FRAME", "MAX_SYNC_RESPONSE_FRAME", "SYNC_PROTOCOL", "TXS_TOPIC",
        "BlocksRequest", "BlocksResponse", "SyncRequest", "TipRequest", "TipResponse", "Weight",
        "encode_blocks_response",
    ),
    "node.wire.data": (
        "DATA_PROTOCOL", "MAX_DATA_CHUNK", "MAX_DATA_FILE", "MAX_DATA_REPLY", "MAX_DATA_REQUEST",
        "DataReply", "DataRequest",
    ),
    "node.wire.train": (
        "ACTIVATION", "ATTN_PARTIAL", "ATTN_SHARE", "CLIENT", "EMBED_GRADS", "GRADIENT",
        "HEAD_GRADS", "MAX_TRAIN_FRAME", "MLP_PARTIAL", "MLP_SHARE", "SECTION_GRADS",
        "STATE_PROTOCOL", "TRAIN_PROTOCOL", "WHATS", "StateReply", "StateRequest", "StepTensors",
    ),
})
