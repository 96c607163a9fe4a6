"""The docs name only code that exists.

README.md, BENCHMARKS.md and specs/*.md cite this repository's code in two
ways, and both are checked here:

* a path ending in ``.py`` (``node/net/host.py``, ``bench/swarm_bench.py``,
  ``tests/proof_of_learning/test_step_plan.py``), anywhere in the text. A path with a
  folder must be a file of the repository; a bare file name
  (``test_wiretensor.py``) must be the name of some ``.py`` file in it. A test
  named after it (``test_wiretensor.py::test_zero_and_constant_blocks``, or
  ``test_blocks.py::test_head_groups…`` for every test with that prefix) must
  be defined in such a file.
* a dotted name inside backticks that starts with one of this repository's
  packages (``node.serve.sessions``, ``node.torch_thread.CLIENT_SPIN_COUNT``,
  ``compute.data.batch(config, t)``): the longest prefix that imports as a
  module must import, and the rest must be attributes of it, one after the
  other. A function or class cited as a module's must be defined there or
  re-exported on purpose (a package's, or in the module's ``__all__``), not
  merely imported: ``node.serve.sessions.tensor_work`` fails, as the name
  lives in `node.torch_thread`. Names of other projects (petals, libp2p,
  torch, transformers, trio, ...) start with no package of ours and are not
  checked.

When code moves, the docs move with it: BENCHMARKS.md is a history, but a
measurement of a module that moved cites the module's current home. Only
what no longer exists anywhere is exempt, in the allow-lists below, each
with its reason.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", ROOT / "BENCHMARKS.md", *(ROOT / "specs").glob("*.md")])

# Top-level folders of this repository that a cited path may start with, and
# the packages a dotted name is ours by.
LOCAL_DIRS = {"node", "wallet", "compute", "ledger", "proof_of_learning", "bench", "tests",
              "specs"}
PACKAGES = {"node", "wallet", "compute", "ledger", "proof_of_learning", "bench", "tests"}

# .py names cited in the docs that are not files of this repository.
EXTERNAL_PY = {
    "convert_hf_to_gguf.py",  # llama.cpp's HF -> GGUF converter (specs/compute.md)
}
# Dotted names of ours that no longer exist but stay in a historical record.
# Format: (doc file name, dotted name) -> why it is kept.
GONE_DOTTED: dict[tuple[str, str], str] = {}
# The same for .py paths.
GONE_PY: dict[tuple[str, str], str] = {}

# A .py path: segments of word characters, dots and dashes joined by '/',
# optionally followed by ::test_name (and an ellipsis for "every test so named").
PY_PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w-]+\.py)\b(?:::(\w+)(…|\.\.\.)?)?")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"(?<![\w./])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)")
# A dotted word that is a file name (`ledger.md`; the data dir's `node.addr`,
# `node.sock` and `node.key`), not a module.
FILE_SUFFIXES = {"md", "py", "json", "toml", "txt", "gguf", "safetensors", "yaml", "log", "csv",
                 "addr", "sock", "key"}


def _repo_py_files(root: Path) -> dict[str, list[Path]]:
    """Basename -> the repository's .py files of that name (no virtualenv, no build)."""
    names: dict[str, list[Path]] = {}
    for top in LOCAL_DIRS:
        for path in (root / top).rglob("*.py"):
            names.setdefault(path.name, []).append(path)
    return names


def _defines(paths: list[Path], name: str, prefix: bool) -> bool:
    end = "" if prefix else r"\b"
    pattern = re.compile(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(name)}{end}", re.M)
    return any(pattern.search(p.read_text(encoding="utf-8")) for p in paths)


def py_path_problems(doc: str, text: str, root: Path = ROOT) -> list[str]:
    """What is wrong with the .py paths cited in ``text`` (of the doc named ``doc``)."""
    files = _repo_py_files(root)
    problems = []
    for line_no, line in enumerate(text.splitlines(), 1):
        for m in PY_PATH.finditer(line):
            path, test, ellipsis = m.group(1), m.group(2), m.group(3)
            if path in EXTERNAL_PY or (doc, path) in GONE_PY:
                continue
            where = f"{doc}:{line_no}: {path}"
            if "/" in path:
                if path.split("/")[0] not in LOCAL_DIRS:
                    problems.append(f"{where}: not under a folder of this repository")
                    continue
                candidates = [root / path] if (root / path).is_file() else []
            else:
                candidates = files.get(path, [])
            if not candidates:
                problems.append(f"{where}: no such file")
            elif test and not _defines(candidates, test, prefix=bool(ellipsis)):
                problems.append(f"{where}::{test}: no such test")
    return problems


