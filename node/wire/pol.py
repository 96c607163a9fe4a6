"""The Proof-of-Learning fetch protocol's messages: `/pnode/pol/1.0.0` (specs/pol.md 8).

Owns `PolRequest` and `PolReply`: a verifier asks a worker (or anyone) for a
certificate or evidence by its hash, one tensor by its digest, a named set of
tensors (the weights a unit read, the gradients it produced) by the
`tensors_digest` its certificate commits, or a part's full state at a
checkpoint step (what a joining node replays the chain's training from). The
asker checks every reply against the hash it asked for; the reply carries no
claim of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from ledger.codec import U8, U32, U64, Hash32, MaxLen, wire
from node.wire.averaging import Named, NamedTensor

POL_PROTOCOL = "/pnode/pol/1.0.0"
#: One reply: the weights a unit of a small job read fit with room.
MAX_POL_FRAME = 512 * 1024 * 1024
MAX_POL_REQUEST = 256

#: ``PolRequest.kind``: a `UnitCert` by `cert_hash`, an `Evidence` by
#: `evidence_hash`, one tensor by `tensor_digest`, a named set by `tensors_digest`,
#: a held part's full state at a step by `node.pol.archive.state_key`.
CERT, EVIDENCE, TENSOR, NAMED, STATE = range(5)
POL_KINDS = ("certificate", "evidence", "tensor", "named tensors", "state")


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


@wire(81)
@dataclass(frozen=True, slots=True)
class NamedSet:
    """A named set of a `PolWindow`: its `tensors_digest` and each name's tensor digest."""

    key: Hash32
    names: Annotated[tuple[Annotated[str, MaxLen(128)], ...], MaxLen(4096)]
    digests: Annotated[tuple[Hash32, ...], MaxLen(4096)]


#: A window file's limits: the units of up to a few hundred steps of a small job.
MAX_WINDOW_ITEMS = 1 << 16
#: A window's `Job` transaction: a spec of 16 KiB and 4096 units fit with room.
MAX_WINDOW_JOB = 1 << 18


@wire(80, version=2)
@dataclass(frozen=True, slots=True)
class PolWindow:
    """K steps of a worker's archive, for re-execution offline (`pnode pol export`,
    `pnode verify cert`; specs/pol.md 10).

    Every field is committed by the job or the receipts, so that `pnode
    verify cert` can refuse any edit: ``job``: the encoded, signed `Job`
    transaction (its hash is ``job_id``; its ``spec`` the config the units
    ran); ``first_step``/``steps``: the span of the units' steps;
    ``receipts``: each unit's encoded `Receipt` in (step, unit) order;
    ``receipts_root``: the Merkle root (specs/ledger.md 3) over their
    hashes; ``objects``: their certificates' encodings, one per receipt in
    its order; ``named``: the named sets their certificates commit;
    ``tensors``: every tensor a certificate or named set commits, by its
    digest (hex as the name). Version 2: version 1's ``config`` (unsigned)
    and ``start_state``/``end_state`` (the exporter's word, committed by
    nothing) gave way to ``job``.
    """

    job: Annotated[bytes, MaxLen(MAX_WINDOW_JOB)]
    job_id: Hash32
    first_step: U64
    steps: U32
    receipts_root: Hash32
    receipts: Annotated[tuple[Annotated[bytes, MaxLen(4096)], ...], MaxLen(MAX_WINDOW_ITEMS)]
    objects: Annotated[tuple[Annotated[bytes, MaxLen(1 << 20)], ...], MaxLen(MAX_WINDOW_ITEMS)]
    named: Annotated[tuple[NamedSet, ...], MaxLen(MAX_WINDOW_ITEMS)]
    tensors: Annotated[tuple[NamedTensor, ...], MaxLen(MAX_WINDOW_ITEMS)]
