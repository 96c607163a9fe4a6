"""The chain state's records: what `ledger.state` keeps under each key prefix.

Frozen, slotted dataclasses registered with the codec, like every ledger
object (`ledger.types`): an account, a registered node, a job's progress,
a unit's assignment, a receipt awaiting its audit, the coin supply, a
jail term and the receipt log's size. They are stored, hashed into the
state root and proven, never sent as transactions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from ledger.codec import U8, U32, U64, Hash32, Key32, MaxLen, wire
from ledger.types import Job, PeerId

__all__ = ["Account", "AppealRecord", "Assignment", "Beacon", "Jail", "JobRecord", "LogState",
           "NodeRecord", "Pending", "SpotCase", "Supply"]



@wire(20)
@dataclass(frozen=True, slots=True)
class Account:
    balance: U64
    nonce: U64
    bond: U64
    last_served_height: U64


@wire(21)
@dataclass(frozen=True, slots=True)
class NodeRecord:
    account: Key32
    peer_id: PeerId
    layer_start: U32
    layer_end: U32
    registered_height: U64  # height at which this node key was first registered


@wire(22, 2)
@dataclass(frozen=True, slots=True)
class JobRecord:
    """A posted job: its open step, its place in the queue, and its deposit's unspent rest.

    Jobs train one at a time (`ledger.jobrules.next_job`): ``started`` once
    its first step was assigned; ``posted`` is the height it was posted at;
    ``escrow`` is the part of the deposit not yet paid out (refunded once
    the job is finished and its last receipt settled); ``moved`` the height
    at which it last opened a step.
    """

    job: Job
    step: U64  # the open step; == job.steps once the job is finished (or given up)
    posted: U64
    started: bool
    escrow: U64
    moved: U64  # the height it last started a step (`ledger.jobrules.give_up_stalled`)


@wire(23, 2)
@dataclass(frozen=True, slots=True)
class Assignment:
    """Who must execute one unit of an open step, and by when; once done, its hashes.

    ``input_hash`` / ``output_hash`` are the accepted receipt's (zeros until
    then): the receipts of neighbouring units must chain through them.
    """

    job_id: Hash32
    step: U64
    index: U32
    node_key: Key32
    deadline: U64
    done: bool
    input_hash: Hash32
    output_hash: Hash32


@wire(24, 5)
@dataclass(frozen=True, slots=True)
class Pending:
    """An accepted receipt whose reward waits for its window (and its audit, if drawn).

    layer_start, layer_end: the unit's layers (for the record: the draw no longer reads them);
    height: where the receipt was included (its draw comes at height + 2);
    verifier: the drawn verifier, zeros until then; first_verifier: while a
    pass is re-checked, the verifier that passed it (version 3), else zeros;
    status: `ledger.audit` DRAW_DUE, UNSAMPLED, SAMPLED, PASSED, FORCED,
    RECHECK_DUE or RECHECKING; job_id (version 4): whose deposit pays it (or
    nothing, for a minted job's); draw_at (version 5): the height whose
    prelude draws its audit, re-check or forced audit (two blocks after the
    event, seeded by the beacon of the block between: specs/pol.md 5).
    """

    job_id: Hash32
    account: Key32
    node_key: Key32
    layer_start: U32
    layer_end: U32
    height: U64
    final_height: U64
    verifier: Key32
    first_verifier: Key32
    status: U8
    draw_at: U64


@wire(25)
@dataclass(frozen=True, slots=True)
class Supply:
    """Coin accounting: balances + bonds == premine + minted - burned."""

    premine: U64
    minted: U64
    burned: U64


@wire(27)
@dataclass(frozen=True, slots=True)
class Jail:
    """A node that let a unit's deadline pass: last in line for units until ``until``.

    ``strikes`` counts deadlines missed since the node last had a receipt
    accepted after serving its time; each doubles the next term.
    """

    until: U64
    strikes: U32


@wire(26)
@dataclass(frozen=True, slots=True)
class LogState:
    """The receipt log's size and the peaks of its Merkle frontier."""

    size: U64
    peaks: Annotated[tuple[Hash32, ...], MaxLen(64)]


@wire(37)
@dataclass(frozen=True, slots=True)
class Beacon:
    """The latest block's beacon (`ledger.beacon`): the VRF output its producer could not choose."""

    value: Hash32


@wire(39)
@dataclass(frozen=True, slots=True)
class AppealRecord:
    """An appeal being judged: its verifiers and their votes (`ledger.audit.NO_VOTE` until
    each verdict), by position."""

    verifiers: Annotated[tuple[Key32, ...], MaxLen(3)]
    votes: Annotated[tuple[U8, ...], MaxLen(3)]



@wire(44)
@dataclass(frozen=True, slots=True)
class SpotCase:
    """A spot-check accusation (`SpotFraud`), keyed by its case id, kept once judged.

    accused: the node key bound to the accused answer's peer key; accused_account:
    its account when accused (whose bond a slash takes); accuser, deposit (0 once
    judged); layer_start, layer_end: the claim's layers (whom the draw may pick);
    draw_at: the height whose prelude draws its verifiers (two blocks on);
    final_height: the last height of its vote window (set by the draw);
    verifiers, votes: as an `AppealRecord`'s; status: `ledger.spotrules` CASE_DUE,
    CASE_OPEN, or how it was judged (UPHELD, REJECTED, UNDECIDED). A judged case
    stays, so the same answer is never judged twice.
    """

    accused: Key32
    accused_account: Key32
    accuser: Key32
    deposit: U64
    layer_start: U32
    layer_end: U32
    draw_at: U64
    final_height: U64
    verifiers: Annotated[tuple[Key32, ...], MaxLen(3)]
    votes: Annotated[tuple[U8, ...], MaxLen(3)]
    status: U8
