"""wallet.client.steplog: a hop's steps and signed answers as the client rebuilds them (9.5)."""

from __future__ import annotations

from node.wire import Step
from wallet.client.steplog import StepLog


class Hop:
    """What a `StepLog` reads of the session that pushed a step: its log."""

    def __init__(self) -> None:
        self.log = StepLog()


def test_a_pushed_step_is_the_hop_befores_answer_in_the_first_hops_chunks():
    first, second = Hop(), Hop()
    first.log.sent(Step(0, (4, 1), b"prompt", b"voucher"))
    second.log.pushed(0, (4, 1), first)
    assert second.log.history() is None  # the first hop's copy has not come
    first.log.answered(0, b"out0", b"s" * 64)
    assert second.log.history() is None  # nor the second hop's own answer
    second.log.answered(0, b"out1", b"t" * 64)
    assert first.log.history() == [Step(0, (4, 1), b"prompt")]  # the voucher left out
    assert second.log.history() == [Step(0, (4, 1), b"out0")]
    assert second.log.was_pushed(0) and not first.log.was_pushed(0)


def test_a_step_at_a_held_position_rolls_the_log_back_and_the_first_answer_stays():
    hop = Hop()
    for pos, data in ((0, b"a"), (5, b"b"), (6, b"c")):
        hop.log.sent(Step(pos, (), data))
        hop.log.answered(pos, data.upper(), b"s" * 64)
    hop.log.answered(6, b"late", b"s" * 64)  # a second answer to the same step
    assert hop.log.answers[6].hidden == b"C"
    hop.log.sent(Step(5, (), b"again"))  # rolls back to position 5
    assert hop.log.positions() == [0, 5] and 6 not in hop.log.answers
    assert hop.log.history() is None  # the step at 5 awaits its answer
    hop.log.answered(5, b"AGAIN", b"s" * 64)
    assert [s.hidden for s in hop.log.history()] == [b"a", b"again"]
    hop.log.answered(9, b"stray", b"s" * 64)  # an answer to no step held: dropped
    assert 9 not in hop.log.answers
    hop.log.sent(Step(0, (5, 1), b"replay"))  # a replay starts the log afresh
    assert hop.log.positions() == [0] and hop.log.answers == {}
