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
import resource
import statistics
import sys
import time
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


# -- timing on a shared machine ---------------------------------------------------


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, MiB (Linux reports KiB)."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / 1024 if sys.platform != "darwin" else kib / 2**20


def rss_mib() -> float:
    """Current resident set size of this process, MiB (0 where /proc is missing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def paired_ratio(ours: list[float], base: list[float]) -> float:
    """Median over repeats of base time / ours time (runs of one repeat are adjacent,
    so they share the machine's load of the moment): a speed ratio robust to bursts."""
    return statistics.median(b / o for o, b in zip(ours, base))


def median_rate(times: list[float], work: int) -> float:
    return work / statistics.median(times)


def cpu_times() -> tuple[int, int, int] | None:
    """(busy, total) clock ticks of all CPUs from /proc/stat, and this process's
    own ticks (all threads) from /proc/self/stat; None without them."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError):
        return None
    total = sum(values[:8])  # guest time is already in user time
    own = int(fields[11]) + int(fields[12])  # utime + stime
    return total - values[3] - values[4], total, own  # busy excludes idle and iowait


def machine_busy(window: float = 0.5) -> float:
    """Fraction of all CPUs that other processes kept busy over `window` seconds
    (our own spinning worker threads not counted); 0.0 where /proc is missing."""
    a = cpu_times()
    time.sleep(window)
    b = cpu_times()
    if a is None or b is None or b[1] == a[1]:
        return 0.0
    return max(0.0, ((b[0] - a[0]) - (b[2] - a[2])) / (b[1] - a[1]))


WAIT_IDLE = {"max_wait_s": 20.0, "busy_below": 0.15}
BUSY_LOG: list[float] = []


def wait_idle() -> None:
    """Wait (up to WAIT_IDLE's max_wait_s) until other processes leave the CPUs idle;
    log the load found. Disabled when max_wait_s is 0."""
    if WAIT_IDLE["max_wait_s"] <= 0:
        return
    deadline = time.monotonic() + WAIT_IDLE["max_wait_s"]
    busy = machine_busy()
    while busy >= WAIT_IDLE["busy_below"] and time.monotonic() < deadline:
        busy = machine_busy(1.0)
    BUSY_LOG.append(busy)


def alternate(
    fns: dict[str, Callable[[], Any]], repeats: int
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Time each fn `repeats` times, alternating, the order reversed every repeat;
    before each repeat, wait for the other processes on the machine to go quiet.

    Returns:
        (seconds per run for each name, each fn's last result).
    """
    times: dict[str, list[float]] = {name: [] for name in fns}
    last: dict[str, Any] = {}
    order = list(fns)
    for r in range(repeats):
        wait_idle()
        for name in order if r % 2 == 0 else reversed(order):
            t0 = time.perf_counter()
            last[name] = fns[name]()
            times[name].append(time.perf_counter() - t0)
    return times, last
