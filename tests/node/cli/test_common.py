"""node.cli.common: the one-line errors of both CLIs."""

from __future__ import annotations

import click
import pytest

from node.cli import common
from wallet.errors import WalletError


@pytest.mark.parametrize("raised, code, line", [
    (BaseExceptionGroup("g", [ExceptionGroup("h", [WalletError("no route")])]), 2,
     "error: no route"),
    (BaseExceptionGroup("g", [KeyboardInterrupt()]), 130, "interrupted"),
    (KeyboardInterrupt(), 130, "interrupted"),  # click turns it into Abort
    (click.Abort(), 2, "aborted"),
])
def test_a_nursery_wrapped_error_prints_one_line(monkeypatch, capsys, raised, code, line):
    """trio wraps what a generation raises; the CLI still prints one line."""
    @click.group()
    def group() -> None:
        pass

    @group.command()
    def fail() -> None:
        raise raised

    monkeypatch.setattr("sys.argv", ["prog", "fail"])
    with pytest.raises(SystemExit) as exit_:
        common.run(group, expected=(WalletError,))
    assert exit_.value.code == code
    assert capsys.readouterr().err.strip() == line


def test_several_errors_in_a_group_are_not_hidden():
    """Two leaves: no single line would be true, so the group goes up whole."""
    group = ExceptionGroup("g", [ValueError("a"), WalletError("b")])
    assert common.single_leaf(group) is group


def test_ctrl_c_cancels_a_trio_run_even_where_a_task_swallows_it():
    """Ctrl-C that lands in a task catching BaseException (as some py-libp2p tasks do).

    Under plain ``trio.run`` the interrupt is raised in that task, swallowed,
    and the run goes on to its end; `run_trio_interruptibly` stops it.
    """
    import signal

    import trio

    ended = []

    async def swallower() -> None:
        try:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C while this task runs
            await trio.sleep_forever()
        except BaseException:  # noqa: BLE001 - the library behaviour under test
            ended.append("swallowed")

    async def generation() -> str:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(swallower)
            await trio.sleep(0.5)  # a generation still running
            nursery.cancel_scope.cancel()
        return "finished"

    assert trio.run(generation) == "finished"  # the hazard: the interrupt was lost
    assert ended == ["swallowed"]
    ended.clear()
    with pytest.raises(KeyboardInterrupt):
        common.run_trio_interruptibly(generation)
    assert ended == ["swallowed"]  # cancelled, not interrupted


def test_a_trio_run_without_ctrl_c_returns_or_raises_as_itself():
    import trio

    async def answer(x: int) -> int:
        await trio.sleep(0)
        return x * 2

    async def fail() -> None:
        raise WalletError("no route")

    assert common.run_trio_interruptibly(answer, 21) == 42
    with pytest.raises(WalletError, match="no route"):
        common.run_trio_interruptibly(fail)
