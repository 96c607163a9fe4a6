"""The vocabulary of a step's phases: message keys, `Phase`, `PhaseResult`, certificate names.

Owns what `proof_of_learning.step_plan` (which plans and runs the phases) and its
readers (the transfer of pushed tensors, the miner, the verifier in
`node.pol`) share: a pushed message's `Key`, one `Phase` of a unit, the
`PhaseResult` a phase returns (its pushes and every digest its unit's
receipt and certificate commit, specs/pol.md 3), and how a piece's
partials and shares are named in a certificate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ledger.crypto import ZERO32
from proof_of_learning.units import tensor_digest
from proof_of_learning.kinds import ACTIVATION, ATTN_PARTIAL, ATTN_SHARE, MLP_PARTIAL, MLP_SHARE, WHATS

Key = tuple[int, int, int, int]  # (step, replica, what, section): one pushed message
StepReplica = tuple[int, int]  # (step, replica): the key prefix of a phase's messages
Tensors = dict[str, torch.Tensor]
#: A push: (to the holders of these sections, or CLIENT: every miner), its key, its tensors.
Push = tuple[tuple[int, ...] | int, Key, Tensors]

#: The half of a layer a piece's partial or share belongs to.
HALF_OF = {ATTN_PARTIAL: "attention", MLP_PARTIAL: "mlp", MLP_SHARE: "mlp", ATTN_SHARE: "attention"}

@dataclass(frozen=True, slots=True)
class Phase:
    """One step of running a unit: the unit, its section and direction, and which part."""

    index: int  # into the job's units
    replica: int
    section: int
    forward: bool
    kind: str  # "whole", "attention", "mlp" or "publish"
    order: tuple[int, ...]  # a node runs its phases of a step in this order
    last: bool  # the unit's last phase: its receipt follows


@dataclass(slots=True)
class PhaseResult:
    """What a phase sends, what its unit's receipt and certificate commit, its loss if any.

    Every digest is taken as the phase runs, of the tensors as it read or
    produced them: the step's update, later, cannot change what it commits.
    """

    pushes: list[Push] = field(default_factory=list)
    # Digest of each parameter the phase read, by name (`read_weights`).
    weights: dict[str, bytes] = field(default_factory=dict)
    inp: torch.Tensor | None = None  # h (forward) or g (backward): the receipt's input_hash
    out: Tensors = field(default_factory=dict)  # what the receipt's output_hash names
    # Certificate inputs and outputs by name (specs/pol.md 3.2), each a `tensor_digest`.
    inputs: dict[str, bytes] = field(default_factory=dict)
    outputs: dict[str, bytes] = field(default_factory=dict)
    # Each weight gradient produced, by parameter: its digest and its sum of squares (float64).
    grads: dict[str, bytes] = field(default_factory=dict)
    squares: dict[str, float] = field(default_factory=dict)
    data: bytes = ZERO32  # tensors_digest of {"ids", "targets"} when the phase read tokens
    loss: float | None = None
    # A CPU copy of every tensor digested above, by digest: what the worker
    # keeps for its verifier (node.pol.archive).
    kept: dict[bytes, torch.Tensor] = field(default_factory=dict)

    def keep(self, t: torch.Tensor) -> bytes:
        """The `tensor_digest` of a CPU copy of ``t``, kept (a parameter may change later)."""
        c = t.detach().to("cpu", copy=True)
        digest = tensor_digest(c)
        self.kept[digest] = c
        return digest

    def produced(self, grads: Tensors) -> None:
        """Commit weight gradients the phase produced."""
        for name, g in grads.items():
            self.grads[name] = self.keep(g)
            self.squares[name] = float(g.detach().double().square().sum())


def input_name(what: int, section: int) -> str:
    """The certificate name of a piece's partial or share: ``W/s`` (specs/pol.md 3.2)."""
    return f"{WHATS[what]}/{section}"


def message_tensor(what: int) -> str:
    """Which tensor of a pushed message a unit reads: "h" (states, partials) or "g"."""
    return "h" if what in (ACTIVATION, ATTN_PARTIAL, MLP_PARTIAL) else "g"
