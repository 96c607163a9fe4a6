"""Mining: the miner loop, step plans, job records, replica averaging, the devnet's chain.

Sub-modules: `miner` (`Miner`: runs the units the chain assigns this node,
signs receipts), `step_plan` (what each unit of a step reads, computes and
pushes), `jobs` (a job's on-chain record and unit list), `averaging`
(`Averager`, `/pnode/averaging`), `devnet` (the keys, genesis and job of a
local devnet). Never imports the serving side.
"""

from node.mine.miner import Miner
from node.mine.jobs import config_from_json, config_json
from node.mine.averaging import Averager
from node.mine.devnet import DEVNET_PARAMS, devnet_genesis, devnet_job, DevnetKeys

__all__ = [
    "Averager", "DEVNET_PARAMS", "DevnetKeys", "Miner", "config_from_json", "config_json",
    "devnet_genesis", "devnet_job",
]
