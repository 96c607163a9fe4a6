"""The chain service: sync and fork choice, transaction gossip, block production, registration.

Sub-modules: `sync` (`ChainService`: the store, the mempool, sync with
peers), `txgossip`, `producer` (blocks in this node's slots), `registrar`
(registers a serving node once it is funded). No torch here.
"""

from node.chain.sync import ChainService, SyncError, SyncResult
from node.chain.txgossip import TxGossip
from node.chain.producer import earliest_slot_ms, Producer, seal_block
from node.chain.registrar import Registrar

__all__ = [
    "ChainService", "Producer", "Registrar", "SyncError", "SyncResult", "TxGossip",
    "earliest_slot_ms", "seal_block",
]
