"""node.net.host with real py-libp2p hosts on 127.0.0.1 (ephemeral ports).

Every test runs its own trio loop under a hard ``fail_after`` deadline, so a
hang in py-libp2p fails the test instead of stalling CI.
"""

from __future__ import annotations

import struct

import multiaddr
import pytest
import trio
import trio.testing
from libp2p import new_host
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.security.insecure.transport import PLAINTEXT_PROTOCOL_ID, InsecureTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID, Yamux

from ledger.crypto import SigningKey, libp2p_peer_id
from node.errors import DataDirError, NodeError
from node.datadir import read_seed_file, write_seed_file
from node.net.framing import FrameEOF, FramingError, iter_frames, read_frame, write_frame
from node.net.host import (
    DialError, GossipError, HostConfig, HostError, PeerIdentity, RequestError, RequestTimeout,
    open_host,
)
from tests.node.netkit import eventually, ident, run

ECHO = "/pnode/test-echo/1.0.0"
RAW = "/pnode/test-raw/1.0.0"
TOPIC = "pnode/test/blocks"
FAST = HostConfig(handler_timeout=1.0)


async def echo(peer, request: bytes) -> bytes:
    """A strict handler: refuses (raises on) anything but b"PING..."."""
    if not request.startswith(b"PING"):
        raise ValueError("not a ping")
    return b"PONG" + request[4:]


# -- identity --------------------------------------------------------------------


def test_identity_peer_id_is_the_ledgers_peer_id(tmp_path):
    seed = bytes(range(32))
    me = PeerIdentity.from_seed(seed)
    assert me.public_key == SigningKey(seed).public
    assert me.peer_id.to_bytes() == libp2p_peer_id(me.public_key) == me.peer_id_bytes
    write_seed_file(tmp_path / "peer.key", SigningKey(seed))
    assert PeerIdentity.from_seed(read_seed_file(tmp_path / "peer.key").seed()).peer_id == me.peer_id


def test_identity_refuses_bad_seeds(tmp_path):
    for bad in (b"", b"x" * 31, b"x" * 33):
        with pytest.raises(HostError):
            PeerIdentity.from_seed(bad)
    with pytest.raises(DataDirError):
        read_seed_file(tmp_path / "missing.key")
    (tmp_path / "bad.key").write_text("zz\n")
    with pytest.raises(DataDirError):
        read_seed_file(tmp_path / "bad.key")
    assert issubclass(HostError, NodeError)


def test_same_seed_same_peer_id_across_restarts(tmp_path):
    write_seed_file(tmp_path / "peer.key", SigningKey(b"\x07" * 32))

    async def main():
        seen = []
        async with open_host(ident(9)) as client:
            for _ in range(2):
                async with open_host(PeerIdentity.from_seed(read_seed_file(tmp_path / "peer.key").seed())) as h:
                    h.set_request_handler(ECHO, echo)
                    seen.append(h.peer_id)
                    assert all(a.endswith(f"/p2p/{h.peer_id}") for a in h.addrs)
                    # Noise proves the restarted host holds the same key.
                    assert await client.connect(h.addrs[0]) == seen[0]
                    assert await client.request(seen[0], ECHO, b"PING", 5) == b"PONG"
                await eventually(lambda: seen[0] not in client.connected_peers(), "the hangup")
        assert seen[0] == seen[1]
        assert seen[0].to_bytes() == libp2p_peer_id(SigningKey(b"\x07" * 32).public)
    run(main)


# -- connections and requests --------------------------------------------------------


def test_request_round_trip_of_1_mb_and_20_concurrent():
    async def main():
        async with open_host(ident(1)) as a, open_host(ident(2)) as b:
            b.set_request_handler(ECHO, echo)
            assert await a.connect(b.addrs[0]) == b.peer_id
            assert b.peer_id in a.connected_peers()
            big = b"PING" + bytes(range(256)) * 4096  # 1 MiB + 4
            assert await a.request(b.peer_id, ECHO, big, 10) == b"PONG" + big[4:]
            results = {}

            async def one(i):
                results[i] = await a.request(b.peer_id, ECHO, b"PING%d" % i + bytes(i * 1000), 10)

            async with trio.open_nursery() as n:
                for i in range(20):
                    n.start_soon(one, i)
            assert results == {i: b"PONG%d" % i + bytes(i * 1000) for i in range(20)}
            assert dict(b.misbehaving) == {}
    run(main, 30)


