"""Judging one sampled receipt: fetch, check, re-execute, compare (specs/pol.md 7.1).

Owns `judge`, the verifier's procedure, and the `Case` it judges. It
returns the `Evidence` whose reason the verdict carries. Its one rule of
fairness (specs/pol.md 6.3): what cannot be fetched is `UNAVAILABLE`, never
a fail; every failing reason rests on bytes the worker signed or served.

In order: the certificate (by `cert_hash`: none, `UNAVAILABLE`; not a
well-formed certificate of this receipt, `MALFORMED`); the weights it read
(by `weights_hash`: the same as the step before's receipt of the unit:
`UNCHAINED_INPUT`, a skipped update), compared with this node's own weights of that step
where it holds them (beyond the threshold: `UNCHAINED_INPUT` when another
account's receipt backs this node's weights, else `UNAVAILABLE`); the inputs
(by digest), a backward's `h` against its stage's forward receipt; the
re-run; then `data_hash` (`WRONG_DATA`), the inputs the re-run derived
itself (stage 0's embedding: `UNCHAINED_INPUT`), and the outputs, loss,
gradients and norm, by digest (all equal: `PASS`, exact) or by distance
(section 7.2: `PASS`, `OUTPUT_MISMATCH` or `GRADIENT_MISMATCH`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import torch

from ledger.types import Receipt, UnitTemplate, unit_id
from proof_of_learning.certificate import (
    EXACT, GRADIENT_MISMATCH, INF_BITS, MALFORMED, OUTPUT_MISMATCH, PASS, THRESHOLD, TOLERANCE,
    UNAVAILABLE, UNCHAINED_INPUT, WRONG_DATA, Distance, Evidence, UnitCert, bits_float,
    decode_cert, digest_map, digests, distance, float32_bits, passes, rel_max_err,
)
from proof_of_learning.errors import PolError
from proof_of_learning.kinds import WHATS
from proof_of_learning.phases import HALF_OF
from proof_of_learning.reexecute import Reexecutor, WeightsMismatch
from proof_of_learning.units import named_digest

__all__ = ["Case", "Fetcher", "Judgement", "OwnWeights", "RunSync", "judge", "run_inline"]


class Fetcher(Protocol):
    """What the judge asks of the network: bytes by hash from the unit's peers.

    Each method returns None when no peer served a well-formed answer
    (`UNAVAILABLE`, never a fail); what it returns hashes to ``key``.
    Implemented by `node.pol.PolFetcher` (over `/pnode/pol/1.0.0`) and
    `node.pol.ArchiveFetcher` (a window file).
    """

    async def cert_bytes(self, peers: Sequence[str], job_id: bytes, key: bytes
                         ) -> bytes | None: ...

    async def tensor(self, peers: Sequence[str], job_id: bytes, digest: bytes
                     ) -> torch.Tensor | None: ...

    async def named(self, peers: Sequence[str], job_id: bytes, key: bytes
                    ) -> tuple[dict[str, torch.Tensor], dict[str, bytes]] | None: ...


class OwnWeights(Protocol):
    """The judging node's own weights of the job, by version (`node.pol.PolArchive`)."""

    def version_digests(self, version: int) -> dict[str, bytes]: ...

    def tensor(self, digest: bytes) -> torch.Tensor | None: ...


#: Runs a blocking function and awaits its result (the node's torch thread; inline offline).
RunSync = Callable[..., Awaitable]


async def run_inline(fn: Callable, *args):
    """A `RunSync` for offline use, with no torch thread to keep free: runs ``fn`` here."""
    return fn(*args)


@dataclass(frozen=True, slots=True)
class Case:
    """A sampled receipt this node must judge, with what the chain says around it.

    peers: whom to ask, the worker first; receipt_of(step, index): the
    accepted receipt of another unit of the job (None: not found, the checks
    that need it are skipped); accounts: each registered node key's account
    (a node key missing from it stands for an account of its own).
    """

    receipt_hash: bytes
    receipt: Receipt
    units: tuple[UnitTemplate, ...]
    height: int
    peers: tuple[str, ...]
    receipt_of: Callable[[int, int], Awaitable[Receipt | None]]
    accounts: Mapping[bytes, bytes] = field(default_factory=dict)

    def account(self, node_key: bytes) -> bytes:
        return self.accounts.get(node_key, node_key)


