"""A wallet without a node of its own: its account, the registry, submissions, over a peer.

Owns the client of ``/pnode/wallet/1.0.0`` (specs/network.md 9.7):
`LightPeer` asks the peer it dials (``pwallet --peers ADDR``) for an
account (the fields `node.chain.account_view` gives), the registered nodes
(the fields `node.chain.registry_view` gives, so `wallet.registry` reads
them as it reads a local node's) and submits signed transactions. It trusts
that peer for what it reads, as a light wallet trusts its server; what it
submits is signed, so the peer cannot alter it.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from libp2p.peer.id import ID

from ledger.codec import decode, encode
from ledger.errors import DecodeError
from node.net import DialError, Host, PeerIdentity, RequestError, open_host
from node.wire import (
    WALLET_PROTOCOL, AccountInfo, AccountQuery, RegistryInfo, RegistryQuery, SubmitTx, TxResult,
)
from wallet.errors import RemoteError, WalletError


class TxRefused(WalletError):
    """The peer's chain refused a submitted transaction (the reason says which rule)."""


class LightPeer:
    """Account reads and submissions through one peer (``peer_id``) of a running host."""

    def __init__(self, host: Host, peer_id: ID):
        self.host, self.peer_id = host, peer_id

    async def _ask(self, message, answer_type):
        try:
            data = await self.host.request(self.peer_id, WALLET_PROTOCOL, encode(message),
                                           timeout=15.0)
            return decode(data, answer_type)
        except (RequestError, DecodeError) as exc:
            raise RemoteError(f"{self.peer_id} did not answer the wallet protocol: {exc}") from None

    async def account(self, account_id: bytes) -> dict[str, Any]:
        """The account as `node.chain.account_view` gives it (``running``: False)."""
        info = await self._ask(AccountQuery(account_id), AccountInfo)
        return {"address": account_id.hex(), "chain_id": info.chain_id, "height": info.height,
                "balance": info.balance, "bond": info.bond, "nonce": info.nonce,
                "queued": info.next_nonce - info.nonce, "next_nonce": info.next_nonce,
                "running": False, "peer": str(self.peer_id)}

    async def registry(self) -> dict[str, Any]:
        """The registered, bonded nodes, as `node.chain.registry_view` gives them."""
        info = await self._ask(RegistryQuery(), RegistryInfo)
        return {"chain_id": info.chain_id, "height": info.height,
                "nodes": [{"peer_id": n.peer_id, "node_key": n.node_key.hex(),
                           "account": n.account.hex(), "bond": n.bond,
                           "layers": [n.layer_start, n.layer_end]} for n in info.nodes]}

    async def submit(self, tx: Any) -> bytes:
        """Submit a signed transaction; its id once the peer admitted it.

        Raises:
            TxRefused: the peer's chain refused it (the reason names the rule).
        """
        result = await self._ask(SubmitTx(encode(tx)), TxResult)
        if not result.ok:
            raise TxRefused(f"the peer refused the transaction: {result.reason}")
        return result.txid


@asynccontextmanager
async def light_peer(addr: str) -> AsyncIterator[LightPeer]:
    """A fresh client host connected to ``addr`` (a multiaddr with /p2p/).

    Raises:
        RemoteError: the peer cannot be reached.
    """
    async with open_host(PeerIdentity.from_seed(os.urandom(32))) as host:
        try:
            peer = await host.connect(addr)
        except DialError as exc:
            raise RemoteError(f"no peer reachable: {exc}") from None
        yield LightPeer(host, peer)
