"""The waiting room of a full server: paid session requests wait for a slot, highest bid first.

Owns `WaitingRoom` (specs/network.md 9.6, "Priority"). When a server holds
``max_sessions``, a paid request waits here (at most ``queue_timeout``
seconds) instead of being told `Busy` at once; a slot that frees goes to the
highest bid waiting, the earliest of equal bids. A session in a step is
never pre-empted (before waiting, a request may reclaim an idle one:
`node.serve.admission.reclaim_choice`). A room holds at most ``size``
requests: a bid above the lowest waiting takes that one's seat (it is told
`Busy` with the least bid that would now be admitted), a bid at or below it
is told so at once, so a client may raise its bid up to its
``--max-price`` and ask again.

Pure but for trio's events; no libp2p, no torch.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import trio


@dataclass(eq=False, slots=True)
class _Seat:
    bid: int
    order: int
    event: trio.Event = field(default_factory=trio.Event)
    admitted: bool = False


class WaitingRoom:
    """Paid requests waiting for a full server's next free slot.

    Args:
        size: most requests waiting at once.
    """

    def __init__(self, size: int):
        self.size = size
        self.reserved = 0  # slots handed to admitted waiters, not yet taken by them
        self._seats: list[_Seat] = []
        self._order = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._seats)

    def min_bid(self, ask: int) -> int:
        """The least bid that would get a seat now (the ask while a seat is free)."""
        if len(self._seats) < self.size:
            return ask
        return max(ask, min(s.bid for s in self._seats) + 1)

    async def wait(self, bid: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a slot; True once one is this request's.

        The caller then takes the slot (`take`). False: no seat (the room is
        full of bids at least as high), outbid while waiting, or timed out.
        """
        if len(self._seats) >= self.size:
            lowest = min(self._seats, key=lambda s: (s.bid, -s.order))  # the last lowest
            if bid <= lowest.bid:
                return False
            self._seats.remove(lowest)
            lowest.event.set()  # outbid: it is told `Busy` with the new least bid
        seat = _Seat(bid, next(self._order))
        self._seats.append(seat)
        with trio.move_on_after(timeout):
            await seat.event.wait()
        if seat in self._seats:
            self._seats.remove(seat)
        return seat.admitted

    def take(self) -> None:
        """An admitted waiter takes its reserved slot."""
        self.reserved = max(0, self.reserved - 1)

    def free(self) -> None:
        """A slot freed: the highest bid waiting gets it (reserved for it until `take`)."""
        if not self._seats:
            return
        best = max(self._seats, key=lambda s: (s.bid, -s.order))
        self._seats.remove(best)
        best.admitted = True
        self.reserved += 1
        best.event.set()