@dataclass(frozen=True, slots=True)
class Judgement:
    """The evidence, and the unit's step and index (-1 when no certificate was read)."""

    evidence: Evidence
    step: int = -1
    index: int = -1
    detail: str = ""  # what failed, for the log (not on chain)
    distance: float = 0.0  # the largest distance measured (0: bit-exact, or none measured)

    @property
    def reason(self) -> int:
        return self.evidence.reason


def _exact(case: Case, reason: int, recomputed: dict[str, bytes] | None = None,
           cert: UnitCert | None = None, detail: str = "") -> Judgement:
    ev = Evidence(case.receipt_hash, case.receipt.cert_hash, reason, EXACT, 0,
                  digests(recomputed or {}), ())
    return Judgement(ev, cert.step if cert else -1, cert.index if cert else -1, detail)


def receipt_problem(cert: UnitCert, receipt: Receipt, units, rx: Reexecutor) -> str | None:
    """Why ``cert`` is not a certificate of ``receipt`` (specs/pol.md 3.4), or None."""
    if (cert.job_id, cert.unit_id, cert.weights_hash) != (receipt.job_id, receipt.unit_id,
                                                           receipt.weights_hash):
        return "job, unit or weights hash differ from the receipt's"
    if cert.index >= len(units) or unit_id(cert.job_id, cert.step, units[cert.index]) != \
            receipt.unit_id:
        return "step and index do not name the receipt's unit"
    if rx.config.classes and cert.device not in rx.config.classes:
        return f"compute class {cert.device!r} is not one the job admits"
    plan = rx.plan
    _, s, forward = plan.unit_of(cert.index)
    inputs, outputs = digest_map(cert.inputs), digest_map(cert.outputs)
    if inputs.get("h" if forward else "g") != receipt.input_hash:
        return "the receipt's input hash is not the certificate's input"
    if plan.pieces[s] is None:
        expected = outputs.get("y")
    else:
        halves = {HALF_OF[WHATS.index(name.split("/")[0])]: d for name, d in outputs.items()
                  if "/" in name and name.split("/")[0] in WHATS}
        expected = named_digest(halves) if halves else None
    if expected != receipt.output_hash:
        return "the receipt's output hash is not the certificate's outputs"
    return None


async def judge(case: Case, fetcher: Fetcher, rx: Reexecutor, archive: OwnWeights, *,
                run_sync: RunSync,
                me: bytes = b"") -> Judgement:
    """The verifier's procedure on one receipt (module docstring); never raises for bad peers.

    ``run_sync`` runs the re-execution (the node's torch thread; offline, inline);
    ``me``: this verifier's node key (its own receipts corroborate nothing).
    """
    r, peers = case.receipt, case.peers
    raw = await fetcher.cert_bytes(peers, r.job_id, r.cert_hash)
    if raw is None:
        return _exact(case, UNAVAILABLE, detail="no peer served the certificate")
    try:
        cert = decode_cert(raw)
    except PolError as exc:
        return _exact(case, MALFORMED, detail=str(exc))
    problem = receipt_problem(cert, r, case.units, rx)
    if problem is not None:
        return _exact(case, MALFORMED, cert=cert, detail=problem)
    skipped = await _skipped_update(case, cert, rx, archive)
    if skipped is not None:
        return _exact(case, UNCHAINED_INPUT, cert=cert, detail=skipped)
    fetched = _own_weights(archive, cert, rx) or await fetcher.named(peers, r.job_id,
                                                                      cert.weights_hash)
    if fetched is None:
        return _exact(case, UNAVAILABLE, cert=cert, detail="no peer served the weights")
    weights, weight_digests = fetched
    if set(weights) != rx.read_set(cert.index):
        return _exact(case, UNCHAINED_INPUT, cert=cert, detail="weights of other parameters")
    stale, differing = _stale(weights, weight_digests, archive, cert.step)
    if stale is not None:
        if not await _corroborated(case, cert, rx, archive, differing, me):
            return _exact(case, UNAVAILABLE, cert=cert, detail=f"{stale}, and no other "
                          "account's receipt of that step shows this node's: not settled")
        own = {n: d for n, d in archive.version_digests(cert.step).items() if n in weights}
        return _exact(case, UNCHAINED_INPUT, {"weights": named_digest(own)}, cert, stale)
    committed_inputs = digest_map(cert.inputs)
    needed = rx.needed_inputs(cert.step, cert.index)
    if not set(needed) <= set(committed_inputs):
        return _exact(case, MALFORMED, cert=cert, detail="inputs missing from the certificate")
    inputs = {}
    for name in needed:
        t = await fetcher.tensor(peers, r.job_id, committed_inputs[name])
        if t is None:
            return _exact(case, UNAVAILABLE, cert=cert, detail=f"no peer served input {name}")
        inputs[name] = t
    unchained = await _unchained(case, cert, rx, fetcher, needed)
    if unchained is not None:
        return _exact(case, UNCHAINED_INPUT, cert=cert, detail=unchained)
    try:
        run = await run_sync(rx.rerun, r.job_id, cert.step, r.unit_id, cert.index, weights,
                             inputs, weight_digests)
    except (WeightsMismatch, ValueError, RuntimeError) as exc:  # shapes it cannot take
        return _exact(case, UNCHAINED_INPUT, cert=cert, detail=f"cannot re-run: {exc}")
    return await _compare(case, cert, run, fetcher)


