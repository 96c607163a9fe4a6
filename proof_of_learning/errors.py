"""Every error the proof_of_learning package raises.

One root, `PolError`, so a node can catch the package as a whole and turn
any of it into a one-line message (a malformed certificate or evidence from
a peer must never crash a node, specs/pol.md section 9).
"""

from __future__ import annotations


class PolError(Exception):
    """Root of every error raised by the proof_of_learning package."""


class MalformedCertificate(PolError):
    """Bytes or an object that are not a well-formed `UnitCert` (specs/pol.md section 3.4)."""


class MalformedEvidence(PolError):
    """Bytes or an object that are not well-formed `Evidence` (specs/pol.md section 4.3)."""


class NoSuchPush(PolError):
    """A push (kind, section) that no unit of this job sends (`StepPlan.expected`)."""
