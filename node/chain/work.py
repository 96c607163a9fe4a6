"""What the chain says about a job's work: the job a config names, its miners, its receipts.

The one place the node scans blocks for receipts (the chain keeps no index
by unit). Each reader is a pure function of a chain (`ledger.chaindb.ChainDB`
or anything with ``state``, ``height`` and ``block_at``) and runs in the
chain service's thread. How far back a search goes is a window named here,
each with its reason:

- `CLOSED_STEP_BLOCKS`: a closed step's receipts, for its update
  (`node.mine.jobs.step_workers`) and a catching-up miner's check;
- `AROUND_RECEIPT_BLOCKS`: the receipts an audited receipt is judged
  against (its unit's the step before, its forward's), searched from this
  many blocks before it;
- the blocks a job's last step can have closed in, from the height it was
  assigned (``moved``) to its give-up (`node.chain.jobviews.given_up`, kept
  there: the job views load no libp2p);
- the whole chain, for a replay of every closed step (`pnode verify pol
  --all`).

A unit's receipt is included at most once on the main chain, so which block
a search meets it in first does not matter.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from libp2p.peer.id import ID

from ledger.rules import candidates
from ledger.state import JOB, NODE, Overlay
from ledger.types import Receipt, UnitTemplate, tx_hash, unit_id

__all__ = ["AROUND_RECEIPT_BLOCKS", "CLOSED_STEP_BLOCKS", "bonded_peers", "job_named",
           "receipt_at", "receipts_between", "step_receipts", "unit_receipt"]

#: Blocks back from the tip that a closed step's receipts are looked for in: a step
#: closes once all its units' receipts are in, and updates follow within a few blocks.
CLOSED_STEP_BLOCKS = 256
#: Blocks before an audited receipt's that the receipts it is judged against are looked
#: for in (the step before's of its unit, its stage's forward).
AROUND_RECEIPT_BLOCKS = 64


def job_named(state, hyper_hash: bytes, wanted: bytes | None = None) -> bytes | None:
    """The id of the job to work on: ``wanted`` when it is on chain, else the first job
    whose ``hyper_hash`` is the given one (the node's job config's); None: none."""
    if wanted is not None:
        return wanted if state.get(JOB + wanted) is not None else None
    return next((j for j in state.ids(JOB) if state.get(JOB + j).job.hyper_hash == hyper_hash),
                None)


def bonded_peers(state) -> list[str]:
    """The peer id of every node the longest-wait rule may pick (registered and bonded)."""
    return [str(ID(state.get(NODE + c.node_key).peer_id)) for c in candidates(Overlay(state))]


def receipts_between(chain, first: int, last: int | None = None
                     ) -> Iterator[tuple[int, Receipt]]:
    """(height, receipt) of every receipt in the main chain's blocks ``first``..``last``
    (default: the tip), oldest first."""
    for h in range(max(1, first), (chain.height if last is None else last) + 1):
        for tx in chain.block_at(h).txs:
            if isinstance(tx, Receipt):
                yield h, tx


def step_receipts(chain, job_id: bytes, units: Sequence[UnitTemplate], steps: Iterable[int],
                  back: int | None = None) -> dict[tuple[int, int], Receipt]:
    """(step, unit index) -> the included receipt, for ``steps`` of ``job_id``.

    Args:
        back: search the last ``back`` blocks only (None: the whole chain).
            The search runs from the tip back and stops once every unit of
            every step is found.
    """
    wanted = {unit_id(job_id, t, u): (t, i) for t in steps for i, u in enumerate(units)}
    found: dict[tuple[int, int], Receipt] = {}
    low = 1 if back is None else max(1, chain.height - back + 1)
    for h in range(chain.height, low - 1, -1):
        for tx in chain.block_at(h).txs:
            if isinstance(tx, Receipt) and tx.unit_id in wanted:
                found.setdefault(wanted[tx.unit_id], tx)
        if len(found) == len(wanted):
            break
    return found


def unit_receipt(chain, job_id: bytes, units: Sequence[UnitTemplate], step: int, index: int,
                 near: int) -> Receipt | None:
    """The included receipt of unit ``index`` at ``step``, looked for from
    `AROUND_RECEIPT_BLOCKS` before height ``near`` to the tip."""
    if index >= len(units):
        return None
    wanted = unit_id(job_id, step, units[index])
    return next((tx for _, tx in receipts_between(chain, near - AROUND_RECEIPT_BLOCKS)
                 if tx.unit_id == wanted), None)


def receipt_at(chain, height: int, receipt_hash: bytes) -> Receipt | None:
    """The receipt with that hash in the main-chain block at ``height`` (None: not there)."""
    if not 1 <= height <= chain.height:
        return None
    return next((tx for _, tx in receipts_between(chain, height, height)
                 if tx_hash(tx) == receipt_hash), None)
