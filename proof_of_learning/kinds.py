"""What a step's pushed tensors are: the values of `StepTensors.what`, and the client's section.

One definition for the wire (`node.wire.train.StepTensors`) and the unit of
work (`proof_of_learning.phases`, `proof_of_learning.step_plan`), with no
torch, so the wire package may read it.
"""

from __future__ import annotations

__all__ = ["ACTIVATION", "ATTN_PARTIAL", "ATTN_SHARE", "CLIENT", "EMBED_GRADS", "GRADIENT",
           "HEAD_GRADS", "MLP_PARTIAL", "MLP_SHARE", "SECTION_GRADS", "WHATS"]

#: ``StepTensors.what``: the states entering the stage whose first section is
#: ``section`` (named "h"), dL/d(states leaving that stage) (named "g"), the
#: weight gradients of ``section``'s backward unit, and the client part's
#: gradients from the head (loss) and from the embedding (``section`` is
#: `CLIENT` for those two). For a layer split into pieces (`proof_of_learning.step_plan`):
#: a piece's attention and MLP partials ("h"), and its shares of dL/dh_mid
#: (MLP half) and of dL/dh (attention half) ("g") with its half's weight
#: gradients (full-shaped, by parameter name).
(ACTIVATION, GRADIENT, SECTION_GRADS, HEAD_GRADS, EMBED_GRADS,
 ATTN_PARTIAL, MLP_PARTIAL, MLP_SHARE, ATTN_SHARE) = range(9)
WHATS = ("activation", "gradient", "section grads", "head grads", "embedding grads",
         "attention partial", "MLP partial", "MLP share", "attention share")
CLIENT = 0xFFFF_FFFF
