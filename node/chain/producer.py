"""Block production: this node seals the mempool into blocks at its slots.

Owns when and how a node makes a block (specs/network.md, "Block
production"), both for the running node (`Producer`, started by `pnode
start`) and for the offline `pnode produce` (`earliest_slot_ms`,
`seal_block`):

- this node's node key must be a registered, bonded producer; its rank for
  the block after the tip is `ledger.transition.producer_rank` and it may
  seal from ``tip.time_ms + rank * slot_ms`` (the timeout ladder), and in
  the running node no sooner than ``interval_ms`` after the tip (default:
  one slot), so a rank-0 node does not seal empty blocks back to back;
- the block takes the mempool (`ChainDB.build` drops what no longer fits)
  at time ``max(now, tip.time_ms + 1)``;
- `Producer` waits for its slot or for the tip to move, whichever comes
  first; a new tip means a new rank and a new slot, so it starts over. Its
  blocks go through `ChainService.add_block`, which gossips them.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from ledger.chaindb import ChainDB
from ledger.crypto import SigningKey
from ledger.errors import LedgerError, StoreError
from ledger.state import KEY_PARAMS
from ledger.transition import Applied, producer_rank

if TYPE_CHECKING:  # not at run time: `pnode produce` need not load libp2p
    from node.chain.sync import ChainService
    from node.clock import Clock

log = logging.getLogger(__name__)


def earliest_slot_ms(chain: ChainDB, producer: bytes, interval_ms: int = 0) -> int | None:
    """When ``producer`` may seal the block after the tip (ms), or None if it may not.

    Args:
        chain: the chain; only read.
        producer: a node key (public).
        interval_ms: least time after the tip's time (0: none but the ladder's).

    Returns:
        ``tip.time_ms + max(rank * slot_ms, interval_ms)``; None when the key
        is not a registered, bonded node.
    """
    rank = producer_rank(chain.state, chain.tip, producer)
    if rank is None:
        return None
    return chain.tip.time_ms + max(rank * _slot_ms(chain), interval_ms)


def _slot_ms(chain: ChainDB) -> int:
    return chain.state.get(KEY_PARAMS).slot_ms


def seal_block(chain: ChainDB, key: SigningKey, now_ms: int) -> Applied:
    """Build (not add) the block after the tip from the mempool, signed by ``key``.

    Raises:
        ValidationError: ``key`` may not produce now (not its slot, not registered).
    """
    return chain.build(chain.mempool(), key, max(now_ms, chain.tip.time_ms + 1))


class Producer:
    """Seals blocks at this node's slots while it runs; follows the chain otherwise."""

    def __init__(self, service: ChainService, key: SigningKey, clock: Clock, *,
                 interval_ms: int | None = None,
                 report: Callable[[str], None] = lambda line: None,
                 withhold: Callable[[ChainDB, Applied, bytes], bool] | None = None):
        """
        Args:
            service: the chain service of the running node (all chain work goes through it).
            key: this node's node key (signs the blocks).
            clock: local time in ms.
            interval_ms: least time between the tip and the block sealed on it;
                None: the chain's slot.
            report: gets a line when a block is made, and once when this node
                is not (or no longer) a producer.
            withhold: test-only (`node.pol.attacks.withhold`): a block it
                returns True for is not published (the withholding attack).
        """
        self.service, self.key, self.clock = service, key, clock
        self.interval_ms, self.report, self.withhold = interval_ms, report, withhold
        self.withheld = 0  # blocks the withholding attack kept back
        self.made: deque[tuple[int, bytes]] = deque(maxlen=1000)  # (height, hash) of recent blocks
        self.eligible: bool | None = None  # None until the first check
        self.held = False  # `hold` stops sealing for good (a devnet winding down)

    def hold(self) -> None:
        """Seal no more blocks (one being sealed still goes out); the node follows the chain."""
        self.held = True

    async def run(self, *, task_status: trio.TaskStatus[Producer] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Produce until cancelled."""
        task_status.started(self)
        chain = self.service.chain
        while True:
            if self.held:
                await trio.sleep_forever()
            tip = chain.tip_hash
            earliest = await self.service.call(self._earliest)
            self._note_eligible(earliest is not None)
            if earliest is None:
                await self.service.wait_tip_change(tip)
                continue
            wait_s = (earliest - self.clock()) / 1000
            if wait_s > 0:  # sleep until the slot, or less if the tip moves
                with trio.move_on_after(wait_s):
                    await self.service.wait_tip_change(tip)
                continue  # re-check the tip and the clock
            if not self.held:
                await self._produce(tip)

    def _earliest(self) -> int | None:
        chain = self.service.chain
        interval = _slot_ms(chain) if self.interval_ms is None else self.interval_ms
        return earliest_slot_ms(chain, self.key.public, interval)

    def _seal_on(self, tip: bytes, now_ms: int) -> Applied | None | str:
        """`seal_block`, unless the tip moved meanwhile (worker thread); "withheld" when
        the withholding attack keeps the block back."""
        chain = self.service.chain
        if chain.tip_hash != tip:
            return None
        applied = seal_block(chain, self.key, now_ms)
        if self.withhold is not None and self.withhold(chain, applied, self.key.public):
            return "withheld"
        return applied

    async def _produce(self, tip: bytes) -> None:
        try:
            applied = await self.service.call(self._seal_on, tip, self.clock())
            if applied is None:
                return
            if applied == "withheld":  # this slot passes down the ladder
                self.withheld += 1
                self.report(f"withheld the block on {tip.hex()[:16]} (attack battery)")
                await self.service.wait_tip_change(tip)
                return
            result = await self.service.add_block(applied.block)
        except StoreError:
            raise  # fatal: the node stops on it (`ChainService.store_broken`)
        except LedgerError as exc:  # a bug: say so, retry a slot later
            log.error("could not produce on %s: %s: %s", tip.hex()[:16], type(exc).__name__, exc)
            slot_ms = await self.service.call(_slot_ms, self.service.chain)
            with trio.move_on_after(max(slot_ms, 100) / 1000):
                await self.service.wait_tip_change(tip)
            return
        header = applied.block.header
        self.made.append((header.height, applied.hash))
        self.report(f"produced block {header.height} {applied.hash.hex()[:16]} "
                    f"txs={len(applied.block.txs)} rank={applied.rank} ({result.status})")

    def _note_eligible(self, eligible: bool) -> None:
        if eligible == self.eligible:
            return
        if not eligible:
            self.report("not a registered, bonded producer on this chain: following it")
        elif self.eligible is not None:
            self.report("registered as a producer: producing")
        self.eligible = eligible
