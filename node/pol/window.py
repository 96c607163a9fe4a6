"""Window files: K steps of a worker's units, exported and re-executed offline (specs/pol.md 10).

Owns `export_window` (what `pnode pol export` asks a running node for: its
`PolArchive`'s units of steps [first, first + K) with every certificate and
tensor they name and the job's signed transaction, as one `PolWindow`) and
`verify_window` (what `pnode verify cert FILE` does: check that every byte
of the file is committed by its job or its receipts,
`node.pol.windowcheck.check_window`, and only then judge every unit of the
file with the verifier's own procedure, `proof_of_learning.judge.judge`,
through an `ArchiveFetcher` over the file, step by step). Anyone can so
re-check a worker's units after their windows closed, and refute a
verifier that failed them (specs/pol.md 6.6).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import trio

from compute.wiretensor import encode_tensor
from ledger import merkle
from ledger.codec import decode, encode
from ledger.errors import DecodeError
from ledger.types import Job, Receipt, tx_hash, unit_id
from node.pol.archive import PolArchive
from node.pol.fetch import ArchiveFetcher
from node.pol.windowcheck import CheckedWindow, Problem, WindowError, check_window
from proof_of_learning.judge import Case, Judgement, judge, run_inline
from proof_of_learning.reexecute import Reexecutor
from node.wire import MAX_POL_FRAME, NamedSet, NamedTensor, PolWindow
from proof_of_learning.certificate import (
    PASS, REASONS, UnitCert, bits_float, cert_hash, decode_cert, digest_map,
)

__all__ = ["WINDOW_MAGIC", "WindowError", "WindowReport", "decode_window", "encode_window",
           "export_op", "export_window", "read_window", "verify_window", "write_window"]

_FILE = "window"  # the peer name the file's archive answers as


def export_window(archive: PolArchive, job: Job, first: int, steps: int) -> PolWindow:
    """The kept units of steps [first, first + steps) of ``job`` as a `PolWindow`.

    The window's ``first_step`` and ``steps`` are those of the units it holds
    (a span the archive keeps only part of shrinks to that part).

    Raises:
        WindowError: the archive keeps no unit of those steps.
    """
    job_id = tx_hash(job)
    chosen = []
    for h, step in archive.receipts().items():
        raw = archive.receipt(h)
        receipt = decode(raw, Receipt)
        if first <= step < first + steps and receipt.job_id == job_id:
            cert = decode_cert(archive.encoded(receipt.cert_hash))
            chosen.append((step, cert.index, h, raw, cert))
    if not chosen:
        raise WindowError(f"this node keeps no unit of steps {first}..{first + steps - 1} "
                          f"(it keeps steps {sorted(set(archive.receipts().values()))})")
    chosen.sort()
    objects, named, tensors = [], {}, {}
    for _, _, _, _, cert in chosen:
        objects.append(archive.encoded(cert_hash(cert)))
        for key in (cert.weights_hash, cert.grads_hash):
            digests = archive.named_digests(key)
            if digests is not None:
                named[key] = digests
                tensors.update({d: archive.tensor(d) for d in digests.values()})
        for d in [*digest_map(cert.inputs).values(), *digest_map(cert.outputs).values()]:
            if (t := archive.tensor(d)) is not None:
                tensors[d] = t
    hashes = [h for _, _, h, _, _ in chosen]
    first, last = chosen[0][0], chosen[-1][0]
    return PolWindow(
        job=encode(job), job_id=job_id, first_step=first, steps=last - first + 1,
        receipts_root=merkle.merkle_root(hashes),
        receipts=tuple(raw for _, _, _, raw, _ in chosen), objects=tuple(objects),
        named=tuple(NamedSet(k, tuple(sorted(v)), tuple(v[n] for n in sorted(v)))
                    for k, v in named.items()),
        tensors=tuple(NamedTensor(d.hex(), encode_tensor(t)) for d, t in tensors.items()
                      if t is not None))


@dataclass
class WindowReport:
    """What `verify_window` found: the file's failed byte checks, per unit, and the verdict.

    ``problems`` non-empty: the file is not what its job and receipts
    commit, and no unit was re-executed (``units`` is empty).
    """

    job_id: bytes
    first_step: int
    steps: int
    problems: list[Problem] = field(default_factory=list)
    units: list[dict] = field(default_factory=list)  # step, index, receipt, reason, distance

    @property
    def passed(self) -> bool:
        return not self.problems and bool(self.units) and all(
            u["reason"] == "pass" for u in self.units)

    def per_step(self) -> list[dict]:
        out = {}
        for u in self.units:
            s = out.setdefault(u["step"], {"step": u["step"], "units": 0, "failed": 0,
                                           "max_distance": 0.0, "loss": None})
            s["units"] += 1
            s["failed"] += u["reason"] != "pass"
            s["max_distance"] = max(s["max_distance"], u["distance"])
            if u["loss"] is not None:
                s["loss"] = u["loss"]
        return [out[k] for k in sorted(out)]


def _load(window: PolWindow, checked: CheckedWindow) -> PolArchive:
    """The file's certificates, named sets and tensors, as an archive the judge fetches from."""
    archive = PolArchive()
    for cert in checked.certs:
        archive.keep_cert(window.first_step, cert)
    archive.keep_digested(window.first_step, checked.tensors)
    for digests in checked.named.values():
        archive.keep_named(window.first_step, digests)
    return archive


