"""`PeerKeeper` redialling a lost peer and `AloneWatch`, on real hosts on 127.0.0.1."""

from __future__ import annotations

import trio

from node.net import AloneWatch, PeerKeeper, open_host
from tests.node.netkit import eventually, ident, run


def test_a_lost_peer_is_redialled_and_producing_alone_is_said_once():
    async def main():
        lines: list[str] = []
        produced = [0]
        synced: list[object] = []

        async def sync(peer):
            synced.append(peer)
        seen: list[str] = []
        async with open_host(ident(1)) as a, trio.open_nursery() as nursery:
            b = await nursery.start(_host_until, ident(2), "/ip4/127.0.0.1/tcp/0")
            addr_b = b.addrs[0]
            keeper = PeerKeeper(a, sync, peers=[addr_b, a.addrs[0]], dial_attempts=2,
                                first_backoff_s=0.05, resync_s=60, report=lines.append,
                                seen=seen.append)
            assert keeper.peers == (addr_b,)  # its own address is never dialled
            watch = AloneWatch(a, lambda: produced[0], report=lines.append, now_ms=lambda: 0)
            joined = trio.Event()
            nursery.start_soon(keeper.join_all, joined)
            await joined.wait()
            assert seen == [addr_b] and synced == [b.peer_id]
            watch.look()
            assert watch.had_peers
            b.stop()
            await b.wait_stopped()
            await eventually(lambda: not a.connected_peers(), "A to see B gone")
            watch.look()
            watch.look()
            assert not any("alone" in line for line in lines)  # no block made alone yet
            produced[0] += 1
            watch.look()
            produced[0] += 1
            watch.look()
            assert sum("producing alone: no peer connected since" in ln for ln in lines) == 1
            # B back on the same address: A redials it without being told.
            listen = addr_b.rsplit("/p2p/", 1)[0]
            b2 = await nursery.start(_host_until, ident(2), listen)
            await eventually(lambda: b2.peer_id in a.connected_peers(), "A to redial B")
            assert f"reconnected to peer {addr_b}" in lines and seen == [addr_b, addr_b]
            assert synced == [b.peer_id, b.peer_id]
            watch.look()
            assert any(ln.startswith("peers are back (1 connected)") for ln in lines)
            nursery.cancel_scope.cancel()
    run(main, deadline=40)


async def _host_until(identity, listen, *, task_status=trio.TASK_STATUS_IGNORED):
    async with open_host(identity, listen) as host:
        task_status.started(host)
        await host.wait_stopped()


def test_a_malformed_or_untrusted_address_is_tried_once_and_not_kept():
    async def main():
        lines: list[str] = []

        async def sync(peer):
            raise AssertionError("nothing to sync from")
        outsider = ident(3)
        async with open_host(ident(1), trusted=[ident(2).peer_id]) as a, \
                open_host(outsider) as c:
            keeper = PeerKeeper(a, sync, peers=["/ip4/127.0.0.1/tcp/1", c.addrs[0]],
                                dial_attempts=5, first_backoff_s=0.05, resync_s=60,
                                report=lines.append)
            joined = trio.Event()
            await keeper.join_all(joined)  # returns: nothing left to keep
            assert joined.is_set() and not a.connected_peers()
            assert sorted(ln.split(":", 1)[0] for ln in lines) == sorted(
                f"giving up on peer {addr}" for addr in keeper.peers)
            assert any("not a trusted peer" in ln for ln in lines)
    run(main)
