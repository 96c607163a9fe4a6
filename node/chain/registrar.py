"""Registering a running node on the chain once its wallet can lock the bond.

Owns `Registrar`, the component `pnode start` runs for a serving node
(specs/consensus.md section 4): at start and after every new tip it looks
at the chain; when this node's key has no registration and none is queued,
it either submits a signed `Register` (the wallet key signs it, the node key
and the peer key both sign the binding of the node key and the peer id to
the account, the served span is the registered layers, the bond is ``bond``
or the chain's ``min_bond``) or says once, clearly, why it cannot: the
wallet is locked (no passphrase given), or its balance is below the bond
(with the address to fund). Registered for another span than the one
served (a restart with other ``--layers``, or a span given at `pnode init`
that the model does not have), it registers again with the served span and
no further bond (`Register` on a registered account updates its layers).
Registered for the served span, it says so once and stops, or, for a
node that places itself (its span a function of what it serves now), goes
on looking at every new tip and registers the span it moved to.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import trio

from ledger.crypto import SigningKey
from ledger.errors import ValidationError
from ledger.state import ACCOUNT, KEY_PARAMS, NODE
from ledger.genesis import node_registration
from ledger.types import Register, format_coins
from node.chain.sync import ChainService
from node.chain.txgossip import TxGossip

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Look:
    """What the chain says about this node's registration (from a worker thread)."""

    registered: bool
    queued: bool
    balance: int
    nonce: int
    bond: int
    chain_id: str
    tip: bytes
    layers: tuple[int, int] | None  # of the registration, once registered


class Registrar:
    """Registers ``node_key`` with the wallet's bond when it can.

    Args:
        service, txs: the node's chain service and transaction gossip.
        wallet: the wallet's signing key, or None when it is locked.
        address: the wallet's account (known even when locked).
        node_key: this node's key; peer_key: its libp2p identity key (which
            signs the binding of its peer id too).
        layers: the span to register (the one served), or a function returning it
            now: a serving node that moves to other layers registers them again.
        bond: base units to lock (None: the chain's ``min_bond``).
        report: where the one-line messages go.
    """

    def __init__(self, service: ChainService, txs: TxGossip, wallet: SigningKey | None,
                 address: bytes, node_key: SigningKey, peer_key: SigningKey,
                 layers: tuple[int, int] | Callable[[], tuple[int, int]], *,
                 bond: int | None = None, report: Callable[[str], None] = lambda line: None):
        self.service, self.txs, self.wallet, self.address = service, txs, wallet, address
        self.node_key, self.peer_key = node_key, peer_key
        self._span = layers if callable(layers) else (lambda: layers)
        self._moving = callable(layers)
        self.bond, self.report = bond, report
        self.registered = False
        self._said: str | None = None

    @property
    def layers(self) -> tuple[int, int]:
        """The span served now (the one to register)."""
        return tuple(self._span())

    async def run(self, *, task_status: trio.TaskStatus[Registrar] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Check at start and at every new tip: register, or register the served span again
        once it moved (a fixed span: until registered)."""
        task_status.started(self)
        while True:
            look = await self.service.call(self._look)
            if look.registered and look.layers == self.layers:
                self.registered = True
                start, end = look.layers
                self._say(f"registered on chain {look.chain_id}: layers {start}:{end}, bond "
                          f"{format_coins(look.bond)}")
                if not self._moving:
                    return
            elif not look.queued:
                await (self._move(look) if look.registered else self._try(look))
            await self.service.wait_tip_change(look.tip)

    def _look(self) -> _Look:
        chain = self.service.chain
        account = chain.state.get(ACCOUNT + self.address)
        record = chain.state.get(NODE + self.node_key.public)
        settled = record is not None and (record.layer_start, record.layer_end) == self.layers
        queued = not settled and any(  # the mempool is read only while something is due
            isinstance(tx, Register) and tx.node_key == self.node_key.public
            for tx in chain.mempool())
        bond = self.bond if self.bond is not None else chain.state.get(KEY_PARAMS).min_bond
        return _Look(record is not None, queued, account.balance if account else 0,
                     account.nonce if account else 0,
                     account.bond if (account and record) else bond, chain.chain_id,
                     chain.tip_hash,
                     (record.layer_start, record.layer_end) if record else None)

    async def _try(self, look: _Look) -> None:
        if self.wallet is None:
            self._say("not registered: the wallet is locked (start with PNODE_PASSPHRASE set "
                      "or --passphrase-file to register this node)")
            return
        if look.balance < look.bond:
            self._say(f"not registered: balance {format_coins(look.balance)} is below the "
                      f"bond of {format_coins(look.bond)}; send coins to "
                      f"{self.address.hex()} and it registers by itself")
            return
        txid = await self._submit(look, look.bond, "not registered")
        if txid is not None:
            self._say(f"registering: layers {self.layers[0]}:{self.layers[1]}, bond "
                      f"{format_coins(look.bond)} (tx {txid.hex()[:16]}..)")

    async def _move(self, look: _Look) -> None:
        """Register again, bonding nothing more: the chain's span is not the one served."""
        span, old = f"{self.layers[0]}:{self.layers[1]}", f"{look.layers[0]}:{look.layers[1]}"
        if self.wallet is None:
            self._say(f"registered for layers {old} but serving {span}: the wallet is locked "
                      "(start with PNODE_PASSPHRASE set or --passphrase-file to register "
                      "the served span)")
            return
        txid = await self._submit(look, 0, "not re-registered")
        if txid is not None:
            self._say(f"re-registering: layers {span} (registered {old}; tx "
                      f"{txid.hex()[:16]}..)")

    async def _submit(self, look: _Look, bond: int, failed: str) -> bytes | None:
        """Submit a `Register` of the served span locking ``bond``; its id, or None (said)."""
        register = node_registration(look.chain_id, self.wallet, self.node_key, self.peer_key,
                                     self.layers, bond, look.nonce)
        try:
            return await self.txs.submit(register)
        except ValidationError as exc:
            self._say(f"{failed}: the registration was refused: {type(exc).__name__}: {exc}")
            return None

    def _say(self, line: str) -> None:
        """Report a line once (the same situation is not repeated at every block)."""
        if line != self._said:
            self._said = line
            self.report(line)
