"""What a miner takes from Proof of Learning, as types: the parts it is handed, not imported.

The miner keeps its units for their verifiers, may check a holder's state
before it takes it, and (in the attack battery) runs a cheat; the node
builds these from `node.pol` (`PolArchive`, `StateCheck`, `WorkerAttack`)
and hands them in, so `node.mine.miner` imports no `node.pol` and the
layer test holds it so. Each `Protocol` names exactly what the miner calls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Protocol

import torch

from ledger.types import Receipt
from proof_of_learning.certificate import UnitCert
from proof_of_learning.joinaudit import StateSource
from proof_of_learning.phases import PhaseResult, Push
from proof_of_learning.step_plan import StepPlan

__all__ = ["KeptStates", "ServeState", "StateAccepts", "Tamper", "UnitArchive"]


class UnitArchive(Protocol):
    """Where a miner keeps what its verifiers will ask for (`node.pol.PolArchive`)."""

    def keep_unit(self, step: int, cert: UnitCert, results: Mapping[str, PhaseResult],
                  receipt: Receipt) -> None: ...

    def keep_version(self, version: int, weights: Mapping[str, torch.Tensor]) -> None: ...

    def keep_state(self, job_id: bytes, step: int, part: int,
                   state: Mapping[str, torch.Tensor]) -> None: ...

    def receipts(self) -> dict[bytes, int]: ...

    def mark_audited(self, receipt_hashes: set[bytes]) -> None: ...

    def forget(self, done: set[bytes], step_now: int) -> None: ...


class Tamper(Protocol):
    """A cheating worker, for the attack battery only (`node.pol.attacks.WorkerAttack`)."""

    def run_phase(self, plan: StepPlan) -> Callable[..., PhaseResult]: ...

    def certify(self, cert: UnitCert) -> UnitCert: ...

    def poison(self, plan: StepPlan, t: int, mine: Collection[int]) -> list[Push]: ...

    def steps_section(self, section: int) -> bool: ...


#: ``await accepts(job_id, section, step, state)``: whether a catching-up miner takes a
#: holder's state of a part (`node.pol.StateCheck`: it must give the step's receipts).
StateAccepts = Callable[[bytes, int, int, dict[str, torch.Tensor]], Awaitable[bool]]
#: ``serve_state(job_id, handler)``: registers a job's state server with the node's router.
ServeState = Callable[[bytes, Callable[[object, bytes], Awaitable[bytes]]], None]
#: ``kept_states(job_id, peers)``: where a resuming miner takes each part's full state at a
#: checkpoint step (`node.mine.resume`): this node's archive first, then each of ``peers``
#: (`node.pol.Verifier.state_source`).
KeptStates = Callable[[bytes, Sequence[str]], StateSource]