def test_framing_over_a_real_libp2p_stream():
    async def main():
        async with open_host(ident(1)) as a, open_host(ident(2)) as b:
            async def frame_echo(stream, peer):
                async for payload in iter_frames(stream, 2 << 20):
                    await write_frame(stream, payload)

            b.set_handler(RAW, frame_echo)
            await a.connect(b.addrs[0])
            stream = await a.open_stream(b.peer_id, RAW)
            sent = [b"", b"x", bytes(2 << 20), b"last"]
            for p in sent:
                await write_frame(stream, p)
            await stream.close_write()
            got = [await read_frame(stream, 2 << 20, timeout=5) for _ in sent]
            assert got == sent
            with pytest.raises(FrameEOF):
                await read_frame(stream, 10, timeout=5)
    run(main)


def test_a_stopped_host_answers_nothing_more_on_open_streams():
    """stop() cancels running handlers at once, not when the connections are
    torn down: a killed server must look dead to its clients at once."""
    async def main():
        async with open_host(ident(1)) as a, open_host(ident(2)) as b:
            started, ended = trio.Event(), trio.Event()

            async def hold(stream, peer):
                started.set()
                try:
                    await trio.sleep_forever()
                finally:
                    ended.set()

            b.set_handler(RAW, hold)
            await a.connect(b.addrs[0])
            stream = await a.open_stream(b.peer_id, RAW)
            await write_frame(stream, b"hello")
            await started.wait()
            b.stop()
            await trio.testing.wait_all_tasks_blocked()
            assert ended.is_set()
            with pytest.raises(FramingError):
                await read_frame(stream, 1 << 10, timeout=5)
            with pytest.raises((RequestError, FramingError)):  # nor is a new stream
                late = await a.open_stream(b.peer_id, RAW)
                await write_frame(late, b"late")
                await read_frame(late, 1 << 10, timeout=5)
    run(main)


def test_errors_of_connect_and_request():
    async def main():
        async with open_host(ident(1)) as a, open_host(ident(2)) as b:
            for bad in ("not an addr", "/ip4/127.0.0.1/tcp/1"):  # no /p2p/ part
                with pytest.raises(DialError):
                    await a.connect(bad)
            # Right address, wrong identity: the Noise handshake refuses it.
            impostor = b.addrs[0].rsplit("/p2p/", 1)[0] + f"/p2p/{ident(3).peer_id}"
            with pytest.raises(DialError):
                await a.connect(impostor)
            await a.connect(b.addrs[0])
            with pytest.raises(RequestError):  # b does not speak it
                await a.request(b.peer_id, "/pnode/nobody/1.0.0", b"PING", 5)

            async def slow(peer, request):
                await trio.sleep(10)
                return b""

            b.set_request_handler("/pnode/slow/1.0.0", slow)
            with pytest.raises(RequestTimeout):
                await a.request(b.peer_id, "/pnode/slow/1.0.0", b"x", 0.3)
            b.set_request_handler(ECHO, echo)
            with pytest.raises(RequestError):  # b refuses (resets) a non-ping
                await a.request(b.peer_id, ECHO, b"nope", 5)
            with pytest.raises(RequestError):  # answer larger than we accept
                await a.request(b.peer_id, ECHO, b"PING" + bytes(100), 5, max_response_size=50)
            assert await a.request(str(b.peer_id), ECHO, b"PING!", 5) == b"PONG!"
    run(main)


