"""The rules of a spot check's comparison, and its record (specs/network.md 9.5).

Owns `agree` (two answers for the same positions agree, row by row, within
the codec's `TOLERANCE`), `Mismatch` (a disagreement as a generation
reports it) and `load_evidence` (a `node.wire.SpotEvidence` file read back).

Tolerance. Rows are compared one position at a time: max |a - b| over the
row at most ``TOLERANCE[codec]`` times the row's largest |value|. Measured
on SmolLM2 (CPU, 1 and 2 threads: bit-identical across thread counts), a
one-call prefill of up to 137 positions against token-by-token decoding
differs by at most 1.9e-5 (raw), 9.4e-4 (fp16), 6.7e-3 (bf16), 9.1e-3
(int8) in that measure at layers 10, 20, 30; the bounds are 1e-3, 1e-2,
5e-2, 1e-1 (7-50x margin).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ledger.codec import decode
from node.wire import SpotEvidence

#: Per wire codec: the most a row may differ, relative to the row's largest |value|.
TOLERANCE = {"raw": 1e-3, "fp16": 1e-2, "bf16": 5e-2, "int8": 1e-1}
#: Below this, a difference is nothing (rows of zeros).
_ATOL = 1e-6


def agree(a: torch.Tensor, b: torch.Tensor, codec: str = "raw") -> bool:
    """Whether two answers for the same positions agree (module docstring: Tolerance).

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


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One settled (or unsettled) disagreement, as the generation reports it.

    pos: the step's position; start, end: the hop's layers; peer_id: the
    hop's server; checker, third: the other servers asked ("" if none);
    loser: the peer the majority rejected ("" if unsettled); evidence: the
    file the evidence went to ("" if none); verified: whether every answer
    of the evidence verifies (signature and claimed input).
    """

    pos: int
    start: int
    end: int
    peer_id: str
    checker: str
    third: str
    loser: str
    evidence: str
    verified: bool

    def as_json(self) -> dict:
        return {"pos": self.pos, "layers": [self.start, self.end], "peer_id": self.peer_id,
                "checker": self.checker, "third": self.third, "loser": self.loser or None,
                "evidence": self.evidence or None, "verified": self.verified}


def load_evidence(path: str | Path) -> SpotEvidence:
    """The evidence record in ``path`` (written by a `SpotChecker`).

    Raises:
        DecodeError: the file is not an encoded `SpotEvidence`.
        OSError: it cannot be read.
    """
    return decode(Path(path).read_bytes(), SpotEvidence)
