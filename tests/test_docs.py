"""The docs name only code that exists.

README.md, ARCHITECTURE.md, BENCHMARKS.md and specs/*.md cite this
repository's code in two ways, and both are checked here:

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

ARCHITECTURE.md also states the import layers: its tables marked
``<!-- layers: NAME -->`` must say what tests/test_layers.py enforces
(`layer_table_problems`), so a rule changed on one side only fails here;
and its "Packages and their rooms" must place every module
(`unplaced_modules`).
"""

from __future__ import annotations

import copy
import importlib
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import test_layers

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "BENCHMARKS.md",
               *(ROOT / "specs").glob("*.md")])

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


# -- ARCHITECTURE.md's layer tables against tests/test_layers.py ------------------------

ARCHITECTURE = ROOT / "ARCHITECTURE.md"
LAYER_MARK = re.compile(r"<!-- layers: (\w+) -->")
# What "everything" means in the node table: every module under node.
EVERYTHING = {"node"}
# The names of tests/test_layers.py that the tables state.
LAYER_RULES = ("PACKAGES", "PURE_CORE", "PURE_FORBIDDEN", "POL_FORBIDDEN", "STORAGE", "NETWORK",
               "CLI_MODULES", "PACKAGE_FORBIDDEN", "NODE_ALLOWED", "ALL_OF_NODE", "FREE_IN_NODE",
               "MODULE_ALLOWED", "SWARM_VIEW", "INFERENCE_WIRE", "DEEP_IMPORTS_ALLOWED",
               "UNIT_FORBIDDEN")


class TableError(LookupError):
    """A marked table, or a row of one, that is missing or malformed."""

    def __init__(self, table: str, problem: str):
        super().__init__(f"{table}: {problem}")


def marked_tables(text: str) -> dict[str, list[list[str]]]:
    """The body rows (their cells) of the table right after each ``<!-- layers: NAME -->``."""
    lines = text.splitlines()
    tables: dict[str, list[list[str]]] = {}
    for i, line in enumerate(lines):
        m = LAYER_MARK.fullmatch(line.strip())
        if m is None:
            continue
        if m.group(1) in tables:
            raise TableError(m.group(1), "two tables so marked")
        rows = []
        for row in lines[i + 1:]:
            if not row.startswith("|"):
                break
            rows.append([cell.strip() for cell in row.strip().strip("|").split("|")])
        tables[m.group(1)] = rows[2:]  # the header and its rule dropped
    return tables


def _names(cell: str) -> set[str]:
    """The names in a cell's code spans (a folder's trailing slash dropped)."""
    return {name.rstrip("/") for name in CODE_SPAN.findall(cell)}


def _keyed(rows: list[list[str]], table: str) -> dict[str, list[str]]:
    """Rows by the one name in their first cell; each name once."""
    keyed: dict[str, list[str]] = {}
    for row in rows:
        names = _names(row[0])
        if len(names) != 1 or len(row) < 2:
            raise TableError(table, f"a row must name one unit first: {row}")
        (name,) = names
        if name in keyed:
            raise TableError(table, f"{name} has two rows")
        keyed[name] = row
    return keyed


