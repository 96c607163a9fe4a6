"""node.mine.jobs: what a miner reads of the chain, on real chains (a reorg included)."""

from __future__ import annotations

from compute.data import JobConfig
from ledger.chaindb import EXTENDED, REORG
from node.chain import job_named
from node.mine.jobs import miner_view
from proof_of_learning.units import hyper_hash, job_tx
from tests.ledger.chainkit import CHAIN, copy_chain, make_net, new_db, next_block


def test_a_reorg_that_drops_a_jobs_block_empties_the_miners_view():
    """Issue 28, item 9: a node synced a heavier branch without the block that posted its
    job, read the emptied view as "finished" and crashed on the missing job id. The view
    names no job then (`Miner._mine` stops, and its runner looks again)."""
    net = make_net(n_nodes=3)
    main = new_db(net)
    fork = copy_chain(net, main)
    config = JobConfig(steps=2)
    posted = next_block(main, net, [job_tx(config, CHAIN, net.authority, 0)], rank=1)
    assert main.add_block(posted.block, now_ms=None).status == EXTENDED
    me = net.nodes[0].public
    mining = job_named(main.state, hyper_hash(config), None)
    assert mining is not None and miner_view(main, mining, me).job_id == mining
    heavier = next_block(fork, net, rank=0)  # the same height, a better rank: it wins
    assert fork.add_block(heavier.block, now_ms=None).status == EXTENDED
    assert main.add_block(heavier.block, now_ms=None).status == REORG
    view = miner_view(main, job_named(main.state, hyper_hash(config), None), me)
    assert view.job_id is None and view.job_id != mining
    assert (view.step, view.steps) == (0, 0)  # what the old code took for "finished"
