"""node.chain.sync with real hosts on 127.0.0.1 and real ChainDBs built by chainkit.

Each test runs its own trio loop under a hard ``fail_after`` deadline (see
tests/node/net/test_host.py). Chains are real: real keys, signatures and rules.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import replace

import pytest
import trio

from ledger.chaindb import KNOWN, MAX_REORG_DEPTH, ChainDB
from ledger.codec import decode, encode
from ledger.schedule import is_better_tip
from ledger.state import state_root
from ledger.store import LevelDBStore
from ledger.types import COIN, Block, sign
from node.chain.sync import ChainService, PeerMisbehaved, SyncFailed
from node.net.host import RequestError, open_host
from node.wire.sync import (
    BLOCKS_TOPIC, MAX_SYNC_RESPONSE_FRAME, SYNC_PROTOCOL, BlocksRequest, BlocksResponse,
    SyncRequest, TipRequest,
    TipResponse,
)
from tests.ledger.chainkit import copy_chain, make_net, new_db, next_block
from tests.node.netkit import eventually, ident, run

NOW_MS = 10**13  # far after every test block: nothing is "in the future"


def clock() -> int:
    return NOW_MS


class Spy(ChainService):
    """A ChainService that records every gossiped message it validates."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.heard: list[bytes] = []

    async def _on_gossip(self, origin, data, forwarder):
        self.heard.append(data)
        return await super()._on_gossip(origin, data, forwarder)


@asynccontextmanager
async def node(n: int, chain: ChainDB, now=clock, kind=ChainService):
    """A host on loopback running a ChainService (or ``kind``) over ``chain``."""
    async with open_host(ident(n), gossip_topics=[BLOCKS_TOPIC]) as host:
        async with trio.open_nursery() as nursery:
            service = await nursery.start(kind(chain, host, now).run)
            yield service
            nursery.cancel_scope.cancel()


async def meshed(*pairs) -> None:
    """Wait until each (a, b) sees b in its blocks-topic mesh."""
    await eventually(lambda: all(b.host.peer_id in a.host.mesh_peers(BLOCKS_TOPIC)
                                 for a, b in pairs), "the gossip mesh")


def build(db: ChainDB, net, n: int, rank: int = 0, pay: int = 1) -> list[Block]:
    """Add ``n`` blocks of the rank-``rank`` producer, each paying ``pay`` coin."""
    alice, bob = net.users
    out = []
    for _ in range(n):
        tx = net.transfer(alice, bob.public, pay * COIN)
        applied = next_block(db, net, [tx], rank=rank)
        db.add_block(applied.block, now_ms=None)
        out.append(applied.block)
    return out


async def produce(service: ChainService, net, n: int) -> None:
    """Make ``n`` blocks on the service's chain and gossip them, as a producer would."""
    alice, bob = net.users
    for _ in range(n):
        tx = net.transfer(alice, bob.public, COIN)
        applied = await service.call(next_block, service.chain, net, [tx])
        await service.add_block(applied.block)


def same_chain(a: ChainDB, b: ChainDB) -> bool:
    return a.tip_hash == b.tip_hash and state_root(a.state) == state_root(b.state)


# -- tests ---------------------------------------------------------------------------


def test_empty_node_syncs_40_blocks():
    net = make_net()
    source, empty = new_db(net), new_db(net)
    build(source, net, 40)

    async def main():
        async with node(1, source) as a, node(2, empty) as b:
            await b.host.connect(a.host.addrs[0])
            start = trio.current_time()
            result = await b.sync_from(a.host.peer_id)
            elapsed = trio.current_time() - start
            print(f"\nsynced 40 blocks in {elapsed * 1000:.0f} ms ({40 / elapsed:.0f} blocks/s)")
            assert (result.added, result.height, result.tip_hash) == (40, 40, source.tip_hash)
            again = await b.sync_from(a.host.peer_id)
            assert again.added == 0
            assert (await a.sync_from(b.host.peer_id)).added == 0
    run(main)
    assert same_chain(empty, source) and empty.tip.state_root == source.tip.state_root
    empty.verify_chain()