def layers_stated(text: str) -> dict[str, object]:
    """What ARCHITECTURE.md's marked tables say, in the terms of `layers_enforced`.

    Raises:
        TableError: a table or a row it needs is missing, or a row is malformed.
    """
    tables = marked_tables(text)

    def table(name: str) -> list[list[str]]:
        if name not in tables:
            raise TableError(name, f"no table marked <!-- layers: {name} -->")
        return tables[name]

    def layer(label: str) -> list[str]:
        rows = [row for row in table("LAYERS") if row[0] == label]
        if len(rows) != 1 or len(rows[0]) != 3:
            raise TableError("LAYERS", f"no single row {label!r} of three cells")
        return rows[0]

    def py(cell: str) -> set[str]:
        return {name for name in _names(cell) if name.endswith(".py")}

    pure, pol, tensor, storage, cli = (layer("L0 pure core"), layer("L0' unit of work"),
                                       layer("L0' tensor core"), layer("L1 storage"),
                                       layer("L3 CLI"))
    packages = _keyed(table("PACKAGE_FORBIDDEN"), "PACKAGE_FORBIDDEN")
    node = _keyed(table("NODE_ALLOWED"), "NODE_ALLOWED")
    exceptions: dict[str, list[set[str]]] = {}
    module_allowed: dict[str, set[str]] = {}
    for row in table("EXCEPTIONS"):
        if len(row) != 3:
            raise TableError("EXCEPTIONS", f"a row must have three cells: {row}")
        exceptions.setdefault(row[0], []).append(_names(row[2]))
        if row[0] == "MODULE_ALLOWED":  # the module is the first dotted name of its "what"
            module = next((n for n in CODE_SPAN.findall(row[1]) if "." in n), None)
            if module is None or module in module_allowed:
                raise TableError("EXCEPTIONS", f"MODULE_ALLOWED needs one row per module: {row}")
            module_allowed[module] = _names(row[2])

    def exception(name: str) -> set[str]:
        if len(exceptions.get(name, [])) != 1:
            raise TableError("EXCEPTIONS", f"no single row {name}")
        return exceptions[name][0]

    return {
        "PURE_CORE": py(pure[1]),
        "PURE_FORBIDDEN": _names(pure[2]),
        "POL_FORBIDDEN": _names(pure[2]) - _names(pol[2]),  # "the L0 list but ..."
        "tensor core forbidden": _names(tensor[2]),
        "STORAGE": py(storage[1]),
        "storage forbidden": _names(storage[2]),
        "CLI_MODULES": _names(cli[1]),
        "PACKAGE_FORBIDDEN": {p: _names(row[2]) for p, row in packages.items()},
        "package may import": {p: _names(row[1]) for p, row in packages.items()},
        "NODE_ALLOWED": {unit: EVERYTHING if row[1].startswith("everything") else _names(row[1])
                         for unit, row in node.items()},
        "FREE_IN_NODE": exception("FREE_IN_NODE"),
        "MODULE_ALLOWED": module_allowed,
        "SWARM_VIEW": exception("SWARM_VIEW"),
        "INFERENCE_WIRE": exception("INFERENCE_WIRE"),
        "DEEP_IMPORTS_ALLOWED": exception("DEEP_IMPORTS_ALLOWED"),
        "UNIT_FORBIDDEN": {unit: _names(row[1])
                           for unit, row in _keyed(table("UNIT_FORBIDDEN"),
                                                   "UNIT_FORBIDDEN").items()},
    }


def layers_enforced(rules=test_layers) -> dict[str, object]:
    """What tests/test_layers.py (or ``rules``, a stand-in with its names) enforces."""
    return {
        "PURE_CORE": set(rules.PURE_CORE),
        "PURE_FORBIDDEN": set(rules.PURE_FORBIDDEN),
        "POL_FORBIDDEN": set(rules.POL_FORBIDDEN),
        "tensor core forbidden": set(rules.NETWORK) | {"plyvel"},  # as `violations` says
        "STORAGE": set(rules.STORAGE),
        "storage forbidden": set(rules.NETWORK) | {"rich"},
        "CLI_MODULES": set(rules.CLI_MODULES) | {"node/cli"},  # and all of node/cli/
        "PACKAGE_FORBIDDEN": {p: set(f) for p, f in rules.PACKAGE_FORBIDDEN.items()},
        "package may import": {p: set(rules.PACKAGES) - set(f) - {p}
                               for p, f in rules.PACKAGE_FORBIDDEN.items()},
        "NODE_ALLOWED": {unit: EVERYTHING if set(allowed) == set(rules.ALL_OF_NODE)
                         else set(allowed) for unit, allowed in rules.NODE_ALLOWED.items()},
        "FREE_IN_NODE": set(rules.FREE_IN_NODE),
        "MODULE_ALLOWED": {m: set(a) for m, a in rules.MODULE_ALLOWED.items()},
        "SWARM_VIEW": set(rules.SWARM_VIEW),
        "INFERENCE_WIRE": {rules.INFERENCE_WIRE},
        "DEEP_IMPORTS_ALLOWED": set(rules.DEEP_IMPORTS_ALLOWED),
        "UNIT_FORBIDDEN": {u: set(f) for u, f in rules.UNIT_FORBIDDEN.items()},
    }


def _differences(doc: object, code: object) -> str:
    """What the doc says that the code does not, and the other way round."""
    if isinstance(doc, dict) and isinstance(code, dict):
        return "; ".join(f"{key}: {_differences(doc.get(key), code.get(key))}"
                         for key in sorted(doc.keys() | code.keys())
                         if doc.get(key) != code.get(key))
    if isinstance(doc, set) and isinstance(code, set):
        return (f"only in ARCHITECTURE.md {sorted(doc - code)}, "
                f"only in tests/test_layers.py {sorted(code - doc)}")
    return f"ARCHITECTURE.md {doc!r}, tests/test_layers.py {code!r}"


def layer_table_problems(text: str, rules=test_layers) -> list[str]:
    """Where ARCHITECTURE.md's layer tables (``text``) and ``rules`` disagree."""
    try:
        stated = layers_stated(text)
    except TableError as exc:
        return [str(exc)]
    enforced = layers_enforced(rules)
    return [f"{key}: {_differences(stated[key], want)}"
            for key, want in enforced.items() if stated[key] != want]


