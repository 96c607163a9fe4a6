"""node.mine.averaging: averaging rounds between real hosts on 127.0.0.1."""

from __future__ import annotations

from contextlib import AsyncExitStack

import torch
import trio

from compute.averaging import average_round, spread
from node.mine.averaging import Averager
from node.net.host import open_host
from tests.node.netkit import ident, run


class Replica:
    """A replica's tensors, as `Averager` reads and writes them."""

    def __init__(self, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.tensors = {"w": torch.randn(4, 3, generator=gen), "b": torch.randn(5, generator=gen)}

    def get(self) -> dict:
        return self.tensors

    def set(self, tensors: dict) -> None:
        self.tensors = tensors


def ring(ids: list[str]) -> dict[str, frozenset]:
    n = len(ids)
    return {ids[i]: frozenset({ids[(i - 1) % n], ids[(i + 1) % n]}) for i in range(n)}


async def replicas(stack: AsyncExitStack, n: int, timeout: float = 5.0):
    hosts = [await stack.enter_async_context(open_host(ident(i + 1))) for i in range(n)]
    for h in hosts[1:]:
        for other in hosts[: hosts.index(h)]:
            await h.connect(other.addrs[0])
    reps = [Replica(seed=i) for i in range(n)]
    avgs = []
    for h, r in zip(hosts, reps):
        a = Averager(h, "section-0", r.get, r.set, timeout=timeout)
        a.start()
        avgs.append(a)
    return hosts, reps, avgs


def snapshot(ids, reps) -> dict:
    return {i: {k: t.clone() for k, t in r.tensors.items()} for i, r in zip(ids, reps)}


def mean(state: dict, name: str) -> torch.Tensor:
    return torch.stack([s[name].to(torch.float64) for s in state.values()]).mean(0)


async def round_of(avgs, graph, ids, skip=()):
    results = {}

    async def one(a, i):
        results[i] = await a.average(graph[i])
    async with trio.open_nursery() as n:
        for a, i in zip(avgs, ids):
            if i not in skip:
                n.start_soon(one, a, i)
    return results


def test_rounds_over_the_network_match_the_math_and_converge():
    async def main():
        async with AsyncExitStack() as stack:
            hosts, reps, avgs = await replicas(stack, 4)
            ids = [str(h.peer_id) for h in hosts]
            graph = ring(ids)
            spreads = [spread(snapshot(ids, reps))]
            for _ in range(6):
                before = snapshot(ids, reps)
                results = await round_of(avgs, graph, ids)
                assert all(not r.missed and len(r.heard) == 2 for r in results.values())
                after = snapshot(ids, reps)
                want = average_round(before, graph)
                for i in ids:
                    for name in ("w", "b"):
                        assert torch.allclose(after[i][name], want[i][name], atol=1e-6)
                for name in ("w", "b"):
                    assert torch.allclose(mean(after, name), mean(before, name), atol=1e-6)
                spreads.append(spread(after))
            # Ring of 4, MH weights 1/3: second eigenvalue modulus 1/3.
            assert all(b <= a / 3 * 1.001 + 1e-6 for a, b in zip(spreads, spreads[1:]))
    run(main, deadline=60)


def test_a_neighbour_that_is_gone_is_left_out_without_stalling_the_rest():
    async def main():
        async with AsyncExitStack() as stack:
            hosts, reps, avgs = await replicas(stack, 4, timeout=1.5)
            ids = [str(h.peer_id) for h in hosts]
            graph = ring(ids)
            gone = ids[3]
            hosts[3].stop()
            await trio.sleep(0.3)
            before = snapshot(ids, reps)
            with trio.fail_after(5):  # bounded by the per-round timeout, not stalled
                results = await round_of(avgs, graph, ids, skip={gone})
            for i in ids[:3]:
                assert (gone in results[i].missed) == (gone in graph[i])
            after = snapshot(ids, reps)
            present = {i: after[i] for i in ids[:3]}
            was = {i: before[i] for i in ids[:3]}
            for name in ("w", "b"):  # the participants' mean is kept
                assert torch.allclose(mean(present, name), mean(was, name), atol=1e-6)
            assert spread(present) < spread(was)
    run(main, deadline=60)
