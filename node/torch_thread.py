"""Where a process's torch work runs: one thread, one OpenMP team, and how idle threads wait.

Owns `run_sync` (a job on the process's one torch thread: by priority with
ageing, else first in, first out), `tensor_work` (the same, or inline for a
few rows) and `share_cpus_politely` (libgomp's spin, set before torch loads).

Priority (specs/network.md 9.6): a paid session's forward calls carry its
bid; the thread runs the waiting job of the highest level, ``log2(1 +
priority)`` plus one level per `AGEING_S` seconds it has waited, the
earliest on a tie. Jobs of equal priority stay first in, first out; a
mining unit (priority 0) or a low bid waits at most about
``log2(1 + top bid) * AGEING_S`` behind newer, richer jobs (2 s for a bid
of 10^12), so none starves.

Why one thread: on Linux every OS thread that runs a parallel region gets a
libgomp team of its own, and once a process's teams hold more threads than
there are CPUs, libgomp throttles every worker's spin-wait, so each of a
forward's parallel regions pays a futex wake-up. `trio.to_thread.run_sync`
hands each call to whichever thread its cache holds, which left servers
with a second team for seconds at a time (a 10-layer forward 1.46x slower;
specs/network.md section 9.3a, measured in BENCHMARKS.md). So forwards,
loading, training units, averaging and a client's head all run here, off
the event loop (ARCHITECTURE.md, threads and task groups). A job is a plain
function that never waits on another job, so the queue cannot deadlock.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import outcome
import trio

#: Seconds of waiting that raise a job by one priority level.
AGEING_S = 0.05


@dataclass(slots=True)
class _Job:
    level: float
    at: float
    seq: int
    fn: Callable[..., Any]
    args: tuple
    deliver: Callable[[outcome.Outcome], None]


_pending: list[_Job] = []
_ready = threading.Condition()
_seq = itertools.count()
_start_lock = threading.Lock()
_thread: threading.Thread | None = None


def _next_job() -> _Job:
    """The waiting job of the highest aged level (the earliest on a tie); blocks until one."""
    with _ready:
        while not _pending:
            _ready.wait()
        now = time.monotonic()
        job = max(_pending, key=lambda j: (j.level + (now - j.at) / AGEING_S, -j.seq))
        _pending.remove(job)
        return job


def _serve_jobs() -> None:
    """The torch thread: run each job, hand its outcome back to the waiting task."""
    while True:
        job = _next_job()
        job.deliver(outcome.capture(job.fn, *job.args))


def _ensure_thread() -> None:
    global _thread
    with _start_lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_serve_jobs, name="pnode-torch", daemon=True)
            _thread.start()


def thread_id() -> int | None:
    """The torch thread's native id (None before its first job)."""
    return _thread.native_id if _thread is not None else None


async def run_sync(fn: Callable[..., Any], *args: Any, priority: int = 0) -> Any:
    """``fn(*args)`` on the process's torch thread, after the jobs queued before it
    (of the same aged priority level: see the module docstring).

    Like ``trio.to_thread.run_sync`` (without ``abandon_on_cancel``): a
    cancellation that arrives while the job waits or runs does not stop it;
    the call returns the job's result and the cancellation comes at the
    caller's next checkpoint, so a job's effects are never half-seen.

    Returns:
        What ``fn`` returned.
    Raises:
        Whatever ``fn`` raised.
    """
    await trio.lowlevel.checkpoint_if_cancelled()
    _ensure_thread()
    token = trio.lowlevel.current_trio_token()
    task = trio.lowlevel.current_task()

    def deliver(result: outcome.Outcome) -> None:
        try:
            token.run_sync_soon(trio.lowlevel.reschedule, task, result)
        except trio.RunFinishedError:  # the run ended while the job ran: nobody waits
            pass

    with _ready:
        _pending.append(_Job(math.log2(1 + max(priority, 0)), time.monotonic(), next(_seq), fn,
                             args, deliver))
        _ready.notify()
    return await trio.lowlevel.wait_task_rescheduled(
        lambda raise_cancel: trio.lowlevel.Abort.FAILED)


INLINE_ROWS = 16


async def tensor_work(fn: Callable[..., Any], *args: Any, rows: int) -> Any:
    """``fn(*args)`` on the torch thread, or inline when it is a few rows.

    The encode, decode and embedding of a few rows take about 20 us and a
    thread hop about 100 us, and a client's decode step makes eight of them:
    those run inline. Everything larger goes to `run_sync`.

    Returns:
        What ``fn`` returned.
    Raises:
        Whatever ``fn`` raised.
    """
    if rows <= INLINE_ROWS:
        return fn(*args)
    return await run_sync(fn, *args)


SPIN_COUNT = "50000"  # a server's libgomp spin: about 1.5 ms here (PAUSE is ~140 cycles)
CLIENT_SPIN_COUNT = "0"  # a swarm client's: its threads sleep as soon as they are idle


def share_cpus_politely(spin_count: str = SPIN_COUNT) -> None:
    """Let idle OpenMP threads spin only briefly, then sleep (call before torch loads).

    A swarm hop is a pipeline: while one process computes, the others wait
    for it. libgomp's default spins about 5 ms after each parallel region,
    and on a machine with few cores those spinning threads steal the cores
    the next hop needs; never spinning (``OMP_WAIT_POLICY=PASSIVE``) makes
    every parallel region of a step pay a futex wake-up instead. A server
    spins `SPIN_COUNT` times: enough to bridge the gaps between the regions
    of one forward call, short enough to yield the core about when the next
    hop's forward starts. A swarm client does not spin at all
    (`CLIENT_SPIN_COUNT`): its one parallel product a token (the LM head) is
    followed by the first hop's forward, which its spinning thread would
    slow. The measurements behind both numbers are in BENCHMARKS.md. A
    user's own ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` wins.

    Args:
        spin_count: ``GOMP_SPINCOUNT`` to set when the user set neither.
    """
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", spin_count)
