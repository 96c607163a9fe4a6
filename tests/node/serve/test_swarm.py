"""node.serve.swarm: signed announcements, their ageing, and their gossip between real hosts."""

from __future__ import annotations

from dataclasses import replace

import pytest
import trio

from ledger.codec import decode, encode
from node.clock import now_ms
from node.serve.swarm import Announcer, SwarmView, announce_peer
from node.wire.serve import SWARM_PROTOCOL, Announce, SwarmRequest, SwarmResponse, sign_announce
from tests.node.netkit import eventually, ident, run

NOW_MS = 1_700_000_000_000


def announce(n: int, *, start=0, end=10, time_ms=NOW_MS, load=0) -> Announce:
    me = ident(n)
    unsigned = Announce(me.public_key, bytes(32), (f"/ip4/127.0.0.1/tcp/1/p2p/{me.peer_id}",), "model",
                        start, end, 12_500, load, 8, 128, 2048, 0, time_ms, bytes(64))
    return sign_announce(unsigned, me.key_pair.private_key.sign)


def test_announcements_verify_and_name_their_peer():
    a = announce(1)
    assert a.verified() and announce_peer(a) == ident(1).peer_id
    assert a.throughput == 12.5
    assert decode(encode(a), Announce) == a


@pytest.mark.parametrize("tamper", [
    lambda a: replace(a, layer_end=30),  # a relay widening the span
    lambda a: replace(a, public_key=ident(2).public_key),  # claiming another peer's
    lambda a: replace(a, signature=bytes(64)),
    lambda a: replace(a, layer_start=10, layer_end=10),  # empty span, however signed
])
def test_altered_announcements_do_not_verify(tamper):
    a = tamper(announce(1))
    if a.layer_start == a.layer_end:
        a = sign_announce(a, ident(1).key_pair.private_key.sign)
    assert not a.verified()
    assert not SwarmView().add(a, 0.0, NOW_MS)


def test_view_keeps_the_newest_and_expires_after_ttl():
    view = SwarmView(ttl=4.0)
    assert view.add(announce(1, load=0), 0.0, NOW_MS)
    assert not view.add(announce(1, load=5, time_ms=NOW_MS - 1), 1.0, NOW_MS)  # older: refused
    assert view.add(announce(1, load=3, time_ms=NOW_MS + 1), 2.0, NOW_MS)
    assert [a.load for a in view.fresh(5.9)] == [3]  # refreshed at 2.0
    assert view.fresh(6.1) == []


def test_view_refuses_announcements_signed_long_ago():
    view = SwarmView(max_age_ms=30_000)
    assert not view.add(announce(1, time_ms=NOW_MS - 31_000), 0.0, NOW_MS)
    assert view.add(announce(1, time_ms=NOW_MS - 29_000), 0.0, NOW_MS)


def test_view_refuses_announcements_from_the_future_and_with_no_sessions():
    view = SwarmView(max_skew_ms=30_000)
    assert not view.add(announce(1, time_ms=NOW_MS + 31_000), 0.0, NOW_MS)
    me = ident(2)
    zero = sign_announce(replace(announce(2), max_sessions=0), me.key_pair.private_key.sign)
    assert zero.verified() and not view.add(zero, 0.0, NOW_MS)


def test_a_full_view_makes_room_by_its_stalest_entry():
    view = SwarmView(max_entries=3)
    for n, t in ((1, 0.0), (2, 1.0), (3, 2.0), (4, 3.0)):
        assert view.add(announce(n), t, NOW_MS)
    assert {announce_peer(a) for a in view.fresh(3.5)} == {ident(n).peer_id for n in (2, 3, 4)}


def test_a_swarm_response_fits_its_limits_and_puts_live_peers_first():
    from node.serve.swarm import encode_swarm_response
    from node.wire.serve import MAX_ANNOUNCES, MAX_SWARM_FRAME

    flood = [announce(n % 250 + 1, time_ms=NOW_MS + n) for n in range(600)]
    live = announce(251, time_ms=NOW_MS - 10_000)  # older, but a connected peer
    data = encode_swarm_response([*flood, live], {ident(251).peer_id})
    got = decode(data, SwarmResponse).announces
    assert len(got) <= MAX_ANNOUNCES and len(data) <= MAX_SWARM_FRAME
    assert got[0] == live


