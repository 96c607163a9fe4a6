"""Mining: the miner loop, step plans, job records, replica averaging, the devnet's chain.

Sub-modules: `runner` (`JobRunner`: the chain's jobs in turn, each with a
`Miner` and a `node.pol.Verifier`), `miner` (`Miner`: runs the units the
chain assigns this node, signs receipts), `transfer` (the step tensors' inbox, pushes and checks of
what others push), `state_sync` (catching up from a holder's state, and
serving it), `resume` (`Resumer`: catching up by a replay from kept states
when no holder is ahead), `export` (a job's whole model, for `pnode job
export`), `jobs` (what a miner reads of the chain: the job to mine, its
view of it, the workers of a closed step), `averaging`
(`Averager`, `/pnode/averaging`), `data` (`DataShelf`: job data files by
hash, `/pnode/data/1.0.0`), `devnet` (the keys, genesis and job of a
local devnet). Never imports the serving side. The unit of work itself (a
step's plan, its phases, a job's units and commitments) is pure code in
`proof_of_learning`.
"""

from node.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "node.mine.miner": ("Miner",),
    "node.mine.runner": ("JobRunner",),
    "node.mine.jobs": ("MinerView", "check_job", "job_to_mine", "miner_view", "step_workers",
                       "unauditable"),
    "node.mine.averaging": ("Averager",),
    "node.mine.resume": ("Resumer",),
    "node.mine.data": ("DataShelf", "file_sha256"),
    "node.mine.devnet": ("BOND", "DEVNET_PARAMS", "DevnetKeys", "devnet_genesis", "devnet_job"),
})
