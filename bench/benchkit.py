"""What every bench shares: its `--smoke` mode, and the load average printed beside its figures.

The machine is shared, so a figure means little without the load it was
measured under: every bench prints the 1-, 5- and 15-minute load averages
(`os.getloadavg`) at its start and at its end, on a line beside its table,
or as the fields ``loadavg_start`` and ``loadavg_end`` of its ``--json``
object. ``--smoke`` runs a bench at tiny sizes in seconds, through the same
code (real nodes, real control ops), so that tests/bench/test_smoke.py
fails when something the bench uses is renamed; a smoke run's figures
mean nothing. A bench that cannot run a part of itself here (an optional
baseline that is not installed, a GPU) says so with `skipped` and goes on.

Not part of pnode: the benches import it as a sibling module (a script's
own folder is first on ``sys.path``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable

SMOKE_HELP = "tiny sizes, a few seconds: checks that the bench runs; its figures mean nothing"


def parse_args(parser: argparse.ArgumentParser, smoke: dict[str, Any],
               argv: list[str] | None = None) -> argparse.Namespace:
    """``parser``'s arguments, with ``--smoke`` added and the load average at start taken.

    Args:
        smoke: the defaults ``--smoke`` puts in place of the parser's (an
            option given on the command line still wins).

    Returns:
        The arguments; ``loadavg_start`` holds the load average when they were parsed.
    """
    start = os.getloadavg()
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**smoke)
        args = parser.parse_args(argv)
    args.loadavg_start = start
    return args


def load_line(start: tuple[float, ...], end: tuple[float, ...]) -> str:
    """The line printed beside every table: load average at start and at end (1, 5, 15 min)."""
    def fmt(load: tuple[float, ...]) -> str:
        return " ".join(f"{x:.2f}" for x in load)
    return f"load average: start {fmt(start)}, end {fmt(end)} (1, 5, 15 min)"


def report(args: argparse.Namespace, doc: dict[str, Any], table: Callable[[], None],
           indent: int | None = 2) -> None:
    """Print a bench's figures with the load average at its start and now.

    With ``--json``: ``doc`` as one JSON object, ``loadavg_start`` and
    ``loadavg_end`` added; else ``table()`` prints the figures and the load
    average line follows.
    """
    end = os.getloadavg()
    if getattr(args, "json", False):
        print(json.dumps({**doc, "loadavg_start": [round(x, 2) for x in args.loadavg_start],
                          "loadavg_end": [round(x, 2) for x in end]}, indent=indent))
        return
    table()
    print(load_line(args.loadavg_start, end), flush=True)


def skipped(what: str, why: str) -> None:
    """Say that a part of the bench does not run here (so a smoke run goes on without it).

    On stderr: stdout may be one JSON object.
    """
    print(f"skipped: {what} ({why})", file=sys.stderr, flush=True)


def even_spans(servers: int, layers: int = 30) -> tuple[tuple[int, int], ...]:
    """SmolLM2's ``layers`` cut into ``servers`` contiguous spans as even as they go
    (3: 0-10, 10-20, 20-30): the layouts the swarm benches start servers on."""
    return tuple((layers * i // servers, layers * (i + 1) // servers) for i in range(servers))