async def _unchained(case: Case, cert: UnitCert, rx: Reexecutor, fetcher: Fetcher,
                     needed: dict) -> str | None:
    """Why an input is not what its producer committed (specs/pol.md 7.1 step 3), or None.

    A backward unit's ``h`` must be its stage's forward receipt's input
    (past stage 0);
    every fetched input must be the output its producing unit's certificate
    names (``h`` <- ``y``; ``g`` <- the last forward's ``g`` or a backward's
    ``y``; a piece's ``W/s`` <- the same name). A producer whose receipt or
    certificate cannot be found, or whose certificate is not its receipt's
    (a copied one), is skipped, never held against the worker.
    """
    plan, committed = rx.plan, digest_map(cert.inputs)
    r, s, is_forward = plan.unit_of(cert.index)
    # A backward's h is its forward's; but stage 0's h is the embedded batch, which the
    # re-run derives itself and checks (`_compare`): a forward that embedded another
    # batch is that forward's fault, not this backward's (the wrong-data attack).
    if not is_forward and plan.stage_of[s] != 0:
        forward = await case.receipt_of(cert.step, plan.unit_index(r, s, True))
        if forward is not None and committed.get("h") != forward.input_hash:
            return "h is not its forward's input"
    for name, key in needed.items():
        producer = plan.producer(key)
        if producer == cert.index:
            continue  # an earlier phase of the unit itself
        receipt = await case.receipt_of(cert.step, producer)
        raw = None if receipt is None else await fetcher.cert_bytes(
            case.peers, case.receipt.job_id, receipt.cert_hash)
        try:
            made = None if raw is None else decode_cert(raw)
        except PolError:
            made = None
        if made is None or receipt_problem(made, receipt, case.units, rx) is not None:
            # Not a certificate of the producer's receipt (a copied one): the producer's
            # fault, failed on its own receipt, never held against this consumer.
            continue
        outputs = digest_map(made.outputs)
        if "/" in name:
            source = name
        else:
            source = "g" if name == "g" and "g" in outputs else "y"
        if outputs.get(source) != committed[name]:
            return f"input {name} is not output {source} of unit {producer}"
    return None


def _own_weights(archive: OwnWeights, cert: UnitCert, rx: Reexecutor
                 ) -> tuple[dict[str, torch.Tensor], dict[str, bytes]] | None:
    """The unit's weights from this node's own ring when they are exactly the committed
    ones (a holder of its layers, as the draw prefers): nothing to fetch or hash."""
    own = archive.version_digests(cert.step)
    names = rx.read_set(cert.index)
    if not names <= own.keys():
        return None
    digests = {n: own[n] for n in names}
    if named_digest(digests) != cert.weights_hash:
        return None
    weights = {n: archive.tensor(d) for n, d in digests.items()}
    return None if any(t is None for t in weights.values()) else (weights, digests)


