"""Re-running one unit of a job from its committed weights and inputs (specs/pol.md 7.1, step 4).

Owns `Reexecutor`: a scratch copy of the job's model and its `StepPlan`,
apart from the miner's (whose weights train on). For each audit it loads
the weights the worker's certificate names, feeds the unit's phases the
inputs fetched by digest, and builds the verifier's own `UnitCert` with
the same code the worker used (`StepPlan.run`, `StepPlan.certificate`), so
an honest unit on the same build gives the same bytes. Runs on the torch
thread.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from compute.blocks import model_partition
from compute.data import JobConfig, batch, job_corpus, make_model
from compute.train import make_sections
from proof_of_learning.phases import Key, PhaseResult, Tensors, input_name, message_tensor
from proof_of_learning.step_plan import StepPlan
from proof_of_learning.units import job_units
from proof_of_learning.kinds import ACTIVATION, GRADIENT
from proof_of_learning.certificate import UnitCert

__all__ = ["Rerun", "Reexecutor", "WeightsMismatch"]


class WeightsMismatch(ValueError):
    """The named weights are not the unit's read set (a name missing or extra, a shape)."""


@dataclass(frozen=True, slots=True)
class Rerun:
    """The verifier's own run of a unit: its certificate and every tensor it digested."""

    cert: UnitCert
    kept: dict[bytes, torch.Tensor]  # by tensor_digest
    grads: dict[str, bytes]  # weight gradient digests by parameter
    loss: float | None


class Reexecutor:
    """The job's model and plan, for re-running units (module docstring).

    Args:
        config: the job (its model, partition and data).
    """

    def __init__(self, config: JobConfig):
        self.config = config
        self.corpus = job_corpus(config)
        self._fresh()

    def _fresh(self) -> None:
        """The job's initial model, its sections (optimizers never stepped) and plan."""
        c = self.config
        self.model = make_model(c)
        self.sections = make_sections(self.model, c)
        self.plan = StepPlan(self.model, self.sections, (c.batch_size, c.seq_len, c.model.dim),
                             c.replicas, c.threads)

    @property
    def units(self):
        """The job's units (`ledger.types.UnitTemplate`s), as its `Job` lists them."""
        part = model_partition(self.model, self.config.k, self.config.mlp_slices)
        return job_units(part, self.config.replicas)

    def read_set(self, index: int) -> set[str]:
        """The parameter names unit ``index`` reads (its `weights_hash` covers exactly these)."""
        return {n for phase in self.plan.phases(index) for n in self.plan.read_weights(phase)}

    def needed_inputs(self, t: int, index: int) -> dict[str, Key]:
        """The fetched inputs a re-run needs: certificate name -> message key (not stage 0's h)."""
        out: dict[str, Key] = {}
        for phase in self.plan.phases(index):
            for key in self.plan.needs(t, phase):
                what = key[2]
                name = "h" if what == ACTIVATION else "g" if what == GRADIENT else \
                    input_name(what, key[3])
                out[name] = key
        return out

    def rerun(self, job_id: bytes, step: int, unit: bytes, index: int, weights: Tensors,
              inputs: dict[str, torch.Tensor], digests: dict[str, bytes] | None = None
              ) -> Rerun:
        """Run unit ``index`` of ``step`` with ``weights`` loaded and ``inputs`` by name.

        Args:
            job_id, step, unit, index: the unit (as its certificate names it).
            weights: the read set by parameter name (fetched by `weights_hash`).
            inputs: each of `needed_inputs` by its certificate name.
            digests: the weights' `tensor_digest`s, when the caller has them (not
                taken again).

        Raises:
            WeightsMismatch: ``weights`` is not the unit's read set, or a shape differs.
            KeyError: an input of `needed_inputs` is missing.
        """
        self._load(index, weights)
        phases = self.plan.phases(index)
        messages = {key: {message_tensor(key[2]): inputs[name]}
                    for name, key in self.needed_inputs(step, index).items()}
        replica = phases[0].replica
        ids, targets = batch(self.config, step, replica, self.config.replicas, corpus=self.corpus)
        self.plan.weight_digests = digests
        try:
            results: list[PhaseResult] = [self.plan.run(p, step, messages, ids, targets)
                                          for p in phases]
        finally:
            self.plan.weight_digests = None
        cert = self.plan.certificate(job_id, step, unit, index, results)
        kept: dict[bytes, torch.Tensor] = {}
        grads: dict[str, bytes] = {}
        for r in results:
            kept.update(r.kept)
            grads.update(r.grads)
        loss = next((r.loss for r in results if r.loss is not None), None)
        return Rerun(cert, kept, grads, loss)

    def _load(self, index: int, weights: Tensors) -> None:
        names = self.read_set(index)
        if set(weights) != names:
            missing, extra = sorted(names - set(weights)), sorted(set(weights) - names)
            raise WeightsMismatch(f"weights missing {missing[:3]}, extra {extra[:3]}")
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, t in weights.items():
                p = params[name]
                if tuple(t.shape) != tuple(p.shape) or t.dtype != p.dtype:
                    raise WeightsMismatch(f"{name}: {tuple(t.shape)} {t.dtype}, expected "
                                          f"{tuple(p.shape)} {p.dtype}")
                p.copy_(t)
