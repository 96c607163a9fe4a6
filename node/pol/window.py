"""Window files: K steps of a worker's units, exported and re-executed offline (specs/pol.md 10).

Owns `export_window` (what `pnode pol export` asks a running node for: its
`PolArchive`'s units of steps [first, first + K) with every certificate and
tensor they name, as one `PolWindow`) and `verify_window` (what `pnode
verify cert FILE` does: judge every unit of the file with the verifier's
own procedure, `proof_of_learning.judge.judge`, through an `ArchiveFetcher` over the
file, step by step). Anyone can so re-check a worker's units after their
windows closed, and refute a verifier that failed them (specs/pol.md 6.6).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import trio

from compute.wiretensor import decode_tensor, encode_tensor
from ledger import merkle
from ledger.codec import decode, encode
from ledger.errors import DecodeError
from ledger.types import Receipt, signature_ok, tx_hash, unit_id
from compute.jobfile import config_from_json
from proof_of_learning.units import named_digest
from node.pol.archive import PolArchive
from node.pol.fetch import ArchiveFetcher
from proof_of_learning.judge import Case, Judgement, judge, run_inline
from proof_of_learning.reexecute import Reexecutor
from node.wire import MAX_POL_FRAME, NamedSet, NamedTensor, PolWindow
from proof_of_learning.certificate import (
    PASS, REASONS, bits_float, cert_hash, decode_cert, digest_map,
)
from proof_of_learning.errors import PolError

__all__ = ["WindowError", "WindowReport", "export_op", "export_window", "read_window",
           "verify_window", "write_window"]

_FILE = "window"  # the peer name the file's archive answers as


class WindowError(PolError):
    """A window file that cannot be checked at all (not a window, a bad config)."""


def export_window(archive: PolArchive, config_json: str, job_id: bytes, first: int,
                  steps: int) -> PolWindow:
    """The kept units of steps [first, first + steps) of ``job_id`` as a `PolWindow`.

    Raises:
        WindowError: the archive keeps no unit of those steps.
    """
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
    ring = [named_digest(archive.version_digests(v)) if archive.version_digests(v) else bytes(32)
            for v in (first, first + steps)]
    return PolWindow(
        config=config_json, job_id=job_id, first_step=first, steps=steps,
        receipts_root=merkle.merkle_root(hashes), start_state=ring[0], end_state=ring[1],
        receipts=tuple(raw for _, _, _, raw, _ in chosen), objects=tuple(objects),
        named=tuple(NamedSet(k, tuple(v), tuple(v.values())) for k, v in named.items()),
        tensors=tuple(NamedTensor(d.hex(), encode_tensor(t)) for d, t in tensors.items()
                      if t is not None))


@dataclass
class WindowReport:
    """What `verify_window` found: per step and per unit, and the verdict."""

    job_id: bytes
    first_step: int
    steps: int
    root_ok: bool
    signatures_ok: bool
    units: list[dict] = field(default_factory=list)  # step, index, receipt, reason, distance

    @property
    def passed(self) -> bool:
        return self.root_ok and self.signatures_ok and bool(self.units) and all(
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


def _load(window: PolWindow) -> tuple[PolArchive, list[Receipt]]:
    archive = PolArchive()
    try:
        receipts = [decode(raw, Receipt) for raw in window.receipts]
        for raw in window.objects:
            cert = decode_cert(raw)
            archive.keep_cert(window.first_step, cert)
        for t in window.tensors:
            archive.keep_digested(window.first_step, {bytes.fromhex(t.name): decode_tensor(t.data)})
        for s in window.named:
            archive.keep_named(window.first_step, dict(zip(s.names, s.digests)))
    except (DecodeError, ValueError, PolError) as exc:
        raise WindowError(f"not a window file: {exc}") from None
    return archive, receipts


def verify_window(window: PolWindow, progress: Callable[[int, int], None] = lambda i, n: None
                  ) -> WindowReport:
    """Judge every unit of ``window`` offline, as its verifier would have (module docstring).

    Raises:
        WindowError: the file cannot be checked at all.
    """
    try:
        config = config_from_json(window.config)
    except ValueError as exc:
        raise WindowError(f"the window's job config: {exc}") from None
    archive, receipts = _load(window)
    rx = Reexecutor(config)
    units = rx.units
    hashes = [tx_hash(r) for r in receipts]
    report = WindowReport(window.job_id, window.first_step, window.steps,
                          root_ok=merkle.merkle_root(hashes) == window.receipts_root,
                          signatures_ok=all(signature_ok(r) for r in receipts))
    by_unit = {r.unit_id: r for r in receipts}
    fetcher = ArchiveFetcher({_FILE: archive})
    for n, (receipt, h) in enumerate(zip(receipts, hashes)):
        case = Case(h, receipt, units, 0, (_FILE,), _receipt_lookup(by_unit, units, window))
        j: Judgement = trio.run(functools.partial(judge, run_sync=run_inline), case, fetcher, rx,
                                PolArchive())
        report.units.append(_row(j, receipt, h, archive))
        progress(n + 1, len(receipts))
    return report


def _receipt_lookup(by_unit: dict, units, window: PolWindow):
    async def receipt_of(step: int, index: int) -> Receipt | None:
        return by_unit.get(unit_id(window.job_id, step, units[index])) \
            if index < len(units) else None
    return receipt_of


def _row(j: Judgement, receipt: Receipt, h: bytes, archive: PolArchive) -> dict:
    distance = max((bits_float(d.rel_max_err_bits) or float("inf")
                    for d in j.evidence.distances), default=0.0)
    loss = None
    raw = archive.encoded(receipt.cert_hash)
    if raw is not None:
        try:
            loss = bits_float(decode_cert(raw).loss_bits)
        except PolError:
            pass
    return {"step": j.step, "index": j.index, "receipt": h.hex(), "worker": receipt.node_key.hex(),
            "reason": REASONS[j.reason], "passed": j.reason == PASS, "distance": distance,
            "detail": j.detail, "loss": loss}



async def export_op(archive: PolArchive | None, config_json: str, job_id: bytes | None,
                    args: dict) -> dict:
    """The node's ``pol_export`` control op: write a window file (`pnode pol export`).

    Args (of the op): ``out`` (a path the node may write), ``first`` (default: the
    oldest kept step), ``steps`` (default: every kept step from ``first``).

    Raises:
        WindowError: the node keeps nothing, or the arguments are wrong.
    """
    if archive is None or job_id is None or not archive.receipts():
        raise WindowError("this node keeps no units (it mines no job, or has run none "
                          "whose audit window is open)")
    kept = sorted(set(archive.receipts().values()))
    first, steps, out = args.get("first", kept[0]), args.get("steps"), args.get("out")
    steps = kept[-1] - first + 1 if steps is None else steps
    if not isinstance(out, str) or not out:
        raise WindowError('"out" must be the path of the file to write')
    if not (isinstance(first, int) and isinstance(steps, int) and first >= 0 and steps >= 1):
        raise WindowError('"first" and "steps" must be whole numbers (steps at least 1)')
    window = export_window(archive, config_json, job_id, first, steps)
    size = await trio.to_thread.run_sync(write_window, out, window)
    return {"path": out, "bytes": size, "units": len(window.receipts),
            "first_step": first, "steps": steps, "kept_steps": kept,
            "receipts_root": window.receipts_root.hex()}


#: A window file: this line, then frames of a 4-byte big-endian length and that many
#: bytes: the `PolWindow` without its tensors, then each tensor as a `NamedTensor`
#: (one codec object may not pass 32 MiB; a window of many steps does).
WINDOW_MAGIC = b"pnode-pol-window/1\n"


def write_window(path: str, window: PolWindow) -> int:
    """Write ``window`` to ``path`` through a temporary file (a reader never sees half).

    Returns:
        The file's size in bytes.
    """
    frames = [encode(replace(window, tensors=())), *(encode(t) for t in window.tensors)]
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(WINDOW_MAGIC)
        for frame in frames:
            f.write(len(frame).to_bytes(4, "big") + frame)
        f.flush()
        os.fsync(f.fileno())
        size = f.tell()
    os.replace(tmp, path)
    return size


def read_window(path: str) -> PolWindow:
    """The `PolWindow` of a window file.

    Raises:
        OSError: the file cannot be read.
        WindowError: it is not a window file.
    """
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(WINDOW_MAGIC):
        raise WindowError("not a window file (no pnode-pol-window/1 header)")
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
        return replace(head, tensors=tensors)
    except (DecodeError, ValueError) as exc:
        raise WindowError(f"not a window file: {exc}") from None
