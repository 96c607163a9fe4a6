"""The chain service: sync and fork choice, transaction gossip, block production, registration.

Sub-modules: `sync` (`ChainService`: the store, the mempool, sync with
peers), `txgossip`, `producer` (blocks in this node's slots), `registrar`
(registers a serving node once it is funded), `tabs` (a serving node's
tab admission and lookups, for its cashier), `desk` (the wallet desk: light
clients' accounts, registry and submissions), `views` (an account and a
node's status and the registered nodes as the CLIs show them), `jobviews`
(the chain's jobs), `work` (a job's miners and receipts: the one place
blocks are scanned for receipts). No torch here.
"""

from node.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "node.chain.producer": ("Producer", "earliest_slot_ms", "seal_block"),
    "node.chain.registrar": ("Registrar",),
    "node.chain.sync": ("ChainService", "SyncError", "SyncResult"),
    "node.chain.tabs": ("ChainTabs",),
    "node.chain.desk": ("WalletDesk",),
    "node.chain.txgossip": ("TxGossip",),
    "node.chain.views": ("LOCAL_ONLY", "account_view", "history_view", "node_status_view",
                         "read_views", "receipts_view", "registry_view"),
    "node.chain.history": ("history_rows",),
    "node.chain.jobviews": ("find_by_prefix", "find_job", "given_up", "job_view", "jobs_view"),
    "node.chain.work": ("AROUND_RECEIPT_BLOCKS", "CLOSED_STEP_BLOCKS", "bonded_peers",
                        "job_named", "receipt_at", "receipts_between", "step_receipts",
                        "unit_receipt"),
})
