"""Cheating workers and verifiers, for the attack battery only (issue 16; specs/pol.md 11).

Owns `WorkerAttack` and `verifier_tamper`: the ways a node can cheat, kept
apart from the honest path. Nothing here runs unless `pnode start
--attack KIND` (a hidden, test-only option that `pnode devnet --byzantine K
--attack KIND` passes to K nodes) asks for it. A cheating worker still signs
a well-formed certificate: it commits what it really pushed, so the lie is
in the work, where only re-execution finds it.

Worker attacks (the phase as run honestly, then changed before it is
committed and pushed):

- ``random-update``: every weight gradient replaced by noise of the same norm;
- ``scaled-gradients``: every weight gradient x0.01 (a smaller learning rate);
- ``sub-threshold``: a fixed +-pattern of `SUB_THRESHOLD` (9e-5) x max|g| added
  to every weight gradient, the same pattern every step: under the old
  tolerance (1e-4 of the max) every unit passed, and the weights drift
  steadily away from the honest run;
- ``stale-weights``: the node never steps its held sections (skips updates);
- ``wrong-data``: the units that read tokens read another batch (shifted);
- ``replay``: a unit's outputs are its outputs of the step before;
- ``perturbed-forward``: noise of 1e-3 of the max added to forward outputs;
- ``wrong-loss-grad``: the last forward's dL/dy halved;
- ``copied``: each receipt signs the certificate the node made before (of
  another unit) in place of its own; one copied from another worker names
  another unit just the same;
- ``poisoned-push``: at each step's start, noise of the right shapes pushed
  to every other miner under every key of the step that another node's
  unit produces, before that node can push it.

Verifier attacks: ``lazy-verifier`` passes everything without looking;
``malicious-verifier`` fails everything with made-up evidence.

Producer attack: ``withholding`` seals no block whose beacon would draw an
audit of its own account's receipts, or a re-check of its own passes
(specs/pol.md 5.1: the one bias a VRF beacon leaves). It combines with the
others by ``+``: ``random-update+withholding`` cheats and withholds,
``lazy-verifier+withholding`` passes unseen and keeps its passes from
re-checks where it can (the colluding verifier).
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from ledger.audit import DRAW_DUE, RECHECK_DUE, audit_seed, is_sampled
from ledger.state import KEY_BEACON, KEY_PARAMS, NODE, PENDING
from proof_of_learning.phases import Phase, PhaseResult, Push, input_name
from proof_of_learning.step_plan import StepPlan
from node.wire import ATTN_PARTIAL, CLIENT, MLP_PARTIAL
from proof_of_learning.certificate import (
    EXACT, OUTPUT_MISMATCH, PASS, Digest, Evidence, UnitCert,
)

__all__ = ["ATTACKS", "PRODUCER_ATTACKS", "VERIFIER_ATTACKS", "WORKER_ATTACKS", "WorkerAttack",
           "attack_hooks", "attack_parts", "verifier_tamper", "withhold"]

WORKER_ATTACKS = ("random-update", "scaled-gradients", "sub-threshold", "stale-weights",
                  "wrong-data", "replay", "perturbed-forward", "wrong-loss-grad", "copied",
                  "poisoned-push")
#: The sub-threshold cheat's size, as a fraction of the gradient's largest element.
SUB_THRESHOLD = 9e-5
VERIFIER_ATTACKS = ("lazy-verifier", "malicious-verifier")
PRODUCER_ATTACKS = ("withholding",)
ATTACKS = WORKER_ATTACKS + VERIFIER_ATTACKS + PRODUCER_ATTACKS


class WorkerAttack:
    """A cheating worker's phase runner and update rule (module docstring).

    Args:
        kind: one of `WORKER_ATTACKS`.
        seed: the noise's seed.
    """

    def __init__(self, kind: str, seed: int = 0):
        if kind not in WORKER_ATTACKS:
            raise ValueError(f"not a worker attack: {kind!r} (one of {', '.join(WORKER_ATTACKS)})")
        self.kind = kind
        self.gen = torch.Generator().manual_seed(seed)
        self._last: dict[tuple[int, str], dict[str, torch.Tensor]] = {}  # replay's memory
        self._last_cert: UnitCert | None = None  # copied's
        self._patterns: dict[str, torch.Tensor] = {}  # sub-threshold's, by parameter

    def certify(self, cert: UnitCert) -> UnitCert:
        """The certificate the node signs for a unit whose honest one is ``cert``."""
        if self.kind != "copied":
            return cert
        before, self._last_cert = self._last_cert, cert
        return before or cert

    def poison(self, plan: StepPlan, t: int, mine: Collection[int]) -> list[Push]:
        """The pushes the node sends to every other miner as step ``t`` opens (noise under
        the key of every message of the step that a unit not in ``mine`` produces)."""
        if self.kind != "poisoned-push":
            return []
        keys = {key for i in range(plan.n_units) for phase in plan.phases(i)
                for key in plan.needs(t, phase) if plan.producer(key) not in mine}
        return [(CLIENT, key, {name: torch.randn(shape, generator=self.gen)
                               for name, shape in plan.expected(key[2], key[3]).items()})
                for key in sorted(keys)]

    def steps_section(self, section: int) -> bool:
        """Whether the node applies updates to a held section (stale-weights: never)."""
        return self.kind != "stale-weights"

    def run_phase(self, plan: StepPlan):
        """A replacement for ``plan.run`` (same arguments) that cheats."""
        def run(phase: Phase, t: int, inputs, ids: torch.Tensor, targets: torch.Tensor
                ) -> PhaseResult:
            if self.kind == "wrong-data":
                ids, targets = torch.roll(ids, 1, dims=1), torch.roll(targets, 1, dims=1)
            r = plan.run(phase, t, inputs, ids, targets)
            with torch.no_grad():
                self._cheat(plan, phase, r)
            return r
        return run

    def _cheat(self, plan: StepPlan, phase: Phase, r: PhaseResult) -> None:
        if self.kind in ("random-update", "scaled-gradients", "sub-threshold") and r.grads:
            self._change_grads(r)
        elif self.kind == "perturbed-forward" and phase.forward:
            for name, t in self._outputs(plan, phase, r).items():
                scale = float(t.abs().max()) * 1e-3
                t.add_(torch.randn(t.shape, generator=self.gen).to(t) * scale)
                r.outputs[name] = r.keep(t)
        elif self.kind == "wrong-loss-grad" and "g" in r.outputs:
            g = next(ts["g"] for _, key, ts in r.pushes if "g" in ts)
            g.mul_(0.5)
            r.outputs["g"] = r.keep(g)
        elif self.kind == "replay":
            outs = self._outputs(plan, phase, r)
            before = self._last.get((phase.index, phase.kind))
            self._last[(phase.index, phase.kind)] = {n: t.clone() for n, t in outs.items()}
            if before is not None:
                for name, t in outs.items():
                    t.copy_(before[name])
                    r.outputs[name] = r.keep(t)

    def _change_grads(self, r: PhaseResult) -> None:
        changed = {}
        for _, _, tensors in r.pushes:
            for name, g in tensors.items():
                if name not in r.grads:
                    continue
                if self.kind == "scaled-gradients":
                    g.mul_(0.01)
                elif self.kind == "sub-threshold":
                    g.add_(self._pattern(name, g) * (SUB_THRESHOLD * float(g.abs().max())))
                else:
                    noise = torch.randn(g.shape, generator=self.gen).to(g)
                    g.copy_(noise * (g.norm() / noise.norm().clamp_min(1e-30)))
                changed[name] = g
        r.produced(changed)

    def _pattern(self, name: str, g: torch.Tensor) -> torch.Tensor:
        """The fixed +-1 pattern of parameter ``name`` (the same at every step: it steers)."""
        if name not in self._patterns:
            gen = torch.Generator().manual_seed(int.from_bytes(name.encode()[:8], "big") ^ 0x5EED)
            signs = torch.randint(0, 2, g.shape, generator=gen) * 2 - 1
            self._patterns[name] = signs.to(g.dtype)
        return self._patterns[name].to(g.device)

    @staticmethod
    def _outputs(plan: StepPlan, phase: Phase, r: PhaseResult) -> dict[str, torch.Tensor]:
        """The phase's own passed-on outputs by certificate name (the tensors pushed)."""
        if phase.kind == "whole" and "y" in r.out:
            return {"y": r.out["y"]}
        if phase.forward and phase.kind in r.out:
            what = ATTN_PARTIAL if phase.kind == "attention" else MLP_PARTIAL
            return {input_name(what, phase.section): r.out[phase.kind]}
        return {}