def verify_window(window: PolWindow, progress: Callable[[int, int], None] = lambda i, n: None
                  ) -> WindowReport:
    """Check every byte of ``window``, then judge every unit of it offline, as its verifier
    would have (module docstring). A file that fails a byte check is not re-executed.

    Raises:
        WindowError: the file cannot be checked at all (`check_window`).
    """
    checked = check_window(window)
    report = WindowReport(window.job_id, window.first_step, window.steps,
                          problems=checked.problems)
    if checked.problems:
        return report
    archive = _load(window, checked)
    rx = Reexecutor(checked.config)
    units = rx.units
    receipts = checked.receipts
    hashes = [tx_hash(r, raw) for r, raw in zip(receipts, window.receipts)]
    by_unit = {r.unit_id: r for r in receipts}
    fetcher = ArchiveFetcher({_FILE: archive})
    for n, (receipt, h, cert) in enumerate(zip(receipts, hashes, checked.certs)):
        case = Case(h, receipt, units, 0, (_FILE,), _receipt_lookup(by_unit, units, window))
        j: Judgement = trio.run(functools.partial(judge, run_sync=run_inline), case, fetcher, rx,
                                PolArchive())
        report.units.append(_row(j, receipt, h, cert))
        progress(n + 1, len(receipts))
    return report


def _receipt_lookup(by_unit: dict, units, window: PolWindow):
    async def receipt_of(step: int, index: int) -> Receipt | None:
        return by_unit.get(unit_id(window.job_id, step, units[index])) \
            if index < len(units) else None
    return receipt_of


def _row(j: Judgement, receipt: Receipt, h: bytes, cert: UnitCert) -> dict:
    distance = j.distance
    loss = bits_float(cert.loss_bits)
    return {"step": j.step, "index": j.index, "receipt": h.hex(), "worker": receipt.node_key.hex(),
            "reason": REASONS[j.reason], "passed": j.reason == PASS, "distance": distance,
            "detail": j.detail, "loss": loss}



