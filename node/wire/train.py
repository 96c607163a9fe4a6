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

TRAIN_PROTOCOL = "/pnode/train/1.0.0"
#: One frame: a section's weight gradients of a small job fit with room.
MAX_TRAIN_FRAME = 512 * 1024 * 1024

#: ``StepTensors.what``: the states entering the stage whose first section is
#: ``section`` (named "h"), dL/d(states leaving that stage) (named "g"), the
#: weight gradients of ``section``'s backward unit, and the client part's
#: gradients from the head (loss) and from the embedding (``section`` is
#: `CLIENT` for those two). For a layer split into pieces (node/mine/step_plan.py):
#: a piece's attention and MLP partials ("h"), and its shares of dL/dh_mid
#: (MLP half) and of dL/dh (attention half) ("g") with its half's weight
#: gradients (full-shaped, by parameter name).
(ACTIVATION, GRADIENT, SECTION_GRADS, HEAD_GRADS, EMBED_GRADS,
 ATTN_PARTIAL, MLP_PARTIAL, MLP_SHARE, ATTN_SHARE) = range(9)
WHATS = ("activation", "gradient", "section grads", "head grads", "embedding grads",
         "attention partial", "MLP partial", "MLP share", "attention share")
CLIENT = 0xFFFF_FFFF


@wire(69, 2)
@dataclass(frozen=True, slots=True)
class StepTensors:
    """Tensors of one step and replica of a job, pushed to the nodes that need them."""

    job_id: Hash32
    step: U64
    replica: U32
    what: U8
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
