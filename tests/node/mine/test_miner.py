"""node.mine.miner: a job's units run by the nodes the chain assigns (real hosts, real chains).

Three nodes on 127.0.0.1, each a chain, a producer, transaction gossip and a
miner; the genesis carries a small job of two sections, node 0 holding
section 0, node 1 section 1 and node 2 both. Compared with compute's own
reference: training the same job locally, block by block.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import trio

from compute.data import batch
from compute.train import train_local
from compute.wiretensor import encode_tensor
from ledger.chaindb import ChainDB
from ledger.codec import encode
from ledger.crypto import SigningKey
from ledger.state import ACCOUNT, JOB
from ledger.store import MemoryStore
from ledger.types import Receipt, unit_id
from node.clock import now_ms
from node.mine.averaging import NamedTensor
from node.mine.devnet import BOND, DevnetKeys, devnet_genesis, devnet_job
from node.mine.jobs import step_workers
from node.mine.miner import Miner
from node.net.framing import write_frame
from node.wire.sync import BLOCKS_TOPIC
from node.wire.train import ACTIVATION, TRAIN_PROTOCOL, StepTensors
from tests.node.netkit import chain_node, eventually, ident, meshed, run


def cast(n: int) -> list[DevnetKeys]:
    keys = [DevnetKeys(SigningKey(bytes([50 + i]) * 32), SigningKey(bytes([i + 1]) * 32),
                       SigningKey(bytes([80 + i]) * 32)) for i in range(n)]
    for i, k in enumerate(keys):  # the peer key is the host's identity of the test
        assert k.peer_id == ident(i + 1).peer_id_bytes
    return keys


def job_step(db) -> int:
    [job_id] = db.state.ids(JOB)
    return db.state.get(JOB + job_id).step


def mine(config, spans=None, *, hostile: bool = False):
    """Three chain nodes with miners mine ``config`` to its end; returns (miners, dbs)."""
    keys = cast(3)
    # A long unit timeout: this test wants no reassignment (slow CI machines).
    genesis = devnet_genesis("pnode-mine", keys, config, now_ms(), spans=spans,
                             unit_timeout=400)
    dbs = [ChainDB.create(MemoryStore(), genesis) for _ in keys]
    miners: list[Miner] = []

    async def main():
        async with chain_node(1, dbs[0], now_ms, producer_key=keys[0].node, interval_ms=50) as a, \
                chain_node(2, dbs[1], now_ms, producer_key=keys[1].node, interval_ms=50) as b, \
                chain_node(3, dbs[2], now_ms, producer_key=keys[2].node, interval_ms=50) as c, \
                trio.open_nursery() as nursery:
            nodes = [a, b, c]
            await a.host.connect(b.host.addrs[0])
            await a.host.connect(c.host.addrs[0])
            await b.host.connect(c.host.addrs[0])
            await meshed(BLOCKS_TOPIC, (a.host, b.host), (b.host, c.host), (c.host, a.host))
            for node, k in zip(nodes, keys):
                miners.append(await nursery.start(Miner(node.service, node.txs, k.node, config,
                                                        average_every=2).run))
            if hostile:  # a registered peer's malformed push is refused and scored
                await eventually(lambda: miners[0].job_id is not None, "node 0 mining")
                bad = encode(StepTensors(miners[0].job_id, miners[0].version + 1, 0, ACTIVATION, 1,
                                         (NamedTensor("h", encode_tensor(torch.zeros(2, 2))),)))
                stream = await c.host.open_stream(a.host.peer_id, TRAIN_PROTOCOL)
                await write_frame(stream, bad)
                await eventually(lambda: a.host.misbehaving.get(c.host.peer_id, 0) >= 1,
                                 "the bad push scored")
            await eventually(lambda: all(job_step(db) == config.steps for db in dbs)
                             and all(m.version == config.steps for m in miners),
                             "the job's steps", 60)
            nursery.cancel_scope.cancel()
    run(main, 90)
    return keys, miners, dbs


def swarm_losses(miners) -> list[float]:
    """Each step's loss: the mean over its replicas (as `train_local` reports it)."""
    losses = {(step, r): loss for m in miners for step, r, loss in m.losses}
    steps = sorted({step for step, _ in losses})
    replicas = sorted({r for _, r in losses})
    return [sum(losses[(step, r)] for r in replicas) / len(replicas) for step in steps]


