"""node.chain.txgossip with real hosts on 127.0.0.1 and real ChainDBs from chainkit.

Nodes in a line A - B - C: what A submits reaches C through B; what B
refuses never reaches C.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ledger import schema
from ledger.codec import encode
from ledger.errors import BadNonce
from ledger.types import COIN, tx_hash
from node.net.host import open_host
from node.wire.sync import TXS_TOPIC
from tests.ledger.chainkit import make_net, new_db
from tests.node.netkit import chain_node, eventually, ident, meshed, run

NOW_MS = 10**13


def clock() -> int:
    return NOW_MS


def queued(db, tx) -> bool:
    return db.store.get(schema.mempool_key(tx_hash(tx))) is not None


def test_a_submitted_tx_reaches_every_mempool_once():
    net = make_net()
    dbs = [new_db(net) for _ in range(3)]
    alice, bob = net.users
    tx, second = (net.transfer(alice, bob.public, n * COIN) for n in (2, 3))

    async def main():
        async with chain_node(1, dbs[0], clock) as a, chain_node(2, dbs[1], clock) as b, \
                chain_node(3, dbs[2], clock) as c:
            await a.host.connect(b.host.addrs[0])
            await c.host.connect(b.host.addrs[0])
            await meshed(TXS_TOPIC, (a.host, b.host), (b.host, a.host), (b.host, c.host),
                         (c.host, b.host))
            txid = await a.txs.submit(tx)
            assert txid == tx_hash(tx) and queued(dbs[0], tx)
            await eventually(lambda: all(queued(db, tx) for db in dbs), "the tx everywhere")
            # Again: a duplicate is neither an error nor gossiped again.
            assert await a.txs.submit(tx) == txid
            await a.txs.submit(second)  # the next nonce, on top of the queued one
            await eventually(lambda: all(queued(db, second) for db in dbs), "the second tx")
            assert (b.txs.admitted, c.txs.admitted) == (2, 2)
            assert b.txs.rejected == c.txs.rejected == 0
            # One the node refuses is not gossiped at all.
            with pytest.raises(BadNonce):
                await a.txs.submit(net.transfer(alice, bob.public, COIN, nonce=0))
            assert all(not h.misbehaving for h in (a.host, b.host, c.host))
    run(main)
    assert [len(db.mempool()) for db in dbs] == [2, 2, 2]


def test_invalid_txs_score_their_origin_and_are_not_relayed():
    net = make_net()
    b_db, c_db = new_db(net), new_db(net)
    alice, bob = net.users
    good = net.transfer(alice, bob.public, COIN)
    forged = replace(good, amount=5 * COIN)  # signature no longer matches
    stale = net.transfer(bob, alice.public, COIN, nonce=7)  # a nonce gap: maybe a race

    async def main():
        async with open_host(ident(9), gossip_topics=[TXS_TOPIC]) as evil, \
                chain_node(2, b_db, clock) as b, chain_node(3, c_db, clock) as c:
            await evil.connect(b.host.addrs[0])
            await c.host.connect(b.host.addrs[0])
            await meshed(TXS_TOPIC, (evil, b.host), (b.host, evil), (b.host, c.host),
                         (c.host, b.host))
            for data in (b"not a tx", encode(forged), encode(stale)):
                await evil.publish(TXS_TOPIC, data)
            await eventually(lambda: b.txs.rejected == 3, "B to refuse all three")
            assert b.host.misbehaving == {evil.peer_id: 2}  # the stale one is not scored
            # Then a valid one from the same origin: relayed, so C is reachable.
            await evil.publish(TXS_TOPIC, encode(good))
            await eventually(lambda: queued(c_db, good), "the valid tx to reach C")
            assert c.txs.rejected == 0 and evil.peer_id not in c.host.misbehaving
    run(main)
    assert [tx_hash(t) for t in b_db.mempool()] == [tx_hash(good)]
