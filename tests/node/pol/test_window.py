"""node.pol.window and node.pol.windowcheck: a worker's steps exported as one file, every byte
of it checked against its job and receipts, then re-judged offline.

An honest window passes unit by unit; a cheater's fails with its reasons.
Any edit to the file (a tensor's bytes, a named set, a certificate, the
job's config, a receipt, an extra item) is refused by `pnode verify cert`
with the field named, before any re-execution (a tampered tensor that a
matching re-run never reads used to pass); junk is a clear `WindowError`.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from compute.jobfile import config_json
from compute.wiretensor import decode_tensor, encode_tensor
from ledger.codec import decode, encode
from ledger.crypto import SigningKey
from ledger.types import Job, Receipt, sign, tx_hash
from node.pol.attacks import WorkerAttack
from node.pol.window import (
    WINDOW_MAGIC, WindowError, decode_window, encode_window, export_window, read_window,
    verify_window, write_window,
)
from node.pol.windowcheck import check_window
from node.wire import NamedSet, NamedTensor, PolWindow
from proof_of_learning.certificate import decode_cert, digest_map
from proof_of_learning.units import config_of, hyper_hash, job_tx, tensor_digest
from tests.node.pol.polkit import make_worker, run_step

CREATOR = SigningKey(b"\x07" * 32)  # the job's creator: it signs the Job transaction


def signed_worker(attack: str | None = None, steps: int = 2):
    """A worker's ``steps`` steps of a real job (cheating as ``attack`` says), its receipts
    signed; and the job's signed transaction, whose hash the receipts name."""
    w = make_worker(2)
    job = job_tx(w.config, "test", CREATOR, 0)
    w.job_id = tx_hash(job)
    run = None if attack is None else WorkerAttack(attack).run_phase(w.plan)
    for t in range(steps):
        run_step(w, t, run)
    return w, job


def window_file(w, job, first=0, steps=2) -> PolWindow:
    """The exported window, through a file's bytes."""
    window = export_window(w.archive, job, first, steps)
    data = encode_window(window)
    back = decode_window(data)
    assert back == window and encode_window(back) == data  # one encoding per window
    return back


@functools.cache
def honest() -> tuple[PolWindow, bytes]:
    """An honest worker's window of two steps, and its file's bytes (built once)."""
    window = window_file(*signed_worker())
    return window, encode_window(window)


def test_an_honest_window_passes_every_byte_and_every_unit_step_by_step(tmp_path):
    w, job = signed_worker()
    window = window_file(w, job)
    path = tmp_path / "w.pol"
    assert write_window(str(path), window) == path.stat().st_size
    assert read_window(str(path)) == window
    report = verify_window(window)
    assert report.passed and report.problems == []
    assert [(u["step"], u["index"]) for u in report.units] == sorted(w.receipts)
    steps = report.per_step()
    assert [s["step"] for s in steps] == [0, 1] and all(s["failed"] == 0 for s in steps)
    assert all(s["loss"] is not None for s in steps)  # the last forward's committed loss


def test_a_cheaters_window_is_intact_and_fails_with_its_reasons():
    window = window_file(*signed_worker("scaled-gradients"))
    assert check_window(window).problems == []  # the file is what its worker signed
    report = verify_window(window)
    assert not report.passed
    assert {u["reason"] for u in report.units} == {"pass", "gradient mismatch"}
    assert max(u["distance"] for u in report.units) > 0.5  # x0.01: far beyond 1e-4


def test_a_window_of_one_step_holds_only_that_step():
    w, job = signed_worker()
    window = window_file(w, job, first=1, steps=1)
    report = verify_window(window)
    assert report.passed and {u["step"] for u in report.units} == {1}
    with pytest.raises(WindowError, match="keeps no unit of steps 5..6"):
        export_window(w.archive, job, 5, 2)
    # A span the archive keeps only part of shrinks to that part (the file's span is checked).
    wide = window_file(w, job, first=1, steps=9)
    assert (wide.first_step, wide.steps) == (1, 1) and verify_window(wide).problems == []


# -- any edit is refused, the field named -------------------------------------------------


def refused(pnode, tmp_path, window: PolWindow, *fields: str) -> list[dict]:
    """`pnode verify cert` on ``window``'s file: exit 1, a failed check naming each of
    ``fields`` (a prefix of the field), no unit re-executed."""
    path = tmp_path / "t.pol"
    write_window(str(path), window)
    r = pnode("verify", "cert", str(path), "--json")
    assert r.code == 1, r.err
    out = r.json()
    assert not out["passed"] and out["units"] == [] and out["problems"]
    for f in fields:
        assert any(p["field"].startswith(f) for p in out["problems"]), (f, out["problems"])
    return out["problems"]


def certs(window: PolWindow):
    return [decode_cert(raw) for raw in window.objects]


def tensor_index(window: PolWindow, digest: bytes) -> int:
    return [t.name for t in window.tensors].index(digest.hex())