async def export_op(archive: PolArchive | None, job: Job | None, args: dict) -> dict:
    """The node's ``pol_export`` control op: write a window file (`pnode pol export`).

    Args:
        archive: the mining node's archive (None: it mines no job).
        job: the `Job` transaction of the job it mines, from the chain.
        args: the op's ``out`` (a path the node may write), ``first`` (default:
            the oldest kept step), ``steps`` (default: every kept step from ``first``).

    Raises:
        WindowError: the node keeps nothing, or the arguments are wrong.
    """
    if archive is None or job is None or not archive.receipts():
        raise WindowError("this node keeps no units (it mines no job, or has run none "
                          "whose audit window is open)")
    kept = sorted(set(archive.receipts().values()))
    first, steps, out = args.get("first", kept[0]), args.get("steps"), args.get("out")
    steps = kept[-1] - first + 1 if steps is None else steps
    if not isinstance(out, str) or not out:
        raise WindowError('"out" must be the path of the file to write')
    if not (isinstance(first, int) and isinstance(steps, int) and first >= 0 and steps >= 1):
        raise WindowError('"first" and "steps" must be whole numbers (steps at least 1)')
    window = export_window(archive, job, first, steps)
    size = await trio.to_thread.run_sync(write_window, out, window)
    return {"path": out, "bytes": size, "units": len(window.receipts),
            "first_step": window.first_step, "steps": window.steps, "kept_steps": kept,
            "job": window.job_id.hex(), "receipts_root": window.receipts_root.hex()}


#: A window file: this line, then frames of a 4-byte big-endian length and that many
#: bytes: the `PolWindow` without its tensors, then each tensor as a `NamedTensor`
#: (one codec object may not pass 32 MiB; a window of many steps does). Version 2
#: carries the job's transaction (`PolWindow` version 2); version 1 is refused.
WINDOW_MAGIC = b"pnode-pol-window/2\n"
_OLD_MAGICS = (b"pnode-pol-window/1\n",)


def encode_window(window: PolWindow) -> bytes:
    """A window file's bytes (see `WINDOW_MAGIC`)."""
    frames = [encode(replace(window, tensors=())), *(encode(t) for t in window.tensors)]
    return WINDOW_MAGIC + b"".join(len(f).to_bytes(4, "big") + f for f in frames)


def decode_window(data: bytes) -> PolWindow:
    """The `PolWindow` of a window file's bytes: one encoding per window, nothing else.

    Raises:
        WindowError: not a window file of this version.
    """
    if data.startswith(_OLD_MAGICS):
        version = data[len(b"pnode-pol-window/"):data.index(b"\n")].decode()
        raise WindowError(f"a version {version} window file, which does not carry its job's "
                          f"transaction: export it again with this pnode (version 2)")
    if not data.startswith(WINDOW_MAGIC):
        raise WindowError("not a window file (no pnode-pol-window/2 header)")
    frames, at = [], len(WINDOW_MAGIC)
    while at < len(data):
        size = int.from_bytes(data[at:at + 4], "big")
        if at + 4 + size > len(data):
            raise WindowError("not a window file: a frame runs past the end")
        frames.append(data[at + 4:at + 4 + size])
        at += 4 + size
    if not frames:
        raise WindowError("not a window file: no header frame")
    try:
        head = decode(frames[0], PolWindow)
        tensors = tuple(decode(frame, NamedTensor, max_size=MAX_POL_FRAME)
                        for frame in frames[1:])
    except (DecodeError, ValueError) as exc:
        raise WindowError(f"not a window file: {exc}") from None
    if head.tensors:  # they travel in frames of their own; a second place would go unread
        raise WindowError("not a window file: its header frame carries tensors")
    return replace(head, tensors=tensors)


def write_window(path: str, window: PolWindow) -> int:
    """Write ``window`` to ``path`` through a temporary file (a reader never sees half).

    Returns:
        The file's size in bytes.
    """
    data = encode_window(window)
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return len(data)


def read_window(path: str) -> PolWindow:
    """The `PolWindow` of a window file (`decode_window`).

    Raises:
        OSError: the file cannot be read.
        WindowError: it is not a window file of this version.
    """
    with open(path, "rb") as f:
        return decode_window(f.read())
