"""A catching-up miner's check of a holder's state against the step's receipts (specs/pol.md 8).

Owns `StateCheck`. A miner more than one update behind takes the weights
and AdamW state of its parts from another holder (`node.mine.state_sync`).
Before it installs them, it compares the weights with those the open
step's workers committed (each receipt's `weights_hash`, fetched over
`/pnode/pol/1.0.0`), tensor by tensor within the threshold of specs/pol.md
7.3: replicas on other hardware (a GPU, another instruction set) round
apart, so digests alone would refuse honest holders. A state that every checked receipt
contradicts is refused, and the next holder is asked; with no receipt to
check against (none included yet, none fetchable), the state is taken, as
before.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import torch

from ledger.types import Receipt
from node.pol.fetch import PolFetcher
from proof_of_learning.certificate import THRESHOLD, rel_max_err

log = logging.getLogger(__name__)

__all__ = ["MAX_CHECKED", "StateCheck"]

#: Receipts a check compares a state with, at most (each costs a fetch).
MAX_CHECKED = 3

#: (job id, step) -> the step's included receipts, each with the peers to ask.
ReceiptsOf = Callable[[bytes, int], Awaitable[Sequence[tuple[Receipt, Sequence[str]]]]]


class StateCheck:
    """Whether a holder's state of a part agrees with the open step's receipts.

    Args:
        fetcher: fetches a receipt's committed weights by `weights_hash`.
        receipts_of: the step's included receipts (and whom to ask).
    """

    def __init__(self, fetcher: PolFetcher, receipts_of: ReceiptsOf):
        self.fetcher, self.receipts_of = fetcher, receipts_of
        self.refused = 0  # states refused so far (for the log and tests)

    async def __call__(self, job_id: bytes, section: int, step: int,
                       state: dict[str, torch.Tensor]) -> bool:
        """True to take ``state`` (a part's weights and AdamW state at ``step``)."""
        weights = {n: t for n, t in state.items() if "#" not in n}
        agree = disagree = 0
        for receipt, peers in list(await self.receipts_of(job_id, step))[:MAX_CHECKED * 4]:
            if agree + disagree >= MAX_CHECKED:
                break
            fetched = await self.fetcher.named(peers, job_id, receipt.weights_hash)
            if fetched is None:
                continue
            theirs = fetched[0]
            common = [n for n in weights if n in theirs and theirs[n].shape == weights[n].shape]
            if not common:
                continue  # that unit read none of this part's tensors
            if all(rel_max_err(weights[n].detach().double().numpy(), theirs[n].double().numpy())
                   < THRESHOLD for n in common):
                agree += 1
            else:
                disagree += 1
        if disagree and not agree:
            self.refused += 1
            log.warning("a holder's state of section %s at step %d is not the weights the "
                        "step's workers committed: asking another holder", section, step)
            return False
        return True
