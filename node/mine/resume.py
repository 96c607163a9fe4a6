"""Mining: resuming a job from kept states when no holder is ahead of this node.

Owns `Resumer`. A miner more than one update behind the open step first asks
another holder for its state (`node.mine.state_sync`). When none answers (a
node that mines alone and restarted; every holder of a section restarted),
the job would wait for a holder for ever, while the chain jails its
assignees and at last gives the job up. But the weights at any step are a
public function of the job and its batches (specs/pol.md 10.3), and each
miner keeps, every ``state_every`` steps, the full state of every part it
holds (weights and AdamW moments, `node.pol.PolArchive.keep_state`, in its
data dir's ``D/pol/``). So the node resumes: it takes the state of every
part at the newest such step s (its own archive first, then its peers', as
`proof_of_learning.joinaudit` does), replays the closed steps s .. t-1 with
the miners' own code (`proof_of_learning.replay.Replayer`) and takes the
state the replay ends with as its own at the open step t.

The chain's receipts say whether that state is the job's: the replay
compares every unit it runs with its receipt on chain, bit for bit, and the
resume is taken only when every one matched (a window that "passes" and is
settled). So a node resumes only to weights the chain's work committed to:
never to weights of its own making (a different build, a GPU whose
roundings differ from the replay's CPU, a damaged archive); then it says
why, and waits for a holder as before. Step 0 needs no kept state: the
job's committed initial model is its state there.

Costs: a scratch copy of the job's model (the replay's, dropped after) and
the time of at most ``RESUME_WINDOWS`` x ``state_every`` training steps on one
node, in which the node's own units of the open step may time out.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from compute.data import JobConfig
from node import torch_thread
from node.chain import ChainService, step_receipts
from node.mine.parts import KeptStates
from proof_of_learning.joinaudit import replay_window
from proof_of_learning.kinds import CLIENT
from proof_of_learning.phases import Tensors
from proof_of_learning.replay import Replayer

log = logging.getLogger(__name__)

__all__ = ["RESUME_WINDOWS", "Resumed", "Resumer"]

#: Most windows of ``state_every`` steps a resume replays: from the newest kept state a
#: node's own archive holds (a crash between an update and its state's keeping leaves
#: the one before), or from step 0 when the open step is that early.
RESUME_WINDOWS = 2


class Resumed:
    """A state every part of which the replay reached: ``states`` by part, at ``step``,
    replayed from the state kept at ``start``."""

    __slots__ = ("start", "step", "states")

    def __init__(self, start: int, step: int, states: dict[int, Tensors]):
        self.start, self.step, self.states = start, step, states


class Resumer:
    """Finds the state of a job's parts at its open step by replay (module docstring).

    Args:
        service: the node's chain service (the receipts the replay checks).
        config: the job.
        kept_states: ``kept_states(job_id, peers)``, where the states come
            from (`node.mine.parts.KeptStates`: this node's archive first,
            then each peer's).
    """

    def __init__(self, service: ChainService, config: JobConfig, kept_states: KeptStates):
        self.service, self.config, self.kept_states = service, config, kept_states

    def starts(self, step: int) -> list[int]:
        """The steps a resume to ``step`` may start from, newest first: the checkpoints
        (multiples of ``state_every``) of the last `RESUME_WINDOWS` windows, and step 0."""
        every = self.config.state_every
        newest = step // every * every
        return [s for s in range(newest, -1, -every) if step - s < RESUME_WINDOWS * every]

    async def resume(self, job_id: bytes, units: Sequence, step: int,
                     peers: Sequence[str]) -> Resumed | str:
        """The state of every part at ``step`` (the open step), replayed from kept states.

        Args:
            job_id, units: the job (its units as the chain lists them).
            step: the step to resume at: every step before it is closed.
            peers: the registered nodes' peer ids (the other sources of states).

        Returns:
            The states (`Resumed`), or why there are none, in words.
        """
        source = self.kept_states(job_id, peers)
        why = f"no node keeps the state of every part at a step from which to replay to {step}"
        replayer: Replayer | None = None
        for start in self.starts(step):
            # Only a checkpoint this node kept itself is tried: a peer that holds one
            # would have been ahead of it, and answered the catching up first.
            if start and not await source(start, CLIENT, 0):
                continue
            receipts = await self.service.call(step_receipts, self.service.chain, job_id,
                                               units, range(start, step))
            if replayer is None:
                replayer = await torch_thread.run_sync(Replayer, self.config)
            report = await replay_window(replayer, job_id, units, start, step - start,
                                         receipts, source, torch_thread.run_sync)
            if report.start == "unavailable":
                why = report.detail
                continue
            if report.status != "pass" or not report.settled:
                first = report.differing[0] if report.differing else None
                where = (f": unit {first.index} of step {first.step} differs from its "
                         f"receipt ({first.status})") if first else f": {report.detail}"
                return f"the replay from step {start} is not the chain's training{where}"
            states = await torch_thread.run_sync(
                lambda: {part: replayer.part_state(part) for part in replayer.parts})
            return Resumed(start, step, states)
        return why