def _stale(weights: dict[str, torch.Tensor], digests: dict[str, bytes], archive: OwnWeights,
           step: int) -> tuple[str | None, set[str]]:
    """(how the first tensor the unit read beyond the threshold from this node's own at
    that step is, every such tensor's name); (None, empty) when none is or this node
    kept no weights of its own for that step."""
    own = archive.version_digests(step)
    detail, differing = None, set()
    for name in sorted(set(own) & set(weights)):
        theirs = weights[name]
        if digests[name] == own[name]:
            continue
        mine = archive.tensor(own[name])
        if mine is None:
            continue
        d = rel_max_err(theirs.double().numpy(), mine.double().numpy())
        if d >= THRESHOLD:
            differing.add(name)
            detail = detail or f"weights {name} are {d:.3g} from this node's own at that step"
    return detail, differing


async def _skipped_update(case: Case, cert: UnitCert, rx: Reexecutor, archive: OwnWeights
                          ) -> str | None:
    """Why the unit read step t − 1's weights again (a skipped update), or None
    (specs/pol.md 7.1 step 2).

    Every update changes a read set's weights (AdamW, lr > 0, weight decay;
    an honest miner signs no unit whose outputs are not finite, so diverged
    weights sign nothing). Shown either by the worker's own receipt of the
    same unit at t − 1 with the same `weights_hash`, or by this node's own
    weights of t − 1 having it. Attack note: another worker's t − 1 receipt
    is not taken as proof: nothing checks a `weights_hash` on inclusion, so
    a cheater could post the step-t weights' hash at t − 1 and have the
    honest worker of t failed.
    """
    if cert.step == 0:
        return None
    r = case.receipt
    before = await case.receipt_of(cert.step - 1, cert.index)
    if before is not None and before.weights_hash == r.weights_hash \
            and case.account(before.node_key) == case.account(r.node_key):
        return f"its weights are those its own receipt of step {cert.step - 1} read: " \
            "it skipped the update"
    own = archive.version_digests(cert.step - 1)
    names = rx.read_set(cert.index)
    if names <= own.keys() and named_digest({n: own[n] for n in names}) == r.weights_hash:
        return f"its weights are this node's own of step {cert.step - 1}: it skipped the update"
    return None


async def _corroborated(case: Case, cert: UnitCert, rx: Reexecutor, archive: OwnWeights,
                        differing: set[str], me: bytes) -> bool:
    """Whether another account's receipt of the step commits this node's own weights of
    the ``differing`` tensors (specs/pol.md 7.1 step 2).

    Attack note: a verifier's ring is its own word. One that skipped its own
    updates (the stale-weights attack) would otherwise fail every honest
    worker of those layers; so a weights disagreement fails the worker only
    when a third party's receipt (of neither the worker's account nor this
    node's) read the same tensors as this node holds them. Accounts that
    collude (a Sybil's second account) can still back each other. Unsettled, it is
    `UNAVAILABLE`: neither is paid for it, neither slashed; the join-time
    replay (section 10.3) settles it from genesis.
    """
    own = archive.version_digests(cert.step)
    for j in range(rx.plan.n_units):
        names = rx.read_set(j)
        if j == cert.index or not differing <= names or not names <= own.keys():
            continue
        other = await case.receipt_of(cert.step, j)
        if other is not None \
                and case.account(other.node_key) not in {case.account(case.receipt.node_key),
                                                         case.account(me)} \
                and other.weights_hash == named_digest({n: own[n] for n in names}):
            return True
    return False


