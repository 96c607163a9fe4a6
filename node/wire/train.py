"""The training protocols' messages: `/pnode/train/1.0.0` and `/pnode/train-state/1.0.0`.

Owns `StepTensors`, the one message nodes push to each other while they run a
job's step (specs/consensus.md section 5.3): the activations entering a
section, the gradient leaving one, and the weight gradients every holder of a
section applies. A push is one frame on a fresh stream, which the receiver
closes; there is no reply. Also `StateRequest` and `StateReply`, a late
miner's ask for a holder's weights and AdamW state (section 5.5).
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger.codec import U8, U32, U64, Hash32, wire
from node.wire.averaging import Named
from proof_of_learning.kinds import (  # noqa: F401  (the field's values, re-exported)
    ACTIVATION, ATTN_PARTIAL, ATTN_SHARE, CLIENT, EMBED_GRADS, GRADIENT, HEAD_GRADS,
    MLP_PARTIAL, MLP_SHARE, SECTION_GRADS, WHATS,
)

TRAIN_PROTOCOL = "/pnode/train/1.0.0"
#: One frame: a section's weight gradients of a small job fit with room.
MAX_TRAIN_FRAME = 512 * 1024 * 1024



@wire(69, 2)
@dataclass(frozen=True, slots=True)
class StepTensors:
    """Tensors of one step and replica of a job, pushed to the nodes that need them."""

    job_id: Hash32
    step: U64
    replica: U32
    what: U8  # one of proof_of_learning.kinds
    section: U32
    tensors: Named


#: Request/response: a node that missed updates (it joined late, or was down)
#: asks a holder for a section's weights and optimizer state.
STATE_PROTOCOL = "/pnode/train-state/1.0.0"


@wire(70)
@dataclass(frozen=True, slots=True)
class StateRequest:
    """Asks for the weights and AdamW state of ``section`` (`CLIENT`: the client part)."""

    job_id: Hash32
    section: U32


@wire(71)
@dataclass(frozen=True, slots=True)
class StateReply:
    """The holder's updates applied, and its tensors (none when it does not hold the section).

    Names: each parameter's name, and ``name#exp_avg``, ``name#exp_avg_sq``,
    ``name#step`` for its AdamW state once it has taken a step.
    """

    version: U64
    tensors: Named
