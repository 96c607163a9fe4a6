"""What one hop ran: every step's input and the hop's signed answer, as the client holds them.

Owns `StepLog` (specs/network.md 9.5, "Localisation"). A spot check that
finds the route wrong judges each hop on exactly what it ran, without
asking the route's hops anything (a liar would recognise a replay and
answer it honestly): a checker server runs the hop's own input steps, one
by one, and each answer is compared with the one the hop signed.

The client sends a hop some steps itself (client-driven, or the first hop
of a linked route): those it logs as sent. The others were pushed by the
hop before it (9.3a): their input is that hop's output at the same
position, which the client holds from the hop's `StepCopy` (or its
`StepResult`, the last hop's), and their chunks are those the client gave
the chain's first hop. A step at a position the log already holds rolls
the log back, as the server rolls its cache back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from node.wire import Step


@dataclass(frozen=True, slots=True)
class Answer:
    """A hop's signed answer to the step at ``pos``: its output bytes and signature."""

    pos: int
    hidden: bytes
    signature: bytes


class StepLog:
    """One hop session's steps since position 0 and its answers to them, by position."""

    def __init__(self) -> None:
        # pos -> the step sent (voucher left out), or (chunks, the session that pushed it).
        self._steps: dict[int, Step | tuple[tuple[int, ...], object]] = {}
        self.answers: dict[int, Answer] = {}

    def sent(self, step: Step) -> None:
        """The client sent ``step`` to this hop."""
        self._cut(step.pos)
        self._steps[step.pos] = replace(step, voucher=b"")

    def pushed(self, pos: int, chunks: tuple[int, ...], source) -> None:
        """The hop before (``source``, a `HopSession`) pushes it the step at ``pos``."""
        self._cut(pos)
        self._steps[pos] = (chunks, source)

    def answered(self, pos: int, hidden: bytes, signature: bytes) -> None:
        """The hop's signed answer to its step at ``pos`` (the first one only: a step sent
        again after a failure may be answered twice, and both claim the same input)."""
        if pos in self._steps and pos not in self.answers:
            self.answers[pos] = Answer(pos, hidden, signature)

    def _last(self) -> int:
        return next(reversed(self._steps))  # dicts keep order, and steps come in order

    def was_pushed(self, pos: int) -> bool:
        """Whether the step at ``pos`` was pushed by the hop before (not sent by the client)."""
        return isinstance(self._steps.get(pos), tuple)

    def positions(self) -> list[int]:
        """The positions of the steps held, in order."""
        return sorted(self._steps)

    def history(self) -> list[Step] | None:
        """The hop's input steps since position 0 in order, each answered; None if any
        input or answer is missing (a copy that never came)."""
        steps: list[Step] = []
        for pos in self.positions():
            entry = self._steps[pos]
            if isinstance(entry, tuple):
                chunks, source = entry
                given = source.log.answers.get(pos)
                if given is None:
                    return None
                entry = Step(pos, chunks, given.hidden)
            if pos not in self.answers:
                return None
            steps.append(entry)
        if not steps or steps[0].pos != 0:
            return None
        return steps

    def _cut(self, pos: int) -> None:
        if not self._steps or pos > self._last():
            return  # the usual case, a step after the last one: nothing to drop
        for held in [p for p in self._steps if p >= pos]:
            del self._steps[held]
            self.answers.pop(held, None)
