"""Replaying a job's training, step by step, on a scratch model (specs/pol.md 10.3).

Owns `Replayer`: a `Reexecutor` that runs whole steps as the swarm runs
them. Every phase of every unit goes in `Phase.order`, with the messages
passed in memory. Each unit's receipt hashes come from
`StepPlan.receipt_hashes`, the code the miners sign with. Then the step's
update: every section's and the client part's `SliceAdamW`, with the
replicas' gradients averaged, as `node.mine.miner` applies it. So an honest
swarm on the same build and the replay agree bit for bit, and a replay from
the job's committed initial model (or from the full state of every part at
a checkpoint step) recomputes every receipt the chain holds.

Runs on the torch thread; `proof_of_learning.joinaudit` drives it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from compute.data import batch
from ledger.types import unit_id
from proof_of_learning.phases import Phase, PhaseResult
from proof_of_learning.units import tensors_digest
from proof_of_learning.reexecute import Reexecutor
from proof_of_learning.kinds import CLIENT

__all__ = ["Hashes", "Replayer"]

#: A unit's (weights, input, output, certificate) hashes, as its `Receipt` carries them.
Hashes = tuple[bytes, bytes, bytes, bytes]
#: Told of each unit as its last phase ends: (index, unit id, certificate, phase results,
#: hashes). What a test's worker signs and archives.
OnUnit = Callable[[int, bytes, object, list[PhaseResult], Hashes], None]


class Replayer(Reexecutor):
    """The job's model, sections and plan, stepped as the swarm steps them (module docstring).

    Args:
        config: the job.
    """

    @property
    def parts(self) -> list[int]:
        """Every part a state is kept of: each section, then `CLIENT`."""
        return [*range(self.plan.k), CLIENT]

    def optimizer(self, part: int):
        return self.sections.client if part == CLIENT else self.sections.optimizers[part]

    def start(self, states: Mapping[int, Mapping[str, torch.Tensor]] | None = None) -> None:
        """Begin again: from the job's initial model, or from the full state of every part.

        Raises:
            KeyError: ``states`` lacks a part.
            compute.errors.OptimizerStateError: a state does not fit its part.
        """
        self._fresh()
        if states is not None:
            for part in self.parts:
                self.optimizer(part).load_state(states[part])

    def part_state(self, part: int) -> dict[str, torch.Tensor]:
        """A part's full state now, as a miner keeps it (`SliceAdamW.state_dict`)."""
        return self.optimizer(part).state_dict()

    def read_hash(self, index: int) -> bytes:
        """The `weights_hash` unit ``index`` would commit now (its read set's digest)."""
        weights: dict[str, torch.Tensor] = {}
        for phase in self.plan.phases(index):
            weights.update(self.plan.read_weights(phase))
        return tensors_digest(weights)

    def suspects(self, index: int) -> set[int]:
        """The parts whose state unit ``index``'s weights come from (any slice it reads)."""
        names = self.read_set(index)
        return {part for part in self.parts
                if any(s.name in names for s in self.optimizer(part).slices)}

    def step(self, job_id: bytes, t: int, units, *, run=None, on_unit: OnUnit | None = None
             ) -> dict[int, Hashes]:
        """Run every unit of step ``t``, then apply its update.

        Args:
            job_id, units: the job (its id, its `UnitTemplate`s as the chain lists them).
            t: the step (the model must hold the weights of step ``t``).
            run: what runs a phase (default `StepPlan.run`; a test's cheat).
            on_unit: told of each unit as it ends.

        Returns:
            Each unit's receipt hashes, by index.
        """
        run = run or self.plan.run
        R = self.config.replicas
        shards = [batch(self.config, t, r, R, corpus=self.corpus) for r in range(R)]
        phases: list[Phase] = sorted((p for i in range(len(units)) for p in self.plan.phases(i)),
                                     key=lambda p: p.order)
        inbox: dict = {}
        done: dict[int, list[PhaseResult]] = {}
        out: dict[int, Hashes] = {}
        for phase in phases:
            needs = self.plan.needs(t, phase)
            result = run(phase, t, {key: inbox[key] for key in needs}, *shards[phase.replica])
            for _, key, tensors in result.pushes:
                inbox.setdefault(key, tensors)  # the first push wins, as in `Transfer`
            done.setdefault(phase.index, []).append(result)
            if phase.last:
                i = phase.index
                uid = unit_id(job_id, t, units[i])
                cert = self.plan.certificate(job_id, t, uid, i, done[i])
                out[i] = self.plan.receipt_hashes(job_id, t, uid, i, done[i], cert)
                if on_unit is not None:
                    on_unit(i, uid, cert, done[i], out[i])
        self._update(t, inbox)
        return out

    def _update(self, t: int, inbox: dict) -> None:
        grads = self.plan.update_grads(
            [[inbox[key] for key in self.plan.update_needs(t, r, range(self.plan.k))]
             for r in range(self.config.replicas)])
        with torch.no_grad():
            for part in self.parts:
                self.optimizer(part).step(grads)
