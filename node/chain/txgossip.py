"""Transaction gossip: the mempools of a swarm's nodes fill from one another.

Owns the topic ``pnode/txs/1`` (specs/network.md, "Transaction gossip"). A
message is one ``encode(tx)`` of a ledger transaction type.

- `TxGossip.submit` admits a transaction this node was handed (the control
  socket's ``submit_tx``) to the mempool and publishes it.
- The topic's validator (`Host.set_validator`) admits every transaction
  heard; gossipsub relays only those this node admitted.

Who is at fault for a transaction that does not fit? Only what is wrong
whatever the chain state is scores its origin (`Host.penalize`, one point):
bytes that do not decode to a transaction, a bad signature, another chain's
id, an impossible amount (`FAULTS`). Everything else (a used or skipped
nonce, too few coins, an unregistered node) may be a race between the
transaction and a block, so it is dropped unscored. A transaction already in
the mempool is a duplicate: ignored, not relayed again. All mempool work runs
through `ChainService.call`, single-threaded with the rest of the ChainDB
work.
"""

from __future__ import annotations

import logging
from typing import Any

import trio
from libp2p.peer.id import ID

from ledger import schema
from ledger.codec import decode, encode
from ledger.errors import BadAmount, BadSignature, DecodeError, ValidationError, WrongChainId
from ledger.types import TX_TYPES, tx_hash
from node.chain.sync import ChainService
from node.net import GossipError
from node.wire import TXS_TOPIC

log = logging.getLogger(__name__)

#: Rejections that prove the origin at fault whatever the state (scored).
FAULTS = (BadSignature, WrongChainId, BadAmount)

_ADMITTED, _DUPLICATE = "admitted", "duplicate"


class TxGossip:
    """Admits transactions to the mempool and gossips them over one `ChainService`."""

    def __init__(self, service: ChainService):
        self.service = service
        self.admitted = 0  # transactions heard by gossip and admitted
        self.rejected = 0  # ... and refused (scored or not)

    async def run(self, *, task_status: trio.TaskStatus[TxGossip] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Validate the transactions heard on the topic until cancelled."""
        host = self.service.host
        host.set_validator(TXS_TOPIC, self._on_gossip)
        try:
            await host.join(TXS_TOPIC)
            task_status.started(self)
            await host.wait_stopped()
        finally:
            host.set_validator(TXS_TOPIC, None)

    async def submit(self, tx: Any) -> bytes:
        """Admit ``tx`` to this node's mempool and gossip it.

        Returns:
            The transaction's hash (also when it was already queued).

        Raises:
            ValidationError: the transaction does not fit the next block
                (after the ones already queued); nothing is gossiped.
        """
        status, txid = await self.service.call(self._admit, tx)
        if status == _ADMITTED:
            try:
                await self.service.host.publish(TXS_TOPIC, encode(tx))
            except GossipError as exc:  # too large, or the host stopped: stays local
                log.warning("transaction %s not gossiped: %s", txid.hex()[:16], exc)
        return txid

    def _admit(self, tx: Any) -> tuple[str, bytes]:
        """Admit ``tx`` unless it is queued already (worker thread)."""
        chain = self.service.chain
        txid = tx_hash(tx)
        if chain.store.get(schema.mempool_key(txid)) is not None:
            return _DUPLICATE, txid
        return _ADMITTED, chain.admit(tx)

    async def _on_gossip(self, origin: ID, data: bytes, forwarder: ID) -> bool:
        """The topic's validator: relay a transaction only if this node admitted it."""
        try:
            tx = decode(data, TX_TYPES)
        except DecodeError as exc:
            self.rejected += 1
            self.service.host.penalize(origin, 1, f"undecodable gossiped transaction: {exc}")
            return False
        try:
            status, txid = await self.service.call(self._admit, tx)
        except FAULTS as exc:
            self.rejected += 1
            self.service.host.penalize(
                origin, 1, f"invalid gossiped transaction: {type(exc).__name__}: {exc}")
            return False
        except ValidationError as exc:
            self.rejected += 1
            log.info("gossiped transaction from %s dropped: %s: %s",
                     origin, type(exc).__name__, exc)
            return False
        if status == _DUPLICATE:
            return False
        self.admitted += 1
        log.debug("admitted gossiped transaction %s from %s", txid.hex()[:16], origin)
        return True