async def _compare(case: Case, cert: UnitCert, run, fetcher: Fetcher) -> Judgement:
    """Steps 2, 3 (what the re-run derived) and 4, 5 of specs/pol.md 7.1."""
    mine = run.cert
    outputs, my_outputs = digest_map(cert.outputs), digest_map(mine.outputs)
    recomputed = {**my_outputs, "data": mine.data_hash, "grads": mine.grads_hash,
                  "weights": mine.weights_hash}
    if set(outputs) != set(my_outputs) or set(digest_map(cert.inputs)) != set(
            digest_map(mine.inputs)):
        return _exact(case, MALFORMED, recomputed, cert, "names unlike the unit's")
    if mine.data_hash != cert.data_hash:
        return _exact(case, WRONG_DATA, recomputed, cert, "not the step's batch")
    if digest_map(mine.inputs) != digest_map(cert.inputs):
        return _exact(case, UNCHAINED_INPUT, recomputed, cert, "h is not the batch's embedding")
    if outputs == my_outputs and (cert.grads_hash, cert.loss_bits, cert.grad_norm_bits) == (
            mine.grads_hash, mine.loss_bits, mine.grad_norm_bits):
        return _exact(case, PASS, recomputed, cert)
    same_class = cert.device == mine.device
    job = case.receipt.job_id
    out_d: list[Distance] = []
    for name, d in outputs.items():
        if d != my_outputs[name]:
            committed = await fetcher.tensor(case.peers, job, d)
            if committed is None and not same_class:
                return _exact(case, UNAVAILABLE, recomputed, cert, f"no peer served {name}")
            out_d.append(Distance(name, INF_BITS) if committed is None else
                         distance(name, _np(committed), _np(run.kept[my_outputs[name]])))
    if cert.loss_bits != mine.loss_bits:
        out_d.append(_scalar("loss", cert.loss_bits, mine.loss_bits))
    grad_d: list[Distance] = []
    if cert.grads_hash != mine.grads_hash:
        fetched = await fetcher.named(case.peers, job, cert.grads_hash)
        if fetched is None and not same_class:
            return _exact(case, UNAVAILABLE, recomputed, cert, "no peer served the gradients")
        theirs = fetched[0] if fetched is not None else {}
        for name in sorted(set(theirs) | set(run.grads)):
            if name not in theirs or name not in run.grads:
                grad_d.append(Distance(name, INF_BITS))
            else:
                grad_d.append(distance(name, _np(theirs[name]), _np(run.kept[run.grads[name]])))
    if cert.grad_norm_bits != mine.grad_norm_bits:
        grad_d.append(_scalar("grad norm", cert.grad_norm_bits, mine.grad_norm_bits))
    dist = tuple(sorted(out_d + grad_d, key=lambda x: x.name.encode()))
    worst = max(dist, key=lambda x: bits_float(x.rel_max_err_bits) or float("inf"))
    largest = bits_float(worst.rel_max_err_bits)
    largest = float("inf") if largest is None else largest
    detail = f"largest distance {largest:.3g} ({worst.name})"
    if same_class:
        # One compute class gives one set of bits (specs/pol.md 7.3): any
        # difference is a lie, however small. A tolerance here let a fixed
        # pattern of 9e-5 x max|g| through every audit while it steered the
        # weights (issue 27). The distances are for the log only.
        outputs_differ = outputs != my_outputs or cert.loss_bits != mine.loss_bits
        failed = _exact(case, OUTPUT_MISMATCH if outputs_differ else GRADIENT_MISMATCH,
                        recomputed, cert, f"not bit-exact in its own compute class "
                        f"({cert.device}); {detail}")
        return replace(failed, distance=largest)
    reason = PASS if passes(out_d + grad_d) else OUTPUT_MISMATCH if not passes(out_d) \
        else GRADIENT_MISMATCH
    ev = Evidence(case.receipt_hash, case.receipt.cert_hash, reason, TOLERANCE,
                  float32_bits(THRESHOLD), digests(recomputed), dist)
    return Judgement(ev, cert.step, cert.index, f"{detail}, across compute classes "
                     f"({cert.device} against {mine.device})", largest)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu").double().numpy()


def _scalar(name: str, committed_bits: int, mine_bits: int) -> Distance:
    a, b = bits_float(committed_bits), bits_float(mine_bits)
    if a is None or b is None:
        return Distance(name, INF_BITS)
    return distance(name, np.float64(a), np.float64(b))