def test_a_departed_peer_is_redialled_with_backoff_not_by_every_caller(caplog):
    async def main():
        config = HostConfig(redial_first_s=0.5, redial_max_s=4.0)
        async with open_host(ident(1), config=config) as a:
            async with open_host(ident(2)) as b:
                b.set_request_handler(ECHO, echo)
                await a.connect(b.addrs[0])
                assert await a.request(b.peer_id, ECHO, b"PING", 5) == b"PONG"
            await eventually(lambda: b.peer_id not in a.connected_peers(), "b to go")
            caplog.clear()
            errors = []
            for _ in range(30):  # what many callers (pings, syncs, pushes) do at once
                with pytest.raises(RequestError) as info:
                    await a.open_stream(b.peer_id, ECHO)
                errors.append(str(info.value))
            backing_off = [e for e in errors if "not dialled again" in e]
            assert len(backing_off) == 29, errors[:3]  # one dial, not thirty
            # That one dial is py-libp2p's first try and its 3 retries; before, each
            # of the thirty made as many (and the auto-connector more, every 10 s).
            dials = [r for r in caplog.records if "Failed to open TCP stream" in r.getMessage()]
            assert len(dials) <= 4, len(dials)
            wait = float(backing_off[-1].rsplit("for ", 1)[1].split(" s")[0])
            assert 0 < wait <= 0.5
            await trio.sleep(wait + 0.05)  # the backoff over: dialled again, and doubled
            with pytest.raises(RequestError) as info:
                await a.open_stream(b.peer_id, ECHO)
            assert "not dialled again" not in str(info.value)
            with pytest.raises(RequestError, match=r"not dialled again for (0\.[6-9]|1\.0) s"):
                await a.open_stream(b.peer_id, ECHO)
            async with open_host(ident(2)) as b2:  # back, at a new address: a connect clears it
                b2.set_request_handler(ECHO, echo)
                await a.connect(b2.addrs[0])
                assert await a.request(b2.peer_id, ECHO, b"PING", 5) == b"PONG"
    run(main)


# -- security ---------------------------------------------------------------------------


def test_only_noise_is_offered_and_a_plaintext_client_cannot_connect():
    async def main():
        async with open_host(ident(1)) as h, open_host(ident(2)) as friend:
            h.set_request_handler(ECHO, echo)
            assert h.security_protocols == ["/noise"]
            kp = ident(5).key_pair
            insecure = new_host(key_pair=kp, sec_opt={PLAINTEXT_PROTOCOL_ID: InsecureTransport(kp)},
                                muxer_opt={YAMUX_PROTOCOL_ID: Yamux})
            async with insecure.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
                with pytest.raises(Exception) as err:
                    with trio.fail_after(10):
                        await insecure.connect(info_from_p2p_addr(multiaddr.Multiaddr(h.addrs[0])))
                assert not isinstance(err.value, trio.TooSlowError)
                assert insecure.get_connected_peers() == []
                assert ident(5).peer_id not in h.connected_peers()
                # and our host cannot be talked down to plaintext either
                insecure_addr = f"{insecure.get_transport_addrs()[0]}/p2p/{insecure.get_id()}"
                with pytest.raises(DialError):
                    await h.connect(insecure_addr)
            await friend.connect(h.addrs[0])
            assert await friend.request(h.peer_id, ECHO, b"PING", 5) == b"PONG"
    run(main, 30)


def test_hostile_peer_only_loses_its_own_stream():
    async def main():
        async with open_host(ident(1), config=FAST) as h, open_host(ident(2)) as bad, \
                open_host(ident(3)) as good:
            h.set_request_handler(ECHO, echo)
            await bad.connect(h.addrs[0])
            await good.connect(h.addrs[0])

            async def attack(data: bytes, *, close: bool = True, reset: bool = False):
                stream = await bad.open_stream(h.peer_id, ECHO)
                if data:
                    await stream.write(data)
                if reset:
                    await stream.reset()
                    return
                if close:
                    await stream.close_write()
                with pytest.raises(FramingError):  # reset or closed: never an answer
                    await read_frame(stream, 1 << 20, timeout=5)
                assert await good.request(h.peer_id, ECHO, b"PING", 5) == b"PONG"

            await attack(struct.pack(">I", 2**32 - 1) + b"\x00" * 64)  # a 4 GB prefix
            assert h.misbehaving[bad.peer_id] == 1
            await attack(struct.pack(">I", 100) + b"only ten b")  # closes mid-frame
            assert h.misbehaving[bad.peer_id] == 2
            await attack(b"\x01\x02")  # closes inside the length prefix
            assert h.misbehaving[bad.peer_id] == 3
            await attack(struct.pack(">I", 8) + b"garbage!")  # well framed, refused by handler
            assert h.misbehaving[bad.peer_id] == 4
            await attack(b"", close=True)  # opens and closes without a request
            assert h.misbehaving[bad.peer_id] == 5
            # A stall (handler_timeout) loses the stream but is not misbehaviour: slow
            # is not hostile (issue 28 item 11); nor is a client that gives up (resets).
            await attack(struct.pack(">I", 100) + b"drip", close=False)
            await attack(struct.pack(">I", 100) + b"part", reset=True)
            assert await good.request(h.peer_id, ECHO, b"PING", 5) == b"PONG"
            assert h.misbehaving[bad.peer_id] == 5
            assert good.peer_id not in h.misbehaving
            # the hostile peer's connection still serves well-formed requests
            assert await bad.request(h.peer_id, ECHO, b"PING", 5) == b"PONG"
    run(main, 40)


