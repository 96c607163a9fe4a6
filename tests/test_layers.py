"""The import layers of DESIGN.md section 2, enforced on every module.

Every import statement (also those inside functions) of every module under
the five packages is checked against the rules below. A new module that
breaks a rule fails this test; a new pure-core module must be added to
PURE_CORE to be held to the strictest rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ledger", "compute", "proof_of_learning", "node", "wallet")

# L0: no clock, socket, file, process, thread, global RNG, network or storage.
PURE_CORE = {
    "ledger/codec.py", "ledger/crypto.py", "ledger/merkle.py", "ledger/types.py",
    "ledger/state.py", "ledger/schedule.py", "ledger/rules.py", "ledger/transition.py",
    "ledger/errors.py", "ledger/proofs.py", "compute/partition.py", "proof_of_learning/certificate.py",
    "wallet/route.py", "node/serve/placement.py",
}
PURE_FORBIDDEN = {
    "time", "datetime", "random", "secrets", "socket", "os", "pathlib", "io", "shutil",
    "tempfile", "subprocess", "threading", "multiprocessing", "asyncio", "trio", "libp2p",
    "plyvel", "click", "rich", "torch", "ledger.store", "ledger.chaindb", "ledger.schema",
}
STORAGE = {"ledger/store.py", "ledger/chaindb.py", "ledger/schema.py"}
NETWORK = {"trio", "libp2p", "socket", "click"}
CLI_MODULES = {"node/cli/pnode.py", "node/cli/common.py", "wallet/cli.py"}

# Between packages (DESIGN.md section 2).
PACKAGE_FORBIDDEN = {
    "ledger": {"compute", "proof_of_learning", "node", "wallet"},
    "compute": {"ledger", "proof_of_learning", "node", "wallet"},
    "proof_of_learning": {"node", "wallet"},
    "node": set(),
    "wallet": set(),
}


def imports_of(source: str, module: str) -> set[str]:
    """Absolute names of everything ``source`` imports (relative ones resolved)."""
    names: set[str] = set()
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def violations(relpath: str, source: str) -> list[str]:
    """Every layer rule that the module at ``relpath`` breaks."""
    module = relpath[:-3].replace("/", ".")
    package = relpath.split("/")[0]
    found = []
    for name in sorted(imports_of(source, module)):
        top = name.split(".")[0]

        def hits(forbidden: set[str]) -> bool:
            return any(name == f or name.startswith(f + ".") for f in forbidden)

        if top in PACKAGE_FORBIDDEN.get(package, set()):
            found.append(f"{relpath}: package {package} may not import {name}")
        if relpath in PURE_CORE and hits(PURE_FORBIDDEN):
            found.append(f"{relpath}: pure core may not import {name}")
        if relpath in STORAGE and hits(NETWORK | {"rich"}):
            found.append(f"{relpath}: storage layer may not import {name}")
        if package == "compute" and hits(NETWORK | {"plyvel"}):
            found.append(f"{relpath}: tensor core may not import {name}")
        if package in ("node", "wallet") and relpath not in CLI_MODULES and hits({"click"}):
            found.append(f"{relpath}: only the CLI modules may import {name}")
    return found


def project_modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", project_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_respects_the_layers(path):
    relpath = str(path.relative_to(ROOT))
    assert violations(relpath, path.read_text()) == []


@pytest.mark.parametrize("relpath, source", [
    ("ledger/state.py", "import time"),
    ("ledger/merkle.py", "from random import random"),
    ("ledger/types.py", "def f():\n    import trio"),
    ("ledger/transition.py", "from .store import MemoryStore"),
    ("ledger/chaindb.py", "import libp2p"),
    ("ledger/state.py", "from compute import model"),
    ("compute/model.py", "from ..ledger import types"),
    ("compute/model.py", "import trio"),
    ("proof_of_learning/verify.py", "from node import host"),
    ("node/serve/layer_server.py", "import click"),
])
def test_checker_catches_violations(relpath, source):
    assert violations(relpath, source), f"{source!r} in {relpath} should be refused"


def test_checker_allows_the_permitted():
    assert violations("ledger/state.py", "from ledger import merkle\nimport msgpack") == []
    assert violations("node/cli/pnode.py", "import click\nfrom ledger import chaindb") == []
    assert violations("proof_of_learning/verify.py", "from compute import model") == []
