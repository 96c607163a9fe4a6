"""One thread per process for torch work: one OpenMP team, never throttled.

On Linux, torch's CPU kernels run their parallel regions on a libgomp team
that belongs to the calling OS thread: every thread that ever runs a
parallel region gets a pool of worker threads of its own, which lives as
long as that thread. libgomp counts the threads it manages across all pools,
and once they outnumber the CPUs it cuts every worker's spin-wait to a
hundred iterations (its "throttled" spin). Workers then sleep between the
parallel regions of one forward call and pay a futex wake-up at the next
one. `trio.to_thread.run_sync` runs each call on whichever thread its cache
hands out, so a server whose forwards moved to a second thread (after a
database or decode job took the first one in turn) ran each 10-layer
forward in 15.5-16 ms instead of 12, until the first thread idled out of
trio's cache 10 s later. In isolation: 13.4 ms with one pool, 19.6 ms with
a second, idle pool alive, 13.0 ms once its thread exited (BENCHMARKS.md,
session 11).

`run_sync` therefore sends all of a process's torch work (forwards,
loading, training units, averaging, a client's head) to one long-lived
thread, in the order it was submitted (first in, first out: sessions and
units take turns as they did under their `trio.CapacityLimiter(1)`). The
event loop stays free, as DESIGN.md section 2 asks. A job is a plain
function that never waits on another job, so the queue cannot deadlock.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

import outcome
import trio

_jobs: queue.SimpleQueue = queue.SimpleQueue()
_start_lock = threading.Lock()
_thread: threading.Thread | None = None


def _serve_jobs() -> None:
    """The torch thread: run each job, hand its outcome back to the waiting task."""
    while True:
        fn, args, deliver = _jobs.get()
        deliver(outcome.capture(fn, *args))


def _ensure_thread() -> None:
    global _thread
    with _start_lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_serve_jobs, name="pnode-torch", daemon=True)
            _thread.start()


def thread_id() -> int | None:
    """The torch thread's native id (None before its first job)."""
    return _thread.native_id if _thread is not None else None


async def run_sync(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on the process's torch thread, after the jobs queued before it.

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

    _jobs.put((fn, args, deliver))
    return await trio.lowlevel.wait_task_rescheduled(
        lambda raise_cancel: trio.lowlevel.Abort.FAILED)