def test_three_nodes_sync_a_chain_made_while_one_was_down(tmp_path):
    net = make_net()
    a_db, b_db = new_db(net), new_db(net)
    c_db = new_db(net, LevelDBStore(tmp_path / "c"))

    async def main():
        async with node(1, a_db) as a, node(2, b_db) as b:
            await b.host.connect(a.host.addrs[0])
            async with node(3, c_db) as c:
                await c.host.connect(a.host.addrs[0])
                await c.host.connect(b.host.addrs[0])
                await meshed((a, b), (a, c), (b, a), (c, a))
                await produce(a, net, 10)
                await eventually(lambda: same_chain(b_db, a_db) and same_chain(c_db, a_db),
                                 "B and C to follow A by gossip")
                assert a_db.height == 10
            c_db.store.close()  # C is down: A makes 10 more, B follows
            await produce(a, net, 10)
            await eventually(lambda: same_chain(b_db, a_db), "B to follow A")
            # C stays down until gossipsub no longer offers those blocks (IHAVE):
            # only a sync can bring them back.
            await eventually(lambda: not any(s.host._gossipsub.mcache.window(BLOCKS_TOPIC)
                                             for s in (a, b)), "the gossip window to pass")
            restarted = ChainDB(LevelDBStore(tmp_path / "c"))
            assert restarted.height == 10
            async with node(3, restarted) as c:
                await c.connect(a.host.addrs[0])  # dials, then syncs in the background
                await eventually(lambda: same_chain(restarted, a_db), "C to catch up")
                assert (await c.sync_from(a.host.peer_id)).added == 0
            assert restarted.height == 20
            restarted.verify_chain()
            restarted.store.close()
    run(main, 40)


def test_gossiped_block_with_unknown_parent_triggers_a_sync():
    net = make_net()
    x_db = new_db(net)
    build(x_db, net, 15)  # never gossiped
    m_db, y_db = copy_chain(net, x_db), new_db(net)

    async def main():
        async with node(1, x_db) as x, node(2, m_db) as m, node(3, y_db) as y:
            await x.host.connect(m.host.addrs[0])  # a line: X - M - Y
            await y.host.connect(m.host.addrs[0])
            await meshed((x, m), (m, x), (m, y), (y, m))
            await produce(x, net, 1)
            # M extends its chain and relays; Y lacks the parent and the origin
            # X is no neighbour of Y, so Y syncs from its mesh neighbour M.
            await eventually(lambda: same_chain(y_db, x_db) and same_chain(m_db, x_db),
                             "Y to sync through M")
            assert x.host.peer_id not in y.host.connected_peers()
            assert y_db.height == 16
    run(main)
    y_db.verify_chain()


def test_diverged_nodes_converge_on_the_heavier_chain():
    net = make_net()
    x_db = new_db(net)
    build(x_db, net, 5)
    y_db = copy_chain(net, x_db)
    fork = x_db.height
    build(x_db, net, 12, rank=0, pay=3)   # 12 x weight 2^32
    build(y_db, net, 20, rank=1, pay=2)   # 20 x weight 2^31: longer, lighter
    assert y_db.height > x_db.height
    w = {db: db.meta(db.tip_hash).weight for db in (x_db, y_db)}
    assert is_better_tip(w[x_db], x_db.tip_hash, w[y_db], y_db.tip_hash)
    x_tip = x_db.tip_hash

    async def main():
        async with node(1, x_db) as x, node(2, y_db) as y:
            await x.host.connect(y.host.addrs[0])
            assert (await x.sync_from(y.host.peer_id)).added == 0  # Y's tip is lighter
            result = await y.sync_from(x.host.peer_id)
            # Y walked back from X's tip (height fork + 12) to the fork point.
            assert (result.added, result.reorg_depth) == (12, 20)
            assert (await x.sync_from(y.host.peer_id)).added == 0
    run(main)
    assert x_db.tip_hash == x_tip and same_chain(x_db, y_db)
    assert all(y_db.hash_at(h) == x_db.hash_at(h) for h in range(x_db.height + 1))
    assert y_db.hash_at(x_db.height + 1) is None and y_db.hash_at(fork) == x_db.hash_at(fork)
    y_db.verify_chain()