def test_view_drop_removes_a_peer_at_once():
    view = SwarmView()
    view.add(announce(1), 0.0, NOW_MS)
    view.add(announce(2), 0.0, NOW_MS)
    view.drop(ident(1).peer_id)
    assert [announce_peer(a) for a in view.fresh(0.5)] == [ident(2).peer_id]


def own(n: int, start: int, end: int):
    def make():
        return announce(n, start=start, end=end, time_ms=now_ms())
    return make


def test_announcements_spread_by_gossip_served_on_request_and_dropped_on_disconnect():
    from node.net.host import open_host

    async def main():
        async with open_host(ident(1)) as h1, open_host(ident(2)) as h2, \
                open_host(ident(3)) as h3, trio.open_nursery() as n:
            # Refreshes an hour apart: what a node that joins learns, it learns by
            # asking its new neighbours (the first gossip went out to nobody).
            a1 = await n.start(Announcer(h1, now_ms, own(1, 0, 10), interval=0.2,
                                         refresh=3600).run)
            a2 = await n.start(Announcer(h2, now_ms, own(2, 10, 30), interval=0.2,
                                         refresh=3600).run)
            a3 = await n.start(Announcer(h3, now_ms, interval=0.2).run)  # serves nothing
            await trio.sleep(4.0)  # past gossipsub's window (3 heartbeats) for re-sending it
            await h2.connect(h1.addrs[0])
            await eventually(lambda: len(a1.fresh()) == len(a2.fresh()) == 2, "nodes 1, 2 to meet")
            await h3.connect(h1.addrs[0])  # node 3 meets node 2's announcement through node 1

            def spans(announcer):
                return sorted((a.layer_start, a.layer_end) for a in announcer.fresh())
            await eventually(lambda: spans(a3) == [(0, 10), (10, 30)], "gossip to reach node 3")
            assert spans(a1) == spans(a2) == [(0, 10), (10, 30)]

            data = await h3.request(h1.peer_id, SWARM_PROTOCOL, encode(SwarmRequest()))
            served = decode(data, SwarmResponse).announces
            assert sorted(str(announce_peer(a)) for a in served) == sorted(
                [str(ident(1).peer_id), str(ident(2).peer_id)])

            h2.stop()  # node 2 goes away: node 1 drops it without waiting for the TTL
            await eventually(lambda: spans(a1) == [(0, 10)], "node 2 to be dropped", limit=3.0)
            n.cancel_scope.cancel()
    run(main)


async def listening(listener, speaker):
    """``listener`` connected to ``speaker`` and subscribed to its announcements."""
    from node.wire.serve import ANNOUNCE_TOPIC
    await listener.connect(speaker.addrs[0])
    heard = listener.subscribe(ANNOUNCE_TOPIC)
    await listener.join(ANNOUNCE_TOPIC)
    await eventually(lambda: listener.peer_id in speaker.topic_peers(ANNOUNCE_TOPIC),
                     "subscription")
    return heard


def test_an_announcement_is_gossiped_when_what_it_says_changes_not_on_every_tick():
    from node.net.host import open_host

    state = {"end": 10, "load": 0}

    def make():  # max_sessions is 8
        return announce(1, end=state["end"], load=state["load"], time_ms=now_ms())

    async def main():
        async with open_host(ident(1)) as h1, open_host(ident(2)) as h2, \
                trio.open_nursery() as n:
            heard = await listening(h2, h1)
            await trio.sleep(1.5)  # a heartbeat or so: node 2 in node 1's mesh
            await n.start(Announcer(h1, now_ms, make, interval=0.05, refresh=3600).run)

            async def next_one(limit: float) -> Announce | None:
                with trio.move_on_after(limit):
                    _, data = await heard.receive()
                    return decode(data, Announce)
                return None
            assert (await next_one(5.0)).layer_end == 10  # at start
            assert await next_one(1.0) is None  # unchanged: 20 ticks, no gossip
            state["load"] = 3  # sessions come and go: not worth a gossip round
            assert await next_one(1.0) is None
            state["end"] = 20  # a new span: at once
            assert (await next_one(5.0)).layer_end == 20
            state["load"] = 8  # full: clients must hear it
            assert (await next_one(5.0)).load == 8
            n.cancel_scope.cancel()
    run(main)