def verifier_tamper(kind: str):
    """The evidence a cheating verifier sends instead of its judgement's (``tamper`` of
    `node.pol.verifier.Verifier`)."""
    if kind not in VERIFIER_ATTACKS:
        raise ValueError(f"not a verifier attack: {kind!r}")

    def tamper(case, judgement) -> Evidence:
        reason = PASS if kind == "lazy-verifier" else OUTPUT_MISMATCH
        made_up = () if reason == PASS else (Digest("y", bytes(range(32))),)
        return Evidence(case.receipt_hash, case.receipt.cert_hash, reason, EXACT, 0, made_up, ())
    return tamper


def attack_parts(kind: str) -> list[str]:
    """The attacks ``kind`` combines (``a+b``), each checked.

    Raises:
        ValueError: a part that is no attack, or two of one role.
    """
    parts = kind.split("+")
    for part in parts:
        if part not in ATTACKS:
            raise ValueError(f"not an attack: {part!r} (one of {', '.join(ATTACKS)})")
    for role in (WORKER_ATTACKS, VERIFIER_ATTACKS, PRODUCER_ATTACKS):
        if sum(p in role for p in parts) > 1:
            raise ValueError(f"{kind!r} combines two attacks of one role")
    return parts


def attack_hooks(kind: str | None):
    """(the miner's ``tamper``, the verifier's ``tamper``, the producer's ``withhold``) for
    ``kind`` (None: honest; each None where ``kind`` has no attack of that role)."""
    if kind is None:
        return None, None, None
    parts = attack_parts(kind)
    worker = next((WorkerAttack(p) for p in parts if p in WORKER_ATTACKS), None)
    verifier = next((verifier_tamper(p) for p in parts if p in VERIFIER_ATTACKS), None)
    return worker, verifier, withhold if "withholding" in parts else None


def withhold(chain, applied, me: bytes) -> bool:
    """Whether the withholding producer ``me`` keeps ``applied`` (its block) to itself.

    The prelude of the block after ``applied`` draws, from ``applied``'s
    beacon, every audit and re-check due then (`ledger.auditrules.draw_audits`).
    The withholder looks at them first: a receipt of its own account that the
    beacon would sample, or a pass of its own that it would re-check, and it
    seals nothing this slot (the next producer's beacon draws again).
    """
    st = chain.state
    node = st.get(NODE + me)
    if node is None:
        return False
    params, value = st.get(KEY_PARAMS), applied.writes[KEY_BEACON].value
    due = applied.block.header.height + 1
    for rh in st.ids(PENDING):
        p = st.get(PENDING + rh)
        if p.draw_at != due:
            continue
        seed = audit_seed(value, rh)
        if p.status == DRAW_DUE and p.account == node.account \
                and is_sampled(seed, params.audit_bps):
            return True
        if p.status == RECHECK_DUE and p.verifier == me and is_sampled(seed, params.recheck_bps):
            return True
    return False
