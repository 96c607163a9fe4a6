"""The averaging protocol's messages: `/pnode/averaging/1.0.0` (specs/consensus.md 3.1).

Owns `AverageOffer` and `AverageReply` (one exchange between two replicas of
a section, `node.mine.averaging`) and `NamedTensor`, the named wire tensor
that the training protocol's messages carry too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from ledger.codec import U32, U64, MaxLen, wire

AVERAGING_PROTOCOL = "/pnode/averaging/1.0.0"
MAX_AVERAGING_FRAME = 512 * 1024 * 1024  # one section's tensors (SmolLM2's client part: 113 MB)



@wire(68)
@dataclass(frozen=True, slots=True)
class NamedTensor:
    """One tensor of a section: its name and a wire tensor (compute/wiretensor.py)."""

    name: Annotated[str, MaxLen(128)]
    data: Annotated[bytes, MaxLen(MAX_AVERAGING_FRAME)]


Named = Annotated[tuple[NamedTensor, ...], MaxLen(4096)]


@wire(66)
@dataclass(frozen=True, slots=True)
class AverageOffer:
    """Opens a pair's exchange: the round, the opener's degree and tensors."""

    section: Annotated[str, MaxLen(64)]
    round: U64
    degree: U32
    tensors: Named


@wire(67)
@dataclass(frozen=True, slots=True)
class AverageReply:
    """The answer: the responder's degree and tensors for the same round."""

    degree: U32
    tensors: Named
