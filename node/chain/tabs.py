"""The chain as a serving node's cashier sees it: admit a tab or claim, look a tab up.

Owns `ChainTabs`, the ``ledger`` of `node.serve.cashier.Cashier` (node.serve
does not import node.chain): admission goes through `TxGossip.submit` (the
mempool, then gossip), lookups through `ChainService.call` (alone with the
ChainDB).
"""

from __future__ import annotations

from typing import Any

from ledger import schema
from ledger.accounts import check_nonce
from ledger.state import TAB
from ledger.tab import OpenTab
from ledger.tabrules import check_open_tab
from ledger.types import tx_hash
from node.chain.sync import ChainService
from node.chain.txgossip import TxGossip


class ChainTabs:
    """Tab admission and lookups on a running node's chain."""

    def __init__(self, service: ChainService, txs: TxGossip):
        self.service, self.txs = service, txs

    @property
    def chain_id(self) -> str:
        return self.service.chain.chain_id

    async def vet(self, tab: OpenTab) -> int:
        """Whether ``tab`` would land (now, or after its predecessors): the height.

        Raises:
            ValidationError: funds, lanes, expiry, or a nonce used (`BadNonce`,
                ``ahead`` when its predecessors may still come).
        """
        return await self.service.call(self._vet, tab)

    def _vet(self, tab: OpenTab) -> int:
        chain = self.service.chain
        tab_id = tx_hash(tab)
        if (chain.state.get(TAB + tab_id) is not None
                or chain.store.get(schema.mempool_key(tab_id)) is not None):
            return chain.height  # admitted already (another lane's server gossiped it)
        st, ctx = chain.pending_state()
        check_open_tab(st, ctx, tab)  # before the nonce: an unfunded tab ahead fails at once
        check_nonce(st, tab.client, tab.nonce)
        return chain.height

    async def admit(self, tx: Any) -> bytes:
        """Admit ``tx`` to the mempool and gossip it; its id. Raises ValidationError."""
        return await self.txs.submit(tx)

    async def lookup(self, tab_id: bytes, txids: list[bytes]
                     ) -> tuple[int, Any, frozenset[bytes]]:
        """(height, the tab's `TabRecord` or None, which of ``txids`` are in the mempool)."""
        return await self.service.call(self._lookup, tab_id, txids)

    def _lookup(self, tab_id: bytes, txids: list[bytes]) -> tuple[int, Any, frozenset[bytes]]:
        chain = self.service.chain
        queued = frozenset(t for t in txids
                           if chain.store.get(schema.mempool_key(t)) is not None)
        return chain.height, chain.state.get(TAB + tab_id), queued
