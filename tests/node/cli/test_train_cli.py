"""`pnode train`: the default job from the command line."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_loss_falls_on_generated_text(pnode):
    r = pnode("train", "--steps", "40", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert len(doc["losses"]) == 40
    assert doc["loss_last10_mean"] < doc["loss_first10_mean"] - 0.5  # measured: 3.95 -> ~3.1


def test_decomposed_matches_whole_model_step_for_step(pnode):
    whole = pnode("train", "--steps", "4", "--json").json()["losses"]
    parts = pnode("train", "--steps", "4", "--decomposed", "--sections", "2", "--json")
    assert parts.code == 0, parts.err
    assert parts.json()["losses"] == whole  # whole-layer sections: bit-identical


def test_user_text_file(pnode, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    r = pnode("train", "--data", str(text), "--steps", "20", "--json")
    assert r.code == 0 and r.json()["data"] == str(text)
    assert r.json()["loss_last"] < r.json()["loss_first"]


@pytest.mark.parametrize("content, message", [(b"", "empty"), (b"\xff\xfe", "not UTF-8")])
def test_bad_training_files_are_one_line_errors(pnode, tmp_path, content, message):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(content)
    r = pnode("train", "--data", str(bad), "--steps", "2")
    assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1


def test_missing_file_is_a_one_line_error(pnode, tmp_path):
    r = pnode("train", "--data", str(tmp_path / "nope.txt"), "--steps", "2")
    assert r.code == 2 and "cannot read" in r.err
