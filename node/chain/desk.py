"""The wallet desk: a node answers light clients' accounts, registry and submissions.

Owns `WalletDesk`, the server of ``/pnode/wallet/1.0.0`` (specs/network.md
9.7): a client that runs no node of its own (`pwallet --peers ADDR`) reads
its account (`node.chain.account_view`, the mempool's queued transactions
counted in its next nonce) and the registered nodes
(`node.chain.registry_view`) and submits signed transactions, which go
through `TxGossip.submit` as the control socket's ``submit_tx`` does. A
request that does not decode resets the stream and scores the peer (the
host's rule); a transaction the chain refuses is answered with the reason.

Attack note: every submission costs a mempool admission (it applies the
queued transactions first); the host's per-peer stream limits bound how
fast one peer can ask.
"""

from __future__ import annotations

from libp2p.peer.id import ID

from ledger.codec import decode, encode
from ledger.errors import DecodeError, ValidationError
from ledger.types import TX_TYPES
from node.chain.sync import ChainService
from node.chain.txgossip import TxGossip
from node.chain.views import account_view, registry_view
from node.wire import (
    MAX_WALLET_REQUEST, WALLET_PROTOCOL, AccountInfo, AccountQuery, RegisteredEntry,
    RegistryInfo, RegistryQuery, SubmitTx, TxResult,
)


class WalletDesk:
    """Serves ``/pnode/wallet/1.0.0`` from a running node's chain."""

    def __init__(self, service: ChainService, txs: TxGossip):
        self.service, self.txs = service, txs

    def install(self) -> None:
        """Register the request handler on the node's host (public: clients use it)."""
        self.service.host.set_request_handler(WALLET_PROTOCOL, self._serve,
                                              max_request_size=MAX_WALLET_REQUEST, public=True)

    async def _serve(self, peer: ID, data: bytes) -> bytes:
        msg = decode(data, (AccountQuery, SubmitTx, RegistryQuery))  # garbage: reset, scored
        if isinstance(msg, AccountQuery):
            view = await self.service.call(account_view, self.service.chain, msg.account)
            return encode(AccountInfo(view["chain_id"], view["height"], view["balance"],
                                      view["bond"], view["nonce"], view["next_nonce"]))
        if isinstance(msg, RegistryQuery):
            view = await self.service.call(registry_view, self.service.chain)
            nodes = tuple(RegisteredEntry(n["peer_id"], bytes.fromhex(n["node_key"]),
                                          bytes.fromhex(n["account"]), n["bond"], *n["layers"])
                          for n in view["nodes"])
            return encode(RegistryInfo(view["chain_id"], view["height"], nodes))
        try:
            txid = await self.txs.submit(decode(msg.tx, TX_TYPES))
        except (DecodeError, ValidationError) as exc:
            return encode(TxResult(False, bytes(32), f"{type(exc).__name__}: {exc}"[:256]))
        return encode(TxResult(True, txid, ""))