def with_tensor(window: PolWindow, i: int, data: bytes) -> PolWindow:
    t = window.tensors[i]
    return replace(window, tensors=window.tensors[:i] + (NamedTensor(t.name, data),)
                   + window.tensors[i + 1:])


def nudged(data: bytes) -> bytes:
    """The same tensor with one element changed by far less than the tolerance."""
    x = decode_tensor(data).clone()
    x.view(-1)[0] += 1e-6 * max(1.0, float(x.abs().max()))
    return encode_tensor(x)


def test_a_gradient_tensors_edited_bytes_are_refused(pnode, tmp_path):
    window, _ = honest()
    grads = {c.grads_hash for c in certs(window)}
    digest = next(s.digests[0] for s in window.named if s.key in grads)
    i = tensor_index(window, digest)
    problems = refused(pnode, tmp_path, with_tensor(window, i, nudged(window.tensors[i].data)),
                       f"tensors[{i}] (digest {digest.hex()[:16]}..)")
    assert problems[0]["detail"].startswith("its bytes hash to ")


def test_an_output_tensors_edited_bytes_are_refused(pnode, tmp_path):
    window, _ = honest()
    digest = digest_map(certs(window)[0].outputs)["y"]
    i = tensor_index(window, digest)
    refused(pnode, tmp_path, with_tensor(window, i, nudged(window.tensors[i].data)),
            f"tensors[{i}]")
    # The same values in another codec: not the tensor's canonical encoding.
    x = decode_tensor(window.tensors[i].data).to(torch.float16).to(torch.float32)
    exact = replace(window, tensors=tuple(
        NamedTensor(tensor_digest(x).hex() if k == i else t.name,
                    encode_tensor(x, "fp16") if k == i else t.data)
        for k, t in enumerate(window.tensors)))
    assert [p.detail for p in check_window(exact).problems if p.field.startswith(
        f"tensors[{i}]")][0] == "not its tensor's canonical (raw) encoding"


def test_an_edited_named_set_is_refused(pnode, tmp_path):
    window, _ = honest()
    s = window.named[0]
    other = window.named[1].digests[0]
    edited = NamedSet(s.key, s.names, (other,) + s.digests[1:])
    problems = refused(pnode, tmp_path, replace(window, named=(edited,) + window.named[1:]),
                       "named[0]")
    assert "hash to" in problems[0]["detail"]
    rekeyed = NamedSet(bytes(31) + b"\x01", s.names, s.digests)  # committed by no certificate
    problems = refused(pnode, tmp_path, replace(window, named=(rekeyed,) + window.named[1:]),
                       "named[0]")
    assert any("extra set" in p["detail"] for p in problems)


def test_an_edited_certificate_is_refused(pnode, tmp_path):
    window, _ = honest()
    cert = certs(window)[1]
    forged = encode(replace(cert, grad_norm_bits=cert.grad_norm_bits ^ 1))
    problems = refused(pnode, tmp_path,
                       replace(window, objects=(window.objects[0], forged) + window.objects[2:]),
                       "objects[1]")
    assert "not receipts[1]'s cert_hash" in problems[0]["detail"]


@pytest.mark.parametrize("change", [{"lr": 1e-3}, {"weight_decay": 0.5}, {"steps": 3}])
def test_a_replaced_config_is_refused(pnode, tmp_path, change):
    """The config is the job's spec: edited there, the job no longer hashes to the job id;
    re-signed by another key with its hyper_hash made right, still not; with the job id
    replaced as well, the receipts name another job."""
    window, _ = honest()
    job = decode(window.job, Job)
    config = replace(config_of(job), **change)
    spec = config_json(config).encode()
    edited = replace(job, spec=spec)
    problems = refused(pnode, tmp_path, replace(window, job=encode(edited)),
                       "job", "job.signature", "job.hyper_hash")
    assert "not the window's job_id" in problems[0]["detail"]
    key = SigningKey(b"\x66" * 32)
    resigned = sign(replace(edited, creator=key.public, hyper_hash=hyper_hash(config),
                            steps=config.steps), key)
    problems = refused(pnode, tmp_path, replace(window, job=encode(resigned)), "job")
    assert [p["field"] for p in problems] == ["job"]
    refused(pnode, tmp_path, replace(window, job=encode(resigned), job_id=tx_hash(resigned)),
            "receipts[0].job_id", "receipts[1].job_id")


def test_an_edited_job_or_job_id_is_refused(pnode, tmp_path):
    window, _ = honest()
    job = decode(window.job, Job)
    refused(pnode, tmp_path, replace(window, job=encode(replace(job, deposit=5))), "job")
    refused(pnode, tmp_path, replace(window, job_id=b"\x01" * 32), "job", "receipts[0].job_id")
    refused(pnode, tmp_path, replace(window, job=b"\x00junk"), "job")


