"""Mining: a job's whole model as one node has it, for `pnode job export`.

Owns `export_weights`. The parts a miner holds are its own; every other
section's weights come from one of its holders at the same version
(`node.mine.state_sync.StateSync.fetch_parts`). An export is never passed
off as the job's result when it is not: once the chain has ended the job,
weights short of its last step (a node whose last updates never came, a
job the chain gave up) are refused, and the node's log says why
(`node.mine.miner.Miner`'s last line of the job).
"""

from __future__ import annotations

import copy

import torch
import trio

from compute.train import make_sections
from node import torch_thread
from node.errors import MinerError

__all__ = ["FINAL_UPDATE_WAIT_S", "export_weights"]

#: Most seconds a miner waits, once its job is finished, for the updates it has not applied
#: (a given-up job's never come).
FINAL_UPDATE_WAIT_S = 120.0


async def export_weights(miner) -> tuple[int, dict[str, torch.Tensor]]:
    """(updates applied, the whole model's weights at that version), on the CPU.

    Of a job the chain has finished, it waits (`FINAL_UPDATE_WAIT_S` at most)
    for the miner's last update, so the export has the final weights.

    Args:
        miner: a `node.mine.miner.Miner` of the job.

    Raises:
        MinerError: not set up for the job yet; the job is over and the
            weights are not its last step's; or some section has no holder
            that sends its weights at this node's version.
    """
    if miner.job_id is None or miner.view is None:
        raise MinerError("this node has not set up for the job yet")
    with trio.move_on_after(FINAL_UPDATE_WAIT_S):  # a finished job: its last update first
        while miner.view.step >= miner.view.steps > miner.version and not miner.done:
            await trio.sleep(0.1)
    if miner.view.step >= miner.view.steps > miner.version:  # never the job's, unsaid
        raise MinerError(f"the job is over, but this node's weights are at step "
                         f"{miner.version} of {miner.view.steps}, not the job's last "
                         "(the node's log says why)")
    missing = [s for s in range(len(miner.sections.forward)) if s not in miner.held]
    for _ in range(3):  # an update between the fetch and the copy: once more
        version, view = miner.version, miner.view
        got = await miner.state_sync.fetch_parts(
            missing, job_id=miner.job_id, step=version, miners=view.miners,
            holders=view.holders) if missing else {}
        if got is None:
            raise MinerError(f"no holder of sections {', '.join(map(str, missing))} sent "
                             f"its weights at step {version}")
        weights = await torch_thread.run_sync(_whole_model, miner, got, version)
        if weights is not None:
            return version, weights
    raise MinerError("the weights kept changing under the export; try again")


def _whole_model(miner, got: dict[int, dict[str, torch.Tensor]], version: int):
    """The miner's model with ``got``'s sections put in (a copy; torch thread), or None
    when an update came in since ``version``."""
    if miner.version != version:
        return None
    model = copy.deepcopy(miner.model).to("cpu")
    sections = make_sections(model, miner.config)
    for s, tensors in got.items():
        sections.optimizers[s].load_weights({k: v for k, v in tensors.items() if "#" not in k})
    return {name: t.detach().clone() for name, t in model.state_dict().items()}
