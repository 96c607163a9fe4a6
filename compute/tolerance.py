"""When two hidden states for the same positions agree: the spot checks' comparison rule.

Owns `TOLERANCE` and `agree` (specs/network.md 9.5, "Comparison rule"):
what a client's spot check (`wallet.client.spotrules`, which re-exports
them) and a node voting on a spot case on chain (`node.pol.spotvoter`)
both apply, so that a verifier judges evidence by the rule that made it.

Rows are compared one position at a time: max |a - b| over the row at most
``TOLERANCE[codec]`` times the row's largest |value|. Measured on SmolLM2
(CPU, 1 and 2 threads: bit-identical across thread counts), a one-call
prefill of up to 137 positions against token-by-token decoding differs by
at most 1.9e-5 (raw), 9.4e-4 (fp16), 6.7e-3 (bf16), 9.1e-3 (int8) in that
measure at layers 10, 20, 30; the bounds are 1e-3, 1e-2, 5e-2, 1e-1 (7-50x
margin).
"""

from __future__ import annotations

import torch

from compute.codecs import CODECS

#: Per wire codec: the most a row may differ, relative to the row's largest |value|.
TOLERANCE = {"raw": 1e-3, "fp16": 1e-2, "bf16": 5e-2, "int8": 1e-1}
#: Below this, a difference is nothing (rows of zeros).
_ATOL = 1e-6


def agree(a: torch.Tensor, b: torch.Tensor, codec: str = "raw") -> bool:
    """Whether two answers for the same positions agree (module docstring).

    Args:
        a, b: hidden states (1, T, C) for the same positions.
        codec: the wire codec both came through.

    Returns:
        True when shapes match and every row is within the codec's tolerance
        (a NaN anywhere disagrees).
    """
    if a.shape != b.shape:
        return False
    a, b = a.float(), b.float()
    diff = (a - b).abs().amax(dim=-1)
    scale = torch.maximum(a.abs().amax(dim=-1), b.abs().amax(dim=-1))
    return bool((diff <= TOLERANCE[codec] * scale + _ATOL).all())


def wire_codec(data: bytes) -> str:
    """The codec named in a wire tensor's header (`compute.wiretensor`: magic, version, codec).

    Raises:
        ValueError: too short to hold one, or an unknown codec id.
    """
    if len(data) < 6 or data[5] >= len(CODECS):
        raise ValueError("not a wire tensor header")
    return CODECS[data[5]]
