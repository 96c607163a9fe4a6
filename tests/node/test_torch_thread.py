"""node.torch_thread: all torch work of a process on one thread, by priority with ageing,
else first in, first out; the
OpenMP spin default that swarm processes set before torch loads."""

from __future__ import annotations

import functools
import os
import threading

import pytest
import torch
import trio

from node import torch_thread


def run(fn, *args):
    return trio.run(fn, *args)


def test_a_job_returns_its_value_or_raises_its_error_on_one_thread_across_runs():
    async def main():
        return await torch_thread.run_sync(lambda a, b: (a + b, threading.get_native_id()), 2, 3)

    (value, first), (_, second) = run(main), run(main)
    assert value == 5 and first == second == torch_thread.thread_id()
    assert first != threading.get_native_id()  # never the event loop's thread

    async def failing():
        await torch_thread.run_sync(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        run(failing)


def behind_a_held_thread(submits, then: float = 0.0) -> None:
    """Hold the torch thread, submit ``(priority, fn, arg)`` jobs in order (sleeping
    ``then`` seconds after the first), then let the thread go."""
    async def main():
        held, gate = threading.Event(), threading.Event()

        def hold():
            held.set()
            gate.wait()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(torch_thread.run_sync, hold)
            with trio.fail_after(10):  # the thread holds it before any job comes, however busy
                while not held.is_set():
                    await trio.sleep(0.005)
            for k, (priority, fn, arg) in enumerate(submits):
                nursery.start_soon(functools.partial(torch_thread.run_sync, fn, arg,
                                                     priority=priority))
                await trio.sleep(then if k == 0 else 0)  # each submits before the next
            await trio.sleep(0.05)
            gate.set()
    run(main)


def test_jobs_run_in_the_order_they_were_submitted():
    done = []
    behind_a_held_thread([(0, done.append, i) for i in range(20)])
    assert done == list(range(20))


def test_a_higher_priority_goes_first_and_a_waiting_job_ages_past_it(monkeypatch):
    done = []
    with monkeypatch.context() as m:  # no ageing between the submits, however slow they come
        m.setattr(torch_thread, "AGEING_S", 3600.0)
        behind_a_held_thread([(0, done.append, "mining"), (5, done.append, "bid 5"),
                              (1000, done.append, "bid 1000"), (5, done.append, "bid 5 again")])
    # log2(1001) ~ 10 levels above the mining job, log2(6) ~ 2.6: the equal bids in order.
    assert done == ["bid 1000", "bid 5", "bid 5 again", "mining"]
    done.clear()
    # The mining job waits 1 s (20 levels at AGEING_S = 50 ms) before a bid of 1000 comes.
    behind_a_held_thread([(0, done.append, "mining"), (1000, done.append, "rich")],
                         then=20 * torch_thread.AGEING_S)
    assert done == ["mining", "rich"]  # no job starves behind newer, richer ones


def test_a_cancelled_caller_waits_for_its_job_then_sees_the_cancellation():
    finished, got = [], []

    async def main():
        gate = threading.Event()
        with trio.move_on_after(0.05) as scope:
            threading.Timer(0.3, gate.set).start()  # the job outlives the deadline
            got.append(await torch_thread.run_sync(lambda: (gate.wait(), finished.append(1))))
            await trio.sleep(0)  # the next checkpoint delivers the cancellation
            got.append("not reached")
        return scope.cancelled_caught
    assert run(main) and finished == [1] and got == [(True, None)]  # the job's effect is whole


def test_concurrent_torch_jobs_all_run_on_the_one_thread_and_its_openmp_team():
    """The point of the thread: whatever task submits it, a job meets the same OpenMP pool."""
    x = torch.randn(1024, 1024)
    ran_on = set()

    def job():
        ran_on.add(threading.get_native_id())
        return torch.mm(x, x)  # a parallel region: on a new thread it would start a team

    async def burst():
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(torch_thread.run_sync, job)

    run(burst)
    threads = set(os.listdir("/proc/self/task"))
    for _ in range(3):
        run(burst)
    assert ran_on == {torch_thread.thread_id()}
    # No new thread (a second team would be); others may end meanwhile (an idle worker
    # of trio's thread cache, left by an earlier test file in this process, after 10 s).
    assert set(os.listdir("/proc/self/task")) <= threads


@pytest.mark.parametrize("env, spin, want", [
    ({}, torch_thread.SPIN_COUNT, {"GOMP_SPINCOUNT": torch_thread.SPIN_COUNT}),
    ({}, torch_thread.CLIENT_SPIN_COUNT, {"GOMP_SPINCOUNT": "0"}),
    ({"GOMP_SPINCOUNT": "0"}, torch_thread.SPIN_COUNT, {"GOMP_SPINCOUNT": "0"}),
    ({"GOMP_SPINCOUNT": "500"}, torch_thread.CLIENT_SPIN_COUNT, {"GOMP_SPINCOUNT": "500"}),
    ({"OMP_WAIT_POLICY": "ACTIVE"}, torch_thread.SPIN_COUNT, {"OMP_WAIT_POLICY": "ACTIVE"}),
])
def test_short_spin_unless_the_user_chose(monkeypatch, env, spin, want):
    for key in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    torch_thread.share_cpus_politely(spin)
    got = {k: os.environ[k] for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY") if k in os.environ}
    assert got == want
