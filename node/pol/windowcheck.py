"""A window file's byte checks: every byte it carries is committed by its job or its receipts.

Owns `check_window`, what `pnode verify cert` runs before it re-executes
any unit (specs/pol.md 10.2): the `Job` transaction hashes to the
window's ``job_id``, carries its creator's signature, and its spec is the
config whose hashes (hyperparameters, initial model, data) and units it
commits; every receipt is signed and in the window's job, and they hash
to the receipts root; every certificate hashes to its receipt's
``cert_hash``; every named set hashes to its key, and a certificate
commits that key; every tensor hashes to its digest, and a certificate or
a committed named set names that digest. Anything else in the file is an
extra, refused too. Each failure is a `Problem` naming the field.

Attack note: re-execution alone does not prove a file. A unit whose
re-run matches the digests its certificate commits never reads the output
or gradient tensors the file carries, and the re-run takes its config from
the file: before these checks, a window whose gradient bytes were edited,
or whose learning rate was replaced (with the receipts and certificates
untouched), passed `pnode verify cert`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

from compute.data import JobConfig
from compute.errors import ComputeError
from compute.wiretensor import decode_tensor, encode_tensor
from ledger import crypto, merkle
from ledger.codec import decode
from ledger.errors import DecodeError
from ledger.types import Job, Receipt, signature_ok, tx_hash
from node.wire import PolWindow
from proof_of_learning.certificate import UnitCert, decode_cert, digest_map
from proof_of_learning.errors import PolError
from proof_of_learning.units import (
    commitments, config_of, job_plan, job_units, named_digest, tensor_digest,
)

__all__ = ["CheckedWindow", "Problem", "WindowError", "check_window"]

_ZERO = bytes(32)


def _short(digest: bytes) -> str:
    return digest.hex()[:16] + ".."


@dataclass(frozen=True, slots=True)
class Problem:
    """One failed check: the window's ``field`` (e.g. ``tensors[3] (digest ab12..)``) and why."""

    field: str
    detail: str

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "detail": self.detail}

    def __str__(self) -> str:
        return f"{self.field}: {self.detail}"


@dataclass
class CheckedWindow:
    """What `check_window` found, and what it decoded on the way (for the re-execution).

    ``receipts`` and ``certs`` are in the file's order (None where one does
    not decode); ``named`` and ``tensors`` hold only the items that hash
    right, by key and digest.
    """

    problems: list[Problem] = field(default_factory=list)
    job: Job | None = None
    config: JobConfig | None = None
    receipts: list[Receipt | None] = field(default_factory=list)
    certs: list[UnitCert | None] = field(default_factory=list)
    named: dict[bytes, dict[str, bytes]] = field(default_factory=dict)
    tensors: dict[bytes, torch.Tensor] = field(default_factory=dict)

    def fail(self, where: str, detail: str) -> None:
        self.problems.append(Problem(where, detail))


class WindowError(PolError):
    """A window file that cannot be checked at all: not a window, an old version, or a job
    (intact) whose config this node cannot build."""


def check_window(window: PolWindow) -> CheckedWindow:
    """Check every byte of ``window`` against what its job and receipts commit (module docstring).

    In order: the job, the receipts and their root, the certificates and the
    window's span, the named sets, the tensors. A check that needs an item
    that failed to decode is skipped (its failure is already named).

    Raises:
        WindowError: the job is intact, but its config cannot be built here.
    """
    out = CheckedWindow()
    _check_job(window, out)
    _check_receipts(window, out)
    _check_objects(window, out)
    _check_named(window, out)
    _check_tensors(window, out)
    return out


def _check_job(window: PolWindow, out: CheckedWindow) -> None:
    try:
        job = decode(window.job, Job)
    except DecodeError as exc:
        out.fail("job", f"not a Job transaction: {exc}")
        return
    out.job = job
    got = tx_hash(job, window.job)
    if got != window.job_id:
        out.fail("job", f"the transaction hashes to {_short(got)}, not the window's job_id "
                        f"{_short(window.job_id)} (its spec, hashes, units or signature differ "
                        f"from the job the receipts name)")
    if not signature_ok(job, window.job):
        out.fail("job.signature", "not the job creator's signature of the transaction")
    spec_hash = hashlib.sha256(job.spec).digest()
    if spec_hash != job.hyper_hash:
        out.fail("job.hyper_hash", f"the job's spec (its config) hashes to {_short(spec_hash)}, "
                                   f"not its hyper_hash {_short(job.hyper_hash)}")
    if out.problems:  # a changed job: its config is not built (it could be any size)
        return
    try:
        config = config_of(job)
        model_hash, data_hash, _ = commitments(config)
        units = job_units(job_plan(config), config.replicas)
    except (ValueError, ComputeError, OSError) as exc:  # the creator's own spec, intact
        raise WindowError(f"the job's config cannot be built here: {exc}") from None
    out.config = config
    for name, ours, theirs in (("model_hash", model_hash, job.model_hash),
                               ("data_hash", data_hash, job.data_hash)):
        if ours != theirs:
            out.fail(f"job.{name}", f"the config builds {_short(ours)}, the job commits "
                                    f"{_short(theirs)}")
    if units != job.units:
        out.fail("job.units", f"not the {len(units)} units of the config's partition")
    if window.first_step + window.steps > job.steps:
        out.fail("steps", f"steps {window.first_step}..{window.first_step + window.steps - 1} "
                          f"run past the job's {job.steps} steps")