def test_three_nodes_train_a_job_exactly_as_local_block_by_block_training():
    config = devnet_job(4, 3, batch_size=4, seq_len=32)
    keys, miners, dbs = mine(config, hostile=True)  # mining goes on past a bad push
    local = train_local(config, decomposed=True)
    assert train_local(config).losses == local.losses  # whole layers: whole-model, bit for bit
    losses = swarm_losses(miners)
    assert [round(x, 5) for x in losses] == [round(x, 5) for x in local.losses]
    reference = dict(local.model.named_parameters())
    for m in miners:  # every held section and the client part equal the local model's
        for s in [*m.held, 0xFFFF_FFFF]:
            for name, value in m._weights(s).items():
                assert torch.allclose(value, reference[name], atol=1e-5), (m.held, name)
    assert [m.held for m in miners] == [[0], [1], [0, 1]]
    # Quality (the bar: validation loss within 5% of local training):
    # node 2 holds every section, so its model is the swarm's whole model.
    ids, targets = batch(config, 1_000_000, corpus=miners[2].corpus)  # not a training step
    with torch.no_grad():
        val = [F.cross_entropy(m(ids).flatten(0, 1), targets.flatten()).item()
               for m in (miners[2].model, local.model)]
    assert abs(val[0] - val[1]) <= 1e-4 * val[1] and val[1] < losses[0]
    on_chain = [tx.node_key for blk in dbs[0].iter_blocks() for tx in blk.txs
                if isinstance(tx, Receipt)]
    assert len(on_chain) == 4 * config.steps  # two sections: F0 F1 B1 B0 per step
    assert {k.node.public for k in keys} == set(on_chain)  # longest wait spreads the work
    # Whose pushes make each step's update: the workers its receipts name.
    job_id, peer = miners[0].job_id, {k.node.public: m.me for k, m in zip(keys, miners)}
    worker = {tx.unit_id: peer[tx.node_key] for blk in dbs[0].iter_blocks() for tx in blk.txs
              if isinstance(tx, Receipt)}
    units = dbs[0].state.get(JOB + job_id).job.units
    for t in range(config.steps):
        assert step_workers(dbs[1], job_id, t) == {
            i: worker[unit_id(job_id, t, u)] for i, u in enumerate(units)}
    assert step_workers(dbs[1], job_id, config.steps) == {}  # no such step
    for db in dbs:  # nobody lost its bond, and nobody was paid for what it did not do
        for k in keys:
            assert db.state.get(ACCOUNT + k.wallet.public).bond == BOND


def test_pieces_of_a_split_layer_train_exactly_as_local_block_by_block_training():
    """k=5 on the 4-layer model splits layer 0 into two pieces: heads 0-3 with MLP
    slices 0-2, and MLP slices 3-10 (units with two phases, one with one, and the
    publishers). Node 0 holds both pieces, node 1 layers 1-4, node 2 everything."""
    config = devnet_job(3, 3, batch_size=4, seq_len=32, k=5)
    keys, miners, dbs = mine(config, spans=[(0, 1), (1, 4), (0, 4)])
    assert [p.head_end for p in miners[0].sections.forward[:2]] == [7, 15]  # really pieces
    assert [m.held for m in miners] == [[0, 1], [2, 3, 4], [0, 1, 2, 3, 4]]
    local = train_local(config, decomposed=True)
    assert [round(x, 5) for x in swarm_losses(miners)] == [round(x, 5) for x in local.losses]
    reference = dict(local.model.named_parameters())
    for m in miners:  # every held slice of every replica equals the local model's
        for s in m.held:
            opt = m.sections.optimizers[s]
            for sl, p in zip(opt.slices, opt.params):
                assert torch.allclose(p, sl.of(reference[sl.name]), atol=1e-5), (s, sl)
    on_chain = [tx for blk in dbs[0].iter_blocks() for tx in blk.txs if isinstance(tx, Receipt)]
    assert len(on_chain) == 10 * config.steps  # five sections: forward and backward of each
    assert len({tx.node_key for tx in on_chain}) == 3


def test_data_parallel_replicas_train_exactly_as_local_training_on_all_shards():
    """Two replicas: every unit twice, each on its own shard of the step's batch;
    every holder averages both replicas' gradients before it steps."""
    config = devnet_job(3, 3, batch_size=4, seq_len=32, replicas=2)
    keys, miners, dbs = mine(config)
    local = train_local(config, decomposed=True)
    assert [round(x, 5) for x in swarm_losses(miners)] == [round(x, 5) for x in local.losses]
    reference = dict(local.model.named_parameters())
    for m in miners:
        assert {r for _, r, _ in m.losses} <= {0, 1}
        for s in [*m.held, 0xFFFF_FFFF]:
            for name, value in m._weights(s).items():
                assert torch.allclose(value, reference[name], atol=1e-5), (m.held, name)
    on_chain = [tx for blk in dbs[0].iter_blocks() for tx in blk.txs if isinstance(tx, Receipt)]
    assert len(on_chain) == 2 * 4 * config.steps  # F0 F1 B1 B0 of both replicas
    assert len({tx.unit_id for tx in on_chain}) == len(on_chain)
