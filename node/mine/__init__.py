"""Mining: the miner loop, step plans, job records, replica averaging, the devnet's chain.

Sub-modules: `miner` (`Miner`: runs the units the chain assigns this node,
signs receipts), `phases` (a step's message keys, `Phase`, `PhaseResult`),
`transfer` (the step tensors' inbox, pushes and checks of what others
push), `state_sync` (catching up from a holder's state, and
serving it), `step_plan` (what each unit of a step reads, computes and
pushes), `jobs` (a job's on-chain record and unit list), `averaging`
(`Averager`, `/pnode/averaging`), `data` (`DataShelf`: job data files by
hash, `/pnode/data/1.0.0`), `devnet` (the keys, genesis and job of a
local devnet). Never imports the serving side.
"""

from node.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "node.mine.miner": ("Miner",),
    "node.mine.jobs": ("config_from_json", "config_json", "config_of", "job_plan", "job_to_mine", "job_tx",
                       "job_units", "matches", "named_digest",
                       "tensor_digest", "tensors_digest"),
    "node.mine.step_plan": ("StepPlan",),
    "node.mine.phases": ("HALF_OF", "Key", "Phase", "PhaseResult", "Push", "Tensors",
                         "input_name", "message_tensor"),
    "node.mine.averaging": ("Averager",),
    "node.mine.data": ("DataShelf", "file_sha256"),
    "node.mine.devnet": ("BOND", "DEVNET_PARAMS", "DevnetKeys", "devnet_genesis", "devnet_job"),
})