async def drip(stream, data: bytes, *, piece: int = 64 * 1024, pause: float = 0.02) -> None:
    """Write ``data`` in pieces with a pause after each: a slow link, in user space."""
    for i in range(0, len(data), piece):
        await stream.write(data[i:i + piece])
        await trio.sleep(pause)


def test_slow_is_not_misbehaviour_and_large_frames_get_time_for_their_size():
    # Any point is a ban here; a base limit of 1 s, which the frames below outlast.
    config = HostConfig(handler_timeout=1.0, ban_threshold=1, ban_seconds=600.0)
    big = bytes(range(256)) * (4 * 1024 * 1024 // 256)  # 4 MiB: 1 s + 4 s at 1 MiB/s
    got = []

    async def keep(peer, request: bytes) -> bytes:
        got.append(request)
        return b"kept"

    async def main():
        async with open_host(ident(1), config=config) as h, open_host(ident(2)) as slow, \
                open_host(ident(3)) as bad:
            h.set_request_handler(ECHO, keep, max_request_size=8 << 20)
            await slow.connect(h.addrs[0])
            await bad.connect(h.addrs[0])
            # A slow sender (about 2 s for 4 MiB, over the flat 1 s) within 1 s + 4 s.
            stream = await slow.open_stream(h.peer_id, ECHO)
            await drip(stream, struct.pack(">I", len(big)) + big)
            assert await read_frame(stream, 100, timeout=10) == b"kept"
            assert got == [big] and h.misbehaving == {}
            # One that stalls loses its stream after the limit, and nothing more.
            stream = await slow.open_stream(h.peer_id, ECHO)
            await stream.write(struct.pack(">I", 100) + b"part")
            with pytest.raises(FramingError):
                await read_frame(stream, 100, timeout=10)
            assert h.misbehaving == {} and not h.is_banned(slow.peer_id)
            assert slow.peer_id in h.connected_peers()
            assert await slow.request(h.peer_id, ECHO, b"again", 5) == b"kept"
            # A slow answer: the requester's limit grows with its announced size.
            async def answer_slowly(stream, peer):
                await read_frame(stream, 100, timeout=5)
                await drip(stream, struct.pack(">I", len(big)) + big)
            slow.set_handler(RAW, answer_slowly)
            assert await h.request(slow.peer_id, RAW, b"x", 1.0, max_response_size=8 << 20) == big
            # Garbage is still misbehaviour: banned at once (ban_threshold 1).
            stream = await bad.open_stream(h.peer_id, ECHO)
            await stream.write(struct.pack(">I", 2**32 - 1) + b"\x00" * 64)
            await eventually(lambda: h.is_banned(bad.peer_id), "the ban")
            assert list(h.misbehaving) == [bad.peer_id] and not h.is_banned(slow.peer_id)
    run(main, 60)


# -- gossip -------------------------------------------------------------------------------


def test_gossip_travels_a_line_of_three_hosts():
    async def main():
        async with open_host(ident(1), gossip_topics=[TOPIC]) as a, \
                open_host(ident(2), gossip_topics=[TOPIC]) as b, \
                open_host(ident(3), gossip_topics=[TOPIC]) as c:
            at_a, at_c = a.subscribe(TOPIC), c.subscribe(TOPIC)
            await a.connect(b.addrs[0])
            await c.connect(b.addrs[0])
            assert c.peer_id not in a.connected_peers()
            await eventually(lambda: {a.peer_id, c.peer_id} <= b.mesh_peers(TOPIC)
                             and b.peer_id in a.mesh_peers(TOPIC)
                             and b.peer_id in c.mesh_peers(TOPIC), "the mesh")
            # 50 at once: over py-libp2p's default 10 messages/s per topic
            sent = [b"block %d" % i for i in range(50)]
            sent.append(bytes(range(256)) * (c.config.gossip_max_message // 256))
            for data in sent:
                await c.publish(TOPIC, data)
            got = []
            async with at_a:
                async for peer, data in at_a:
                    assert peer == c.peer_id
                    got.append(data)
                    if len(got) == len(sent):
                        break
            assert sorted(got) == sorted(sent)
            with pytest.raises(trio.WouldBlock):
                at_c.receive_nowait()  # no echo of our own messages
            with pytest.raises(GossipError):
                await c.publish(TOPIC, bytes(c.config.gossip_max_message + 1))
    run(main, 30)


def test_subscribe_to_a_topic_joined_late():
    async def main():
        async with open_host(ident(1)) as a, open_host(ident(2)) as b:
            await a.connect(b.addrs[0])
            async with a.subscribe("late") as sub_a, b.subscribe("late"):
                await eventually(lambda: b.peer_id in a.mesh_peers("late")
                                 and a.peer_id in b.mesh_peers("late"), "the mesh")
                await b.publish("late", b"hello")
                with trio.fail_after(5):
                    assert await sub_a.receive() == (b.peer_id, b"hello")
    run(main)


def test_validator_decides_what_is_delivered_and_relayed():
    async def main():
        async with open_host(ident(1), gossip_topics=[TOPIC]) as a, \
                open_host(ident(2), gossip_topics=[TOPIC]) as b, \
                open_host(ident(3), gossip_topics=[TOPIC]) as c:
            seen = []

            async def only_ok(origin, data, forwarder):
                seen.append((origin, data, forwarder))
                if data == b"boom":
                    raise ValueError("a validator that fails counts as False")
                return data.startswith(b"ok")

            b.set_validator(TOPIC, only_ok)
            at_b, at_c = b.subscribe(TOPIC), c.subscribe(TOPIC)
            await a.connect(b.addrs[0])
            await c.connect(b.addrs[0])
            await eventually(lambda: {a.peer_id, c.peer_id} <= b.mesh_peers(TOPIC)
                             and b.peer_id in a.mesh_peers(TOPIC)
                             and b.peer_id in c.mesh_peers(TOPIC), "the mesh")
            for data in (b"bad 1", b"boom", b"ok 1"):
                await a.publish(TOPIC, data)
            with trio.fail_after(5):
                assert await at_c.receive() == (a.peer_id, b"ok 1")
                assert await at_b.receive() == (a.peer_id, b"ok 1")
            assert sorted(seen) == sorted((a.peer_id, d, a.peer_id)
                                          for d in (b"bad 1", b"boom", b"ok 1"))
            await b.publish(TOPIC, b"own, not validated")
            with trio.fail_after(5):
                assert await at_c.receive() == (b.peer_id, b"own, not validated")
            assert len(seen) == 3
            b.set_validator(TOPIC, None)
            await a.publish(TOPIC, b"bad but unchecked")
            with trio.fail_after(5):
                assert await at_c.receive() == (a.peer_id, b"bad but unchecked")
                assert await at_b.receive() == (a.peer_id, b"bad but unchecked")
            for channel in (at_b, at_c):
                with pytest.raises(trio.WouldBlock):
                    channel.receive_nowait()  # nothing refused came through
    run(main)


def test_ban_threshold_disconnects_a_hostile_peer_and_refuses_it():
    config = HostConfig(handler_timeout=1.0, ban_threshold=3, ban_seconds=600.0)

    async def main():
        async with open_host(ident(1), config=config) as h, open_host(ident(2)) as bad, \
                open_host(ident(3)) as good:
            h.set_request_handler(ECHO, echo)
            await bad.connect(h.addrs[0])
            await good.connect(h.addrs[0])
            for i in range(2):
                with pytest.raises(RequestError):
                    await bad.request(h.peer_id, ECHO, b"nope", 5)
            assert h.misbehaving == {bad.peer_id: 2} and not h.is_banned(bad.peer_id)
            assert bad.peer_id in h.connected_peers()
            h.penalize(bad.peer_id, 1, "the last straw")
            assert h.is_banned(bad.peer_id) and h.misbehaving[bad.peer_id] == 3
            await eventually(lambda: h.peer_id not in bad.connected_peers(), "the hang-up")
            # It comes back: the connection is dropped, nothing it asks is served.
            try:
                await bad.connect(h.addrs[0])
            except DialError:
                pass
            with pytest.raises(RequestError):
                await bad.request(h.peer_id, ECHO, b"PING", 5)
            await eventually(lambda: h.peer_id not in bad.connected_peers(), "the refusal")
            assert bad.peer_id not in h.connected_peers()
            with pytest.raises(DialError, match="banned"):
                await h.connect(bad.addrs[0])
            assert h.misbehaving[bad.peer_id] == 3  # refused streams are not scored again
            # The others are served as ever.
            assert await good.request(h.peer_id, ECHO, b"PING", 5) == b"PONG"
            assert good.peer_id not in h.misbehaving
    run(main, 30)


def test_a_ban_ends_after_ban_seconds():
    config = HostConfig(ban_threshold=1, ban_seconds=1.0)

    async def main():
        async with open_host(ident(1), config=config) as h, open_host(ident(2)) as peer:
            h.set_request_handler(ECHO, echo)
            await peer.connect(h.addrs[0])
            h.penalize(peer.peer_id, 1, "test")
            assert h.is_banned(peer.peer_id)
            await eventually(lambda: not h.is_banned(peer.peer_id), "the ban to end", 5)
            assert peer.peer_id not in h.misbehaving  # a fresh start
            await peer.connect(h.addrs[0])
            assert await peer.request(h.peer_id, ECHO, b"PING", 5) == b"PONG"
    run(main)


def test_trusted_peers_only_for_dialing_gossip_and_private_protocols():
    private, public = "/pnode/test-private/1.0.0", "/pnode/test-public/1.0.0"

    async def main():
        trusted = {ident(2).peer_id}
        async with open_host(ident(1), gossip_topics=[TOPIC], trusted=trusted) as me, \
                open_host(ident(2), gossip_topics=[TOPIC]) as friend, \
                open_host(ident(3), gossip_topics=[TOPIC]) as stranger:
            me.set_request_handler(private, echo)
            me.set_request_handler(public, echo, public=True)
            with pytest.raises(DialError, match="not a trusted peer"):
                await me.connect(stranger.addrs[0])
            await me.connect(friend.addrs[0])
            await stranger.connect(me.addrs[0])  # inbound: a client may come in
            assert await stranger.request(me.peer_id, public, b"PING 1") == b"PONG 1"
            with pytest.raises(RequestError):
                await stranger.request(me.peer_id, private, b"PING 2", timeout=3)
            assert await friend.request(me.peer_id, private, b"PING 3") == b"PONG 3"
            assert stranger.peer_id not in me.misbehaving  # refused, not scored

            heard = me.subscribe(TOPIC)
            await eventually(lambda: {friend.peer_id, stranger.peer_id} <= me.topic_peers(TOPIC),
                             "both subscriptions")
            await stranger.publish(TOPIC, b"from a stranger")
            await friend.publish(TOPIC, b"from a friend")
            with trio.fail_after(5):
                assert await heard.receive() == (friend.peer_id, b"from a friend")
            await trio.sleep(0.3)
            with pytest.raises(trio.WouldBlock):
                heard.receive_nowait()  # the stranger's message never came through
    run(main)