def _resolve(name: str) -> str | None:
    """None if ``name`` is a module or a chain of attributes of one, else why not."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        module_name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            # Only "this very prefix is not a module" moves on to a shorter one;
            # a module that fails to import its own dependency is a failure.
            if e.name is not None and (module_name == e.name
                                       or module_name.startswith(e.name + ".")):
                continue
            raise
        for j, attr in enumerate(parts[i:], i):
            owner = obj
            try:
                obj = getattr(obj, attr)
            except AttributeError:
                return f"{'.'.join(parts[:j])} has no attribute {attr!r}"
            home = getattr(obj, "__module__", None)
            if (j == i and isinstance(home, str) and home != owner.__name__
                    and not hasattr(owner, "__path__")
                    and attr not in getattr(owner, "__all__", ())):
                # Imported there, not defined or re-exported: cite its home.
                return f"{attr} lives in {home}, not in {owner.__name__}"
        return None
    return "no module"


def dotted_problems(doc: str, text: str) -> list[str]:
    """What is wrong with the dotted names of ours in ``text``'s code spans."""
    problems = []
    for line_no, line in enumerate(text.splitlines(), 1):
        for span in CODE_SPAN.finditer(line):
            for m in DOTTED.finditer(span.group(1)):
                name = m.group(1)
                if name.split(".")[0] not in PACKAGES or name.rsplit(".", 1)[1] in FILE_SUFFIXES:
                    continue
                if (doc, name) in GONE_DOTTED:
                    continue
                why = _resolve(name)
                if why is not None:
                    problems.append(f"{doc}:{line_no}: `{name}`: {why}")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_cited_py_paths_exist(doc: Path) -> None:
    problems = py_path_problems(doc.name, doc.read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_cited_modules_and_names_exist(doc: Path) -> None:
    problems = dotted_problems(doc.name, doc.read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


def test_the_checker_catches_made_up_references() -> None:
    text = (
        "The host lives in node/net/host.py, its tests in `tests/node/net/`; see\n"
        "test_wiretensor.py::test_zero_and_constant_blocks and `node.net.host`.\n"
        "Made up: node/host.py, nod/net/host.py, test_nowhere.py,\n"
        "test_wiretensor.py::test_not_a_test, `node.net.hots`, `node.torch_thread.no_such_name`,\n"
        "`compute.model.Block`, `ledger.nowhere.thing(x)` and `node.serve.sessions.tensor_work`\n"
        "(imported there, defined in node.torch_thread).\n"
        "Not ours, not checked: `torch.nn.Linear`, `trio.to_thread.run_sync`, specs/ledger.md.\n"
    )
    paths = py_path_problems("planted.md", text)
    assert [p.split(": ", 2)[1] for p in paths] == [
        "node/host.py", "nod/net/host.py", "test_nowhere.py", "test_wiretensor.py::test_not_a_test"]
    names = dotted_problems("planted.md", text)
    assert [n.split("`")[1] for n in names] == [
        "node.net.hots", "node.torch_thread.no_such_name", "compute.model.Block",
        "ledger.nowhere.thing",
        "node.serve.sessions.tensor_work"]


def test_wire_tags_are_stated_only_in_the_wire_table() -> None:
    """node.wire's docstring holds the one tag table; a module restating a range goes stale."""
    import ast

    stated = []
    for path in sorted((ROOT / "node" / "wire").glob("*.py")):
        if path.name == "__init__.py":
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        stated += [f"{path.relative_to(ROOT)}: {m.group(0)!r}"
                   for m in re.finditer(r"\btags?\s+\d+", doc)]
    assert not stated, "point to node.wire's table instead:\n" + "\n".join(stated)


def test_the_allow_lists_hold_only_what_is_needed() -> None:
    """An exemption whose citation left the docs, or whose file came back, must go."""
    texts = {doc.name: doc.read_text(encoding="utf-8") for doc in DOCS}
    every = "\n".join(texts.values())
    files = _repo_py_files(ROOT)
    for name in EXTERNAL_PY:
        assert name in every and name not in files, name
    for (doc, name) in [*GONE_DOTTED, *GONE_PY]:
        assert name in texts.get(doc, ""), (doc, name)
    for (doc, name) in GONE_PY:
        assert not (ROOT / name).is_file() and name not in files, (doc, name)
    for (doc, name) in GONE_DOTTED:
        assert _resolve(name) is not None, (doc, name)