def test_fork_deeper_than_max_reorg_depth_is_refused_unpunished():
    net = make_net()
    deep = new_db(net)
    build(deep, net, 2)
    heavy = copy_chain(net, deep)
    build(deep, net, MAX_REORG_DEPTH + 6, rank=1)
    build(heavy, net, MAX_REORG_DEPTH // 2 + 8, rank=0)  # heavier, forks too far back
    tip = deep.tip_hash

    async def main():
        async with node(1, deep) as d, node(2, heavy) as h:
            await d.host.connect(h.host.addrs[0])
            with pytest.raises(SyncFailed, match="within"):
                await d.sync_from(h.host.peer_id)
            assert d.host.misbehaving == {}
    run(main)
    assert deep.tip_hash == tip


def test_blocks_from_the_future_wait_for_the_local_clock():
    net = make_net()
    source, late = new_db(net), new_db(net)
    build(source, net, 20, rank=1)  # 1 s apart: the last ones are ahead of `late`'s clock
    max_future = net.genesis.params.max_future_ms
    local_ms = [net.genesis.time_ms]
    in_time = sum(b.header.time_ms <= local_ms[0] + max_future for b in source.iter_blocks()) - 1

    async def main():
        async with node(1, source) as a, node(2, late, lambda: local_ms[0]) as b:
            await b.host.connect(a.host.addrs[0])
            with pytest.raises(SyncFailed, match="TimeInFuture"):
                await b.sync_from(a.host.peer_id)
            assert late.height == in_time < 20 and b.host.misbehaving == {}
            local_ms[0] = source.tip.time_ms  # time passes
            assert (await b.sync_from(a.host.peer_id)).added == 20 - in_time
    run(main)
    assert same_chain(late, source)


def test_hostile_peer_is_scored_and_honest_sync_still_works():
    net = make_net()
    honest_db = new_db(net)
    build(honest_db, net, 30)
    victim_db = new_db(net)
    for h in range(1, 6):
        victim_db.add_block(honest_db.block_at(h), now_ms=None)
    start_tip = victim_db.tip_hash
    mode = ["bad signature"]

    def forged(block: Block) -> Block:
        if mode[0] == "bad signature":
            sig = bytes([block.header.signature[0] ^ 1]) + block.header.signature[1:]
            return replace(block, header=replace(block.header, signature=sig))
        # Correctly signed by the right producer, but a false state root.
        key = next(k for k in net.nodes if k.public == block.header.producer)
        return replace(block, header=sign(replace(block.header, state_root=bytes(32)), key))

    async def evil_handler(peer, request: bytes) -> bytes:
        msg = decode(request, SyncRequest)
        if mode[0] == "garbage":
            return b"\x93\x00garbage"
        if isinstance(msg, TipRequest):  # the honest tip: worth syncing
            tip = honest_db.tip_hash
            return encode(TipResponse(honest_db.height, tip, honest_db.meta(tip).total_weight,
                                      honest_db.hash_at(0)))
        if mode[0] == "empty":  # claims the honest tip, then has no block of it
            return encode(BlocksResponse(()))
        if mode[0] == "oversized":
            return b"\x00" * (MAX_SYNC_RESPONSE_FRAME + 1)
        blocks = [honest_db.block_at(msg.start_height)]
        if mode[0] == "unlinked":
            blocks.append(honest_db.block_at(msg.start_height + 2))
            return encode(BlocksResponse(tuple(blocks)))
        return encode(BlocksResponse((forged(blocks[0]),)))

    async def main():
        async with node(1, honest_db) as honest, node(2, victim_db) as victim, \
                open_host(ident(9), gossip_topics=[BLOCKS_TOPIC]) as evil:
            evil.set_request_handler(SYNC_PROTOCOL, evil_handler)
            await victim.host.connect(evil.addrs[0])
            await victim.host.connect(honest.host.addrs[0])
            scores = victim.host.misbehaving
            for i, (m, why) in enumerate([("bad signature", "BadSignature"),
                                          ("bad state root", "BadStateRoot"),
                                          ("garbage", "undecodable TipResponse"),
                                          ("unlinked", "height"),
                                          ("empty", "empty BlocksResponse"),
                                          ("oversized", "oversized BlocksResponse")]):
                mode[0] = m
                with pytest.raises(PeerMisbehaved, match=why):
                    await victim.sync_from(evil.peer_id)
                assert scores[evil.peer_id] == i + 1 and victim_db.tip_hash == start_tip
            # Gossip: garbage and a forged block from the hostile peer score too.
            await eventually(lambda: victim.host.peer_id in evil.mesh_peers(BLOCKS_TOPIC),
                             "the gossip mesh")
            mode[0] = "bad signature"
            await evil.publish(BLOCKS_TOPIC, b"not a block")
            await evil.publish(BLOCKS_TOPIC, encode(forged(honest_db.block_at(6))))
            await eventually(lambda: scores[evil.peer_id] == 8, "gossip misbehaviour scored")
            # The victim's validator refused both, so gossipsub relayed neither
            # to the honest node (validation is over: the victim scored them).
            assert evil.peer_id not in honest.host.misbehaving
            assert victim_db.tip_hash == start_tip
            result = await victim.sync_from(honest.host.peer_id)
            assert result.added == 25 and honest.host.peer_id not in scores
            # The honest node serves no more than the cap, and refuses more.
            await evil.connect(honest.host.addrs[0])
            with pytest.raises(RequestError):
                await evil.request(honest.host.peer_id, SYNC_PROTOCOL,
                                   encode(BlocksRequest(0, 1))[:-1] + b"\xcc\xc8", 5)
            # One point for the request; two more if py-libp2p replays its recent
            # gossip (still in its cache window) to the newly connected peer: one
            # of the two may still be on its way (2), so wait for a final count.
            await eventually(lambda: honest.host.misbehaving in ({evil.peer_id: 1},
                                                                 {evil.peer_id: 3}),
                             "the request scored (and any replayed gossip)")
    run(main, 30)
    assert same_chain(victim_db, honest_db)
    victim_db.verify_chain()
    assert victim_db.add_block(honest_db.block_at(30), now_ms=None).status == KNOWN


def test_an_invalid_block_is_not_relayed():
    net = make_net()
    source = new_db(net)
    blocks = build(source, net, 5)
    b_db, c_db = new_db(net), new_db(net)
    for db in (b_db, c_db):
        for block in blocks[:2]:
            db.add_block(block, now_ms=None)
    third = blocks[2]
    sig = bytes([third.header.signature[0] ^ 1]) + third.header.signature[1:]
    forged = replace(third, header=replace(third.header, signature=sig))

    async def main():
        # A line: the hostile host E - B - C.
        async with open_host(ident(9), gossip_topics=[BLOCKS_TOPIC]) as evil, \
                node(2, b_db, kind=Spy) as b, node(3, c_db, kind=Spy) as c:
            await evil.connect(b.host.addrs[0])
            await c.host.connect(b.host.addrs[0])
            await meshed((b, c), (c, b))
            await eventually(lambda: b.host.peer_id in evil.mesh_peers(BLOCKS_TOPIC), "mesh")
            # forged, orphaned (parent unknown to B), then valid
            for block in (forged, blocks[4], third):
                await evil.publish(BLOCKS_TOPIC, encode(block))
            await eventually(lambda: c_db.tip_hash == source.hash_at(3), "C to get block 3")
            sent = {encode(block) for block in (forged, blocks[4], third)}
            await eventually(lambda: sent <= set(b.heard), "B to judge all three")
            assert b.host.misbehaving == {evil.peer_id: 1}
            # B relayed only the block it added (perhaps twice: relayed, then
            # announced as its new tip after the sync the orphan set off).
            assert c.heard and set(c.heard) == {encode(third)}
            assert c.host.misbehaving == {}
    run(main)
    assert b_db.tip_hash == c_db.tip_hash == source.hash_at(3)


def test_orphan_gossip_sets_off_a_bounded_number_of_syncs():
    """A peer gossiping blocks whose parents nobody knows gets a few syncs, not one each."""
    import os
    net = make_net()
    b_db = new_db(net)
    build(b_db, net, 3)
    e_db = copy_chain(net, b_db)  # E's chain is B's: a sync from E brings nothing
    template = b_db.block_at(3)
    orphans = [replace(template, header=replace(template.header, prev_hash=os.urandom(32)))
               for _ in range(60)]

    async def main():
        async with node(1, b_db, kind=Spy) as b, node(2, e_db) as e:
            await e.host.connect(b.host.addrs[0])
            await meshed((e, b), (b, e))
            began = trio.current_time()
            for block in orphans:  # over about 3 s
                await e.host.publish(BLOCKS_TOPIC, encode(block))
                await trio.sleep(0.05)
            sent = {encode(block) for block in orphans}
            await eventually(lambda: sent <= set(b.heard), "B to judge them all")
            elapsed = trio.current_time() - began
            # Quiet gaps of 0.5, 1, 2, 4 ... s after each sync that brought nothing.
            assert 1 <= b.background_syncs <= 2 + elapsed.__ceil__().bit_length(), \
                (b.background_syncs, elapsed)
            assert b.host.misbehaving == {}  # an orphan proves no fault
            assert b_db.height == 3
    run(main)