def _check_receipts(window: PolWindow, out: CheckedWindow) -> None:
    if not window.receipts:
        out.fail("receipts", "the window holds no unit")
    hashes, seen = [], {}
    for i, raw in enumerate(window.receipts):
        try:
            r = decode(raw, Receipt)
        except DecodeError as exc:
            out.fail(f"receipts[{i}]", f"not a receipt: {exc}")
            out.receipts.append(None)
            continue
        out.receipts.append(r)
        h = tx_hash(r, raw)
        hashes.append(h)
        if h in seen:
            out.fail(f"receipts[{i}]", f"a second copy of receipts[{seen[h]}]")
        seen.setdefault(h, i)
        if not signature_ok(r, raw):
            out.fail(f"receipts[{i}] ({_short(h)})", "not its worker's signature of the receipt")
        if r.job_id != window.job_id:
            out.fail(f"receipts[{i}].job_id", f"{_short(r.job_id)}, not the window's "
                                              f"{_short(window.job_id)}")
        if out.job is not None and r.chain_id != out.job.chain_id:
            out.fail(f"receipts[{i}].chain_id", f"{r.chain_id!r}, not the job's "
                                                f"{out.job.chain_id!r}")
    if len(hashes) == len(window.receipts):
        root = merkle.merkle_root(hashes)
        if root != window.receipts_root:
            out.fail("receipts_root", f"the receipts' Merkle root is {_short(root)}, not "
                                      f"{_short(window.receipts_root)}")


def _check_objects(window: PolWindow, out: CheckedWindow) -> None:
    n, m = len(window.objects), len(window.receipts)
    if n != m:
        out.fail("objects", f"{n} certificates for {m} receipts (one per receipt, in order)")
    for i, raw in enumerate(window.objects):
        r = out.receipts[i] if i < m else None
        if i >= m:
            out.fail(f"objects[{i}]", "no receipt commits it (an extra object)")
        elif r is not None:
            got = crypto.domain_hash(crypto.H_CERT, raw)
            if got != r.cert_hash:
                out.fail(f"objects[{i}]", f"hashes to {_short(got)}, not receipts[{i}]'s "
                                          f"cert_hash {_short(r.cert_hash)}")
        try:
            out.certs.append(decode_cert(raw))
        except PolError as exc:
            out.fail(f"objects[{i}]", f"not a certificate: {exc}")
            out.certs.append(None)
    _check_span(window, out)


def _check_span(window: PolWindow, out: CheckedWindow) -> None:
    """``first_step``/``steps`` are the span of the units' steps; units in (step, unit) order."""
    units = [(c.step, c.index) for c in out.certs if c is not None]
    if not units or len(units) != len(window.objects):
        return
    if units != sorted(units):
        out.fail("objects", "the units are not in (step, unit) order")
    if units[0][0] != window.first_step:
        out.fail("first_step", f"{window.first_step}, but the window's first unit is of step "
                               f"{units[0][0]}")
    last = max(s for s, _ in units)
    if last != window.first_step + window.steps - 1:
        out.fail("steps", f"{window.steps} steps from {window.first_step}, but the window's "
                          f"last unit is of step {last}")


def _check_named(window: PolWindow, out: CheckedWindow) -> None:
    committed = {k for c in out.certs if c is not None
                 for k in (c.weights_hash, c.grads_hash)} - {_ZERO}
    seen: dict[bytes, int] = {}
    for i, s in enumerate(window.named):
        where = f"named[{i}] (key {_short(s.key)})"
        if len(s.names) != len(s.digests):
            out.fail(where, f"{len(s.names)} names for {len(s.digests)} digests")
            continue
        if list(s.names) != sorted(set(s.names)):
            out.fail(where, "its names are not in ascending order, or one is twice")
        digests = dict(zip(s.names, s.digests))
        got = named_digest(digests)
        ok = got == s.key
        if not ok:
            out.fail(where, f"its names and digests hash to {_short(got)}")
        if s.key in seen:
            out.fail(where, f"a second copy of named[{seen[s.key]}]")
        seen.setdefault(s.key, i)
        if s.key not in committed:
            out.fail(where, "no certificate's weights_hash or grads_hash commits it "
                            "(an extra set)")
        elif ok:
            out.named[s.key] = digests


def _check_tensors(window: PolWindow, out: CheckedWindow) -> None:
    named = {d for digests in out.named.values() for d in digests.values()}
    for c in out.certs:
        if c is not None:
            named.update(digest_map(c.inputs).values(), digest_map(c.outputs).values())
    seen: dict[bytes, int] = {}
    for i, t in enumerate(window.tensors):
        try:
            digest = bytes.fromhex(t.name)
        except ValueError:
            digest = b""
        if len(digest) != 32 or digest.hex() != t.name:
            out.fail(f"tensors[{i}]", f"its name {t.name[:72]!r} is not a digest's hex")
            continue
        where = f"tensors[{i}] (digest {_short(digest)})"
        try:
            x = decode_tensor(t.data)
        except ComputeError as exc:
            out.fail(where, f"not a wire tensor: {exc}")
            continue
        got = tensor_digest(x)
        if got != digest:
            out.fail(where, f"its bytes hash to {_short(got)}")
        elif encode_tensor(x) != t.data:  # another codec can carry the same values
            out.fail(where, "not its tensor's canonical (raw) encoding")
        if digest in seen:
            out.fail(where, f"a second copy of tensors[{seen[digest]}]")
        seen.setdefault(digest, i)
        if digest not in named:
            out.fail(where, "no certificate or committed named set names it (an extra tensor)")
        elif got == digest:
            out.tensors[digest] = x
