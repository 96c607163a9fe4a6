"""The rules of a spot check's comparison, and its record (specs/network.md 9.5).

Owns `Mismatch` (a disagreement as a generation
reports it) and `load_evidence` (a `node.wire.SpotEvidence` file read back).

The comparison (`agree`: two answers for the same positions agree, row by
row, within the codec's `TOLERANCE`) is `compute.tolerance`'s, re-exported
here: a node voting on a spot case on chain applies the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from compute.tolerance import TOLERANCE, agree
from ledger.codec import decode
from node.wire import SpotEvidence

__all__ = ["TOLERANCE", "Mismatch", "agree", "load_evidence"]


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