def test_an_unchanged_announcement_is_gossiped_again_every_refresh():
    from node.net.host import open_host

    async def main():
        async with open_host(ident(1)) as h1, open_host(ident(2)) as h2, \
                trio.open_nursery() as n:
            heard = await listening(h2, h1)
            await n.start(Announcer(h1, now_ms, own(1, 0, 10), interval=0.05, refresh=0.5).run)
            times = []
            with trio.move_on_after(3.0):
                async for _ in heard:
                    times.append(trio.current_time())
            gaps = [b - a for a, b in zip(times, times[1:])]
            assert len(gaps) >= 3 and all(g > 0.3 for g in gaps), gaps  # not every tick
            n.cancel_scope.cancel()
    run(main)


def test_a_neighbour_answering_garbage_for_its_view_scores_a_point():
    from node.net.host import open_host
    from node.wire.serve import ANNOUNCE_TOPIC

    async def garbage(peer, request: bytes) -> bytes:
        return b"not a swarm response"

    async def main():
        async with open_host(ident(1)) as h1, open_host(ident(2)) as h2, \
                trio.open_nursery() as n:
            a1 = await n.start(Announcer(h1, now_ms, own(1, 0, 10), interval=0.05).run)
            h2.set_request_handler(SWARM_PROTOCOL, garbage, max_request_size=64, public=True)
            await h2.connect(h1.addrs[0])
            await h2.join(ANNOUNCE_TOPIC)  # a new neighbour on the topic: its view is asked
            await eventually(lambda: h1.misbehaving.get(h2.peer_id, 0) >= 1, "a point")
            assert [announce_peer(a) for a in a1.fresh()] == [ident(1).peer_id]
            n.cancel_scope.cancel()
    run(main)


def test_an_allow_list_keeps_only_trusted_announcements():
    from node.net.host import open_host

    async def main():
        async with open_host(ident(1)) as h1:
            announcer = Announcer(h1, now_ms, allowed={ident(2).peer_id})
            assert announcer.take(announce(2, time_ms=now_ms()))
            assert not announcer.take(announce(3, time_ms=now_ms()))
            assert announcer.take(announce(1, time_ms=now_ms()))  # its own, always
            assert sorted(str(announce_peer(a)) for a in announcer.fresh()) == sorted(
                [str(ident(1).peer_id), str(ident(2).peer_id)])
    run(main)


def test_garbage_on_the_announce_topic_scores_the_sender():
    from node.net.host import open_host
    from node.wire.serve import ANNOUNCE_TOPIC

    async def main():
        async with open_host(ident(1)) as h1, open_host(ident(2)) as h2, \
                trio.open_nursery() as n:
            a1 = await n.start(Announcer(h1, now_ms, interval=0.2).run)
            await h2.connect(h1.addrs[0])
            await h2.join(ANNOUNCE_TOPIC)
            await eventually(lambda: h2.peer_id in h1.topic_peers(ANNOUNCE_TOPIC), "subscription")
            forged = replace(announce(3, time_ms=now_ms()), layer_end=30)
            await h2.publish(ANNOUNCE_TOPIC, b"garbage")
            await h2.publish(ANNOUNCE_TOPIC, encode(forged))
            await eventually(lambda: h1.misbehaving.get(h2.peer_id, 0) >= 2, "two points")
            assert a1.fresh() == []
            n.cancel_scope.cancel()
    run(main)
