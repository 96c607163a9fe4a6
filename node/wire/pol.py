"""The Proof-of-Learning fetch protocol's messages: `/pnode/pol/1.0.0` (specs/pol.md 8).

Owns `PolRequest` and `PolReply`: a verifier asks a worker (or anyone) for
a certificate or evidence by its hash, one tensor by its digest, or a named
set of tensors (the weights a unit read, the gradients it produced) by the
`tensors_digest` its certificate commits. The asker checks every reply
against the hash it asked for; the reply carries no claim of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from ledger.codec import U8, Hash32, MaxLen, wire
from node.wire.averaging import Named

POL_PROTOCOL = "/pnode/pol/1.0.0"
#: One reply: the weights a unit of a small job read fit with room.
MAX_POL_FRAME = 64 * 1024 * 1024
MAX_POL_REQUEST = 256

#: ``PolRequest.kind``: a `UnitCert` by `cert_hash`, an `Evidence` by
#: `evidence_hash`, one tensor by `tensor_digest`, a named set by `tensors_digest`.
CERT, EVIDENCE, TENSOR, NAMED = range(4)
POL_KINDS = ("certificate", "evidence", "tensor", "named tensors")


@wire(78)
@dataclass(frozen=True, slots=True)
class PolRequest:
    """Asks for one object of ``kind`` by ``key`` (its hash or digest), of job ``job_id``."""

    kind: U8
    job_id: Hash32
    key: Hash32


@wire(79)
@dataclass(frozen=True, slots=True)
class PolReply:
    """``found`` 1 with the object (``data`` for a certificate or evidence's encoding,
    ``tensors`` for a tensor (one, named "t") or a named set), or 0 with neither."""

    found: U8
    data: Annotated[bytes, MaxLen(1 << 20)]
    tensors: Named
