"""node.chain.producer: blocks made inside running nodes (real hosts, real chains, real clock).

No assertion is about time itself: only about which blocks were made, by
whom, and on which chain they ended up.
"""

from __future__ import annotations

from dataclasses import replace

import trio

from ledger.crypto import SigningKey
from ledger.state import ACCOUNT
from ledger.types import COIN
from node.chain.producer import Producer, earliest_slot_ms, seal_block
from node.clock import now_ms
from node.wire.sync import BLOCKS_TOPIC
from tests.ledger.chainkit import make_net, new_db
from tests.node.netkit import chain_node, eventually, meshed, run


def fresh_net(n_nodes: int, slot_ms: int):
    """A chainkit net whose genesis is now (so that slots are in the future)."""
    net = make_net(n_nodes=n_nodes, slot_ms=slot_ms)
    net.genesis = replace(net.genesis, time_ms=now_ms())
    return net


def test_helpers_shared_with_pnode_produce():
    net = make_net(slot_ms=1000)
    db = new_db(net)
    ranks = sorted((earliest_slot_ms(db, k.public) - db.tip.time_ms, k) for k in net.nodes)
    assert [r for r, _ in ranks] == [0, 1000, 2000]
    gaps = [earliest_slot_ms(db, k.public, interval_ms=1500) - db.tip.time_ms for _, k in ranks]
    assert gaps == [1500, 1500, 2000]  # the interval, or the ladder if later
    assert earliest_slot_ms(db, SigningKey(b"\x09" * 32).public) is None
    first = ranks[0][1]
    applied = seal_block(db, first, now_ms=0)  # clock behind the tip: tip time + 1
    assert applied.block.header.time_ms == db.tip.time_ms + 1 and applied.rank == 0


def test_two_producers_take_turns_and_never_seal_on_an_old_tip():
    net = fresh_net(2, slot_ms=1000)
    dbs = [new_db(net) for _ in range(2)]
    alice, bob = net.users

    async def main():
        async with chain_node(1, dbs[0], now_ms, producer_key=net.nodes[0], interval_ms=40) as a, \
                chain_node(2, dbs[1], now_ms, producer_key=net.nodes[1], interval_ms=40) as b:
            await a.host.connect(b.host.addrs[0])
            await meshed(BLOCKS_TOPIC, (a.host, b.host), (b.host, a.host))
            tx = net.transfer(alice, bob.public, 3 * COIN)
            await b.txs.submit(tx)
            await eventually(lambda: min(db.height for db in dbs) >= 8, "8 blocks", 20)
            await eventually(lambda: dbs[0].tip_hash == dbs[1].tip_hash, "one tip")
            # Longest-wait ranking rotates rank 0: both made blocks, and each
            # waited for the other's block instead of sealing its rank-1 one
            # on the old tip (every block either made is on the main chain).
            made = {"a": list(a.producer.made), "b": list(b.producer.made)}
            assert made["a"] and made["b"], made
            for height, h in made["a"] + made["b"]:
                if height <= dbs[0].height:
                    assert dbs[0].hash_at(height) == h, (height, made)
            assert dbs[0].state.get(ACCOUNT + bob.public).balance == 103 * COIN  # tx landed
    run(main, 40)
    producers = {blk.header.producer for blk in list(dbs[0].iter_blocks())[1:]}
    assert producers == {net.nodes[0].public, net.nodes[1].public}
    dbs[0].verify_chain()


def test_a_node_that_is_no_producer_says_so_once_and_follows():
    net = fresh_net(1, slot_ms=200)
    dbs = [new_db(net) for _ in range(2)]
    lines: list[str] = []

    async def main():
        async with chain_node(1, dbs[0], now_ms, producer_key=net.nodes[0], interval_ms=40) as a, \
                chain_node(2, dbs[1], now_ms, producer_key=SigningKey(b"\x09" * 32),
                           report=lines.append) as b:
            await b.host.connect(a.host.addrs[0])
            await meshed(BLOCKS_TOPIC, (a.host, b.host), (b.host, a.host))
            await eventually(lambda: dbs[1].height >= 5, "B to follow A's blocks")
            assert b.producer.eligible is False and not b.producer.made
            assert isinstance(b.producer, Producer)
    run(main)
    assert lines == ["not a registered, bonded producer on this chain: following it"]
    assert all(blk.header.producer == net.nodes[0].public for blk in list(dbs[1].iter_blocks())[1:])


def test_held_producers_seal_nothing_more_and_end_on_one_tip():
    net = fresh_net(2, slot_ms=1000)
    dbs = [new_db(net) for _ in range(2)]

    async def main():
        async with chain_node(1, dbs[0], now_ms, producer_key=net.nodes[0], interval_ms=40) as a, \
                chain_node(2, dbs[1], now_ms, producer_key=net.nodes[1], interval_ms=40) as b:
            await a.host.connect(b.host.addrs[0])
            await meshed(BLOCKS_TOPIC, (a.host, b.host), (b.host, a.host))
            await eventually(lambda: min(db.height for db in dbs) >= 3, "3 blocks", 20)
            a.producer.hold()
            b.producer.hold()
            await eventually(lambda: dbs[0].tip_hash == dbs[1].tip_hash, "one tip")
            held_at = dbs[0].height
            made = len(a.producer.made) + len(b.producer.made)
            await trio.sleep(0.6)  # 15 intervals: unheld, they would have sealed blocks
            assert dbs[0].height == dbs[1].height == held_at
            assert len(a.producer.made) + len(b.producer.made) == made
    run(main, 40)