def test_an_edited_receipt_or_root_or_span_is_refused(pnode, tmp_path):
    window, _ = honest()
    other = decode(window.receipts[0], Receipt)
    forged = replace(other, output_hash=b"\x09" * 32)  # the signature no longer holds
    problems = refused(pnode, tmp_path,
                       replace(window, receipts=(encode(forged),) + window.receipts[1:]),
                       "receipts[0] (", "receipts_root")
    assert any("not its worker's signature" in p["detail"] for p in problems)
    refused(pnode, tmp_path, replace(window, receipts_root=b"\x02" * 32), "receipts_root")
    refused(pnode, tmp_path, replace(window, first_step=1, steps=1), "first_step")
    refused(pnode, tmp_path, replace(window, steps=3), "steps")
    refused(pnode, tmp_path, replace(window, receipts=window.receipts[1:]), "objects",
            "receipts_root")


def test_an_extra_unreferenced_item_is_refused(pnode, tmp_path):
    window, _ = honest()
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    extra = NamedTensor(tensor_digest(x).hex(), encode_tensor(x))
    n = len(window.tensors)
    problems = refused(pnode, tmp_path, replace(window, tensors=window.tensors + (extra,)),
                       f"tensors[{n}]")
    assert "extra tensor" in problems[0]["detail"]
    problems = refused(pnode, tmp_path,
                       replace(window, tensors=window.tensors + window.tensors[:1]),
                       f"tensors[{n}]")
    assert "a second copy of tensors[0]" in problems[0]["detail"]
    refused(pnode, tmp_path, replace(window, objects=window.objects + window.objects[:1]),
            f"objects[{len(window.objects)}]")
    refused(pnode, tmp_path, replace(window, named=window.named + window.named[:1]),
            f"named[{len(window.named)}]")


def test_the_text_output_names_the_field(pnode, tmp_path):
    window, _ = honest()
    i = 0
    path = tmp_path / "t.pol"
    write_window(str(path), with_tensor(window, i, nudged(window.tensors[i].data)))
    r = pnode("verify", "cert", str(path))
    assert r.code == 1
    assert f"FAIL tensors[0] (digest {window.tensors[0].name[:16]}..): its bytes hash to" in r.out
    assert "no unit re-executed" in r.out


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(section=st.sampled_from(["header", "tensors"]), at=st.floats(0, 1, exclude_max=True),
       flip=st.integers(1, 255))
def test_any_single_flipped_byte_fails(section, at, flip):
    """A file with any one byte changed does not decode, or fails a byte check."""
    _, data = honest()
    tensors_at = len(WINDOW_MAGIC) + 4 + int.from_bytes(data[len(WINDOW_MAGIC):][:4], "big")
    lo, hi = (0, tensors_at) if section == "header" else (tensors_at, len(data))
    i = lo + int(at * (hi - lo))
    changed = data[:i] + bytes([data[i] ^ flip]) + data[i + 1:]
    try:
        window = decode_window(changed)
    except WindowError:
        return
    assert check_window(window).problems


def test_an_untouched_file_through_the_cli_passes(pnode, tmp_path):
    window, data = honest()
    (tmp_path / "w.pol").write_bytes(data)
    r = pnode("verify", "cert", str(tmp_path / "w.pol"), "--json")
    assert r.code == 0, r.out + r.err
    out = r.json()
    assert out["passed"] and out["problems"] == [] and len(out["units"]) == len(window.receipts)


# -- files that cannot be checked -----------------------------------------------------------


def test_a_file_that_is_not_a_window_is_a_clear_error(tmp_path):
    for junk, why in ((b"hello", "no pnode-pol-window/2 header"),
                      (b"pnode-pol-window/2\n\x00\x00\x00\x09abc", "runs past the end"),
                      (b"pnode-pol-window/2\n", "no header frame"),
                      (b"pnode-pol-window/2\n\x00\x00\x00\x01\xc1", "not a window file"),
                      (b"pnode-pol-window/1\n\x00\x00\x00\x01\xc1", "a version 1 window file")):
        (tmp_path / "j.pol").write_bytes(junk)
        with pytest.raises(WindowError, match=why):
            read_window(str(tmp_path / "j.pol"))


def test_an_undecodable_or_old_file_exits_2_on_one_line(pnode, tmp_path):
    window, data = honest()
    for name, body, why in (
            ("old.pol", b"pnode-pol-window/1\n" + data[len(WINDOW_MAGIC):], "version 1"),
            ("cut.pol", data[:-3], "runs past the end")):
        (tmp_path / name).write_bytes(body)
        r = pnode("verify", "cert", str(tmp_path / name))
        assert r.code == 2 and why in r.err and r.err.count("\n") == 1, r.err
    # Tensors inside the header frame would go unread beside the frames: refused.
    head = encode(window)
    (tmp_path / "in_head.pol").write_bytes(WINDOW_MAGIC + len(head).to_bytes(4, "big") + head)
    r = pnode("verify", "cert", str(tmp_path / "in_head.pol"))
    assert r.code == 2 and "header frame carries tensors" in r.err, r.err
