"""node.pol.window: a worker's steps exported as one file and re-judged offline.

An honest window passes unit by unit; a cheater's fails with its reasons; a
file whose receipts were changed fails on the root or the signatures; junk
is a clear `WindowError`.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ledger.codec import decode, encode
from ledger.types import Receipt
from compute.jobfile import config_json
from node.pol.attacks import WorkerAttack
from node.pol.window import (
    WindowError, export_window, read_window, verify_window, write_window,
)
from node.wire import PolWindow
from tests.node.pol.polkit import JOB, make_worker, run_step

def signed_worker(attack: str | None = None, steps: int = 2):
    """A worker's ``steps`` steps (cheating as ``attack`` says), its receipts signed."""
    w = make_worker(2)
    run = None if attack is None else WorkerAttack(attack).run_phase(w.plan)
    for t in range(steps):
        run_step(w, t, run)
    return w


def window_file(w, first=0, steps=2) -> PolWindow:
    """The exported window, through a file's bytes."""
    import tempfile
    window = export_window(w.archive, config_json(w.config), JOB, first, steps)
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/w.pol"
        write_window(path, window)
        back = read_window(path)
    assert back == window
    return back


def test_an_honest_window_passes_every_unit_step_by_step():
    w = signed_worker()
    report = verify_window(window_file(w))
    assert report.passed and report.root_ok and report.signatures_ok
    assert [(u["step"], u["index"]) for u in report.units] == sorted(w.receipts)
    steps = report.per_step()
    assert [s["step"] for s in steps] == [0, 1] and all(s["failed"] == 0 for s in steps)
    assert all(s["loss"] is not None for s in steps)  # the last forward's committed loss


def test_a_cheaters_window_fails_with_its_reasons():
    report = verify_window(window_file(signed_worker("scaled-gradients")))
    assert not report.passed
    assert {u["reason"] for u in report.units} == {"pass", "gradient mismatch"}
    assert max(u["distance"] for u in report.units) > 0.5  # x0.01: far beyond 1e-4


def test_a_window_of_one_step_holds_only_that_step():
    w = signed_worker()
    report = verify_window(window_file(w, first=1, steps=1))
    assert report.passed and {u["step"] for u in report.units} == {1}
    with pytest.raises(WindowError, match="keeps no unit of steps 5..6"):
        export_window(w.archive, config_json(w.config), JOB, 5, 2)


def test_changed_receipts_break_the_root_or_the_signatures():
    w = signed_worker()
    window = window_file(w)
    other = decode(window.receipts[0], Receipt)
    forged = replace(other, output_hash=b"\x09" * 32)  # the signature no longer holds
    report = verify_window(replace(window, receipts=(encode(forged),) + window.receipts[1:]))
    assert not report.passed and not report.signatures_ok and not report.root_ok


def test_a_file_that_is_not_a_window_is_a_clear_error(tmp_path):
    for junk, why in ((b"hello", "no pnode-pol-window/1 header"),
                      (b"pnode-pol-window/1\n\x00\x00\x00\x09abc", "runs past the end"),
                      (b"pnode-pol-window/1\n", "no header frame"),
                      (b"pnode-pol-window/1\n\x00\x00\x00\x01\xc1", "not a window file")):
        (tmp_path / "j.pol").write_bytes(junk)
        with pytest.raises(WindowError, match=why):
            read_window(str(tmp_path / "j.pol"))


def test_junk_is_a_clear_window_error():
    window = window_file(signed_worker(steps=1), steps=1)
    with pytest.raises(WindowError, match="job config"):
        verify_window(replace(window, config="{not json"))
    with pytest.raises(WindowError, match="not a window file"):
        verify_window(replace(window, objects=(b"\x00junk",)))