def test_architecture_states_the_enforced_layers() -> None:
    problems = layer_table_problems(ARCHITECTURE.read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


def test_the_layer_check_catches_a_change_on_either_side() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")

    def rules(change=lambda r: None) -> SimpleNamespace:
        copied = SimpleNamespace(**{name: copy.deepcopy(getattr(test_layers, name))
                                    for name in LAYER_RULES})
        change(copied)
        return copied

    def found(text: str, rules: SimpleNamespace) -> list[str]:
        return [p.split(":")[0] for p in layer_table_problems(text, rules)]

    assert found(text, rules()) == []
    # The code changes a rule, the doc does not.
    assert found(text, rules(lambda r: r.NODE_ALLOWED["node.chain"].add("node.serve"))) == [
        "NODE_ALLOWED"]
    assert found(text, rules(lambda r: r.NODE_ALLOWED.update({"node.http": set()}))) == [
        "NODE_ALLOWED"]
    assert found(text, rules(lambda r: r.PACKAGE_FORBIDDEN["node"].discard("wallet"))) == [
        "PACKAGE_FORBIDDEN", "package may import"]
    assert found(text, rules(lambda r: r.PURE_CORE.add("ledger/chaindb.py"))) == ["PURE_CORE"]
    assert found(text, rules(lambda r: r.MODULE_ALLOWED.update({"node.pol.window": {
        "node.mine"}}))) == ["MODULE_ALLOWED"]
    assert found(text, rules(lambda r: r.UNIT_FORBIDDEN["node.net"].add("ledger"))) == [
        "UNIT_FORBIDDEN"]
    assert found(text, rules(lambda r: setattr(r, "FREE_IN_NODE", r.FREE_IN_NODE - {
        "node.lazy"}))) == ["FREE_IN_NODE"]
    # The doc changes, the code does not.
    for old, new, where in [
        ("| `node.chain` | `node.net`, `node.wire`, `node.datadir` |",
         "| `node.chain` | `node.net`, `node.wire` |", "NODE_ALLOWED"),
        ("| `node.cli` | everything |", "| `node.cli` | `node.net` |", "NODE_ALLOWED"),
        ("| `proof_of_learning` | `compute`, `ledger` | `node`, `wallet` |",
         "| `proof_of_learning` | `compute`, `ledger` | `wallet` |", "PACKAGE_FORBIDDEN"),
        ("`ledger/tab.py`, ", "", "PURE_CORE"),
        ("| `node.torch_thread` | `libp2p`, `compute`, `ledger` |",
         "| `node.torch_thread` | `libp2p`, `compute` |", "UNIT_FORBIDDEN"),
        ("<!-- layers: EXCEPTIONS -->", "", "EXCEPTIONS"),
        ("| `node.mine` | `node.net`", "| `node.mine` | `node.net`, `node.pol`", "NODE_ALLOWED"),
    ]:
        assert old in text, old
        assert found(text.replace(old, new, 1), rules()) == [where], (old, new)


def unplaced_modules(text: str, root: Path = ROOT) -> list[str]:
    """The project's modules that ARCHITECTURE.md's "Packages and their rooms" leaves out.

    A module is placed when its dotted name (a yamux module: its package,
    `node.net.yamux`) is in a code span of that section.
    """
    section = text.split("\n## Packages and their rooms\n", 1)[-1].split("\n## ", 1)[0]
    placed = {name for span in CODE_SPAN.findall(section) for name in span.split()}
    missing = []
    for package in test_layers.PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if path.name in ("__init__.py", "__main__.py"):
                continue
            name = ".".join(path.relative_to(root).with_suffix("").parts[:3])
            if name not in placed and name not in missing:
                missing.append(name)
    return missing


def test_every_module_has_a_room() -> None:
    missing = unplaced_modules(ARCHITECTURE.read_text(encoding="utf-8"))
    assert not missing, "place these in ARCHITECTURE.md's rooms: " + ", ".join(missing)
    assert unplaced_modules(ARCHITECTURE.read_text(encoding="utf-8").replace(
        "`node.mine.parts`, ", "")) == ["node.mine.parts"]


def test_no_tracked_file_holds_a_merge_conflict():
    """A merge's conflict markers once landed in README.md and ARCHITECTURE.md unseen."""
    import subprocess
    root = Path(__file__).resolve().parents[1]
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True,
                             check=True).stdout.split()
    marked = []
    for name in tracked:
        path = root / name
        if path.suffix not in (".py", ".md", ".toml", ".txt", ".cfg", ".json") or not path.is_file():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if line.startswith(("<<<<<<< ", ">>>>>>> ")):
                marked.append(f"{name}:{n}")
    assert not marked, marked

