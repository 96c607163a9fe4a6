"""The import layers of ARCHITECTURE.md, enforced on every module.

Every import statement (also those inside functions and under
TYPE_CHECKING) of every module under the five packages is checked against
the rules below: between packages, inside the pure core and storage, and
between node's sub-packages (`NODE_ALLOWED`). A new module that breaks a
rule fails this test; a new pure-core module must be added to PURE_CORE to
be held to the strictest rule. `test_no_import_circle` checks that the
modules' imports form a DAG.
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
    "ledger/errors.py", "ledger/proofs.py", "compute/partition.py",
    "proof_of_learning/certificate.py",
    "wallet/client/route.py", "node/serve/placement.py", "ledger/genesis.py", "ledger/tab.py",
    "ledger/tabrules.py", "ledger/accounts.py", "ledger/jobrules.py", "proof_of_learning/kinds.py",
    "ledger/audit.py", "ledger/records.py", "ledger/vrf.py", "ledger/beacon.py",
    "ledger/auditrules.py", "ledger/standing.py", "ledger/spot.py",
    "ledger/spotrules.py",
}
PURE_FORBIDDEN = {
    "time", "datetime", "random", "secrets", "socket", "os", "pathlib", "io", "shutil",
    "tempfile", "subprocess", "threading", "multiprocessing", "asyncio", "trio", "libp2p",
    "plyvel", "click", "rich", "torch", "ledger.store", "ledger.chaindb", "ledger.schema",
}
# The unit of work and its verification (proof_of_learning): pure but for torch.
POL_FORBIDDEN = PURE_FORBIDDEN - {"torch"}
STORAGE = {"ledger/store.py", "ledger/chaindb.py", "ledger/schema.py"}
NETWORK = {"trio", "libp2p", "socket", "click"}
CLI_MODULES = {"wallet/cli"}  # every module under it, and under node/cli/

# Between packages (ARCHITECTURE.md, the layers).
PACKAGE_FORBIDDEN = {
    "ledger": {"compute", "proof_of_learning", "node", "wallet"},
    "compute": {"ledger", "proof_of_learning", "node", "wallet"},
    "proof_of_learning": {"node", "wallet"},
    "node": {"wallet"},
    "wallet": set(),
}


# Inside node: what each unit (a sub-package, or a module of node's root) may
# import of node, besides itself and FREE_IN_NODE (the root exception, the clock).
NODE_SUBPACKAGES = ("net", "wire", "chain", "serve", "mine", "pol", "cli", "control",
                    "datadir")
FREE_IN_NODE = {"node.errors", "node.clock", "node.lazy"}
ALL_OF_NODE = {"node"}
NODE_ALLOWED = {
    "node.errors": set(),
    "node.clock": set(),
    "node.lazy": set(),
    "node.wire": set(),
    "node.net": set(),
    "node.torch_thread": set(),
    "node.datadir": set(),
    "node.chain": {"node.net", "node.wire", "node.datadir"},
    "node.serve": {"node.net", "node.wire", "node.torch_thread"},
    "node.mine": {"node.net", "node.wire", "node.chain", "node.torch_thread"},
    "node.pol": {"node.net", "node.wire", "node.chain", "node.torch_thread"},
    "node.node": ALL_OF_NODE,
    "node.control": ALL_OF_NODE,
    "node.cli": ALL_OF_NODE,
    "wallet": {"node.net", "node.wire"},
    "wallet.client": {"node.net", "node.wire", "node.torch_thread", "node.serve"},
    "wallet.cli": {"node.net", "node.wire", "node.datadir", "node.torch_thread", "node.serve",
                   "node.control", "node.cli.common"},
}
# Single modules allowed more than their unit: the job runner builds each job's verifier,
# so it alone of node.mine takes node.pol (the miner takes PoL's parts as Protocols,
# `node.mine.parts`).
MODULE_ALLOWED = {"node.mine.runner": {"node.pol"}}
# The read-only swarm view: all the wallet may take of node.serve.
SWARM_VIEW = {"SwarmView", "fetch_view", "announce_peer"}
# The inference protocol's messages: only wallet.client speaks them on the wallet's side.
INFERENCE_WIRE = "node.wire.serve"
# Modules another unit may import by their own name, not through a package's __init__.
DEEP_IMPORTS_ALLOWED = {"node.cli.common"}
# What a unit may not import from outside the project.
UNIT_FORBIDDEN = {
    "node.wire": {"trio", "libp2p", "torch", "compute", "plyvel", "ledger.store",
                  "ledger.chaindb", "ledger.schema", "ledger.state", "ledger.rules",
                  "ledger.transition", "ledger.merkle", "ledger.proofs"},
    "node.net": {"torch", "compute", "plyvel"},
    "node.datadir": {"trio", "libp2p", "torch", "compute"},
    "node.torch_thread": {"libp2p", "compute", "ledger"},
    "node.chain": {"torch", "compute"},
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
            imported = {f"{base}.{alias.name}" for alias in node.names}
            names.update(imported)
            if not all(is_module(name) for name in imported):  # ``from pkg import mod``: mod
                names.add(base)
    return names


def unit_of(module: str) -> str:
    """The unit of node's table that ``module`` belongs to (a sub-package, or itself)."""
    parts = module.split(".")
    if parts[0] == "node" and len(parts) > 2 and parts[1] in NODE_SUBPACKAGES:
        return f"node.{parts[1]}"
    if parts[0] == "wallet":
        if module == "wallet.cli" or module.startswith("wallet.cli."):
            return "wallet.cli"
        return "wallet.client" if module.startswith("wallet.client") else "wallet"
    return module


def under(name: str, prefixes: set[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def is_module(name: str) -> bool:
    """True when ``name`` is a module or package of the tree (not a name inside one)."""
    path = ROOT / name.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def node_violations(relpath: str, module: str, names: set[str]) -> list[str]:
    """The rules of node's sub-package table that ``module`` breaks."""
    unit = unit_of(module)
    if unit not in NODE_ALLOWED:
        return [f"{relpath}: {unit} has no row in NODE_ALLOWED"] if module.startswith("node.") else []
    found = []
    allowed = NODE_ALLOWED[unit] | {unit} | FREE_IN_NODE | MODULE_ALLOWED.get(module, set())
    for name in sorted(names):
        if under(name, UNIT_FORBIDDEN.get(unit, set())):
            found.append(f"{relpath}: {unit} may not import {name}")
        if unit == "wallet" and speaks_inference(name):
            found.append(f"{relpath}: only wallet.client speaks the inference protocol ({name})")
        if not name.startswith("node.") or under(name, {unit}):
            continue
        target = unit_of(name)
        if not under(name, allowed):
            found.append(f"{relpath}: {unit} may not import {name}")
        elif target.count(".") == 1 and target.split(".")[1] in NODE_SUBPACKAGES:
            inner = name[len(target) + 1:].split(".")[0]
            if inner and is_module(f"{target}.{inner}") and not under(name, DEEP_IMPORTS_ALLOWED):
                found.append(f"{relpath}: import {name} through {target}'s __init__")
            elif unit.startswith("wallet") and target == "node.serve" and inner \
                    and inner not in SWARM_VIEW:
                found.append(f"{relpath}: the wallet takes only the swarm view of node.serve, "
                             f"not {name}")
    return found


def speaks_inference(name: str) -> bool:
    """Whether importing ``name`` takes the inference protocol's messages."""
    if under(name, {INFERENCE_WIRE}):
        return True
    package, _, attribute = name.rpartition(".")
    return package == "node.wire" and lazy_homes("node.wire").get(attribute) == INFERENCE_WIRE


def violations(relpath: str, source: str) -> list[str]:
    """Every layer rule that the module at ``relpath`` breaks."""
    module = relpath[:-3].replace("/", ".").removesuffix(".__init__")
    package = relpath.split("/")[0]
    found = []
    names = imports_of(source, module)
    for name in sorted(names):
        top = name.split(".")[0]

        def hits(forbidden: set[str]) -> bool:
            return any(name == f or name.startswith(f + ".") for f in forbidden)

        if top in PACKAGE_FORBIDDEN.get(package, set()):
            found.append(f"{relpath}: package {package} may not import {name}")
        if relpath in PURE_CORE and hits(PURE_FORBIDDEN):
            found.append(f"{relpath}: pure core may not import {name}")
        if package == "proof_of_learning" and hits(POL_FORBIDDEN):
            found.append(f"{relpath}: proof_of_learning is pure and may not import {name}")
        if relpath in STORAGE and hits(NETWORK | {"rich"}):
            found.append(f"{relpath}: storage layer may not import {name}")
        if package == "compute" and hits(NETWORK | {"plyvel"}):
            found.append(f"{relpath}: tensor core may not import {name}")
        if package in ("node", "wallet") and hits({"click"}) \
                and not relpath.startswith(tuple(f"{d}/" for d in CLI_MODULES | {"node/cli"})):
            found.append(f"{relpath}: only the CLI modules may import {name}")
    if package in ("node", "wallet"):
        found += node_violations(relpath, module, names)
    return found


def lazy_homes(package: str) -> dict[str, str]:
    """Name -> module of a package whose ``__init__`` re-exports lazily (`node.lazy`)."""
    init = ROOT / package.replace(".", "/") / "__init__.py"
    homes: dict[str, str] = {}
    for node in ast.walk(ast.parse(init.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "lazy_exports":
            for module, names in ast.literal_eval(node.args[1]).items():
                homes.update(dict.fromkeys(names, module))
    return homes


def module_graph() -> dict[str, set[str]]:
    """Each project module -> the project modules it imports (type-only imports included).

    ``from a.b import c`` depends on ``a.b.c`` when that is a module, else
    on ``a.b`` (a module, or a package's ``__init__``), or, where ``a.b``
    re-exports ``c`` lazily, on the module ``c`` comes from.
    """
    graph: dict[str, set[str]] = {}
    for path in project_modules():
        relpath = str(path.relative_to(ROOT))
        module = relpath[:-3].replace("/", ".").removesuffix(".__init__")
        deps = set()
        for name in imports_of(path.read_text(), module):
            attribute = ""
            while name and not is_module(name):
                name, _, attribute = name.rpartition(".")
            name = lazy_homes(name).get(attribute, name) if name and attribute \
                and (ROOT / name.replace(".", "/") / "__init__.py").is_file() else name
            if name and name.split(".")[0] in PACKAGES and name != module:
                deps.add(name)
        graph[module] = deps
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


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
    ("proof_of_learning/judge.py", "from node.pol.fetch import PolFetcher"),
    ("proof_of_learning/judge.py", "import trio"),
    ("proof_of_learning/step_plan.py", "import time"),
    ("proof_of_learning/replay.py", "from pathlib import Path"),
    ("proof_of_learning/kinds.py", "import torch"),
    ("node/pol/verifier.py", "from node.mine.miner import Miner"),
    ("node/pol/window.py", "from node.mine import job_to_mine"),
    ("wallet/payer.py", "from node.wire import OpenSession"),
    ("wallet/light.py", "from node.wire.serve import Step"),
    ("wallet/registry.py", "from node.serve import SwarmView"),
    ("node/serve/layer_server.py", "import click"),
    ("node/node.py", "from wallet import remote"),
    # node's sub-package table
    ("node/wire/serve.py", "import trio"),
    ("node/wire/train.py", "import torch"),
    ("node/wire/sync.py", "from ledger.transition import MAX_BLOCK_BYTES"),
    ("node/wire/sync.py", "from node.net import Host"),
    ("node/net/host.py", "from node.datadir import DataDir"),
    ("node/net/identity.py", "from node.datadir import read_seed_file"),
    ("node/datadir/keys.py", "from node.net import PeerIdentity"),
    ("node/datadir/layout.py", "import trio"),
    ("node/mine/miner.py", "from node.pol import PolArchive"),
    ("node/mine/transfer.py", "from node.pol.archive import PolArchive"),
    ("node/net/peers.py", "from node.chain import ChainService"),
    ("node/cli/pnode.py", "from node.datadir.keys import read_seed_file"),
    ("node/torch_thread.py", "from node.serve import LayerServer"),
    ("node/chain/sync.py", "import torch"),
    ("node/chain/sync.py", "def f():\n    from compute import model"),
    ("node/chain/sync.py", "from node.serve import Announcer"),
    ("node/chain/sync.py", "from node.torch_thread import run_sync"),
    ("node/serve/swarm.py", "from node.chain import ChainService"),
    ("node/serve/swarm.py", "from node.mine import Miner"),
    ("node/serve/swarm.py", "from node.datadir import DataDir"),
    ("node/serve/swarm.py", "from node.control import control_call"),
    ("node/mine/miner.py", "from node.serve import LayerServer"),
    ("node/mine/miner.py", "from node.control import control_call"),
    ("node/mine/miner.py", "from node.cli import common"),
    ("node/datadir/layout.py", "from node.chain import ChainService"),
    ("node/node.py", "from node.chain.sync import ChainService"),
    ("node/node.py", "from .chain.sync import ChainService"),
    ("wallet/client/session.py", "from node.net.host import Host"),
    ("wallet/client/remote.py", "from node.chain import ChainService"),
    ("wallet/client/remote.py", "from node.serve import LayerServer"),
    ("wallet/client/remote.py", "from node.control import control_call"),
    ("wallet/client/remote.py", "import node.cli.common"),
    ("wallet/cli/__init__.py", "from node.mine import Miner"),
    ("wallet/cli/infer.py", "from node.node import Node"),
    ("node/newthing.py", "import os"),
])
def test_checker_catches_violations(relpath, source):
    assert violations(relpath, source), f"{source!r} in {relpath} should be refused"


def test_checker_allows_the_permitted():
    assert violations("ledger/state.py", "from ledger import merkle\nimport msgpack") == []
    assert violations("node/cli/pnode.py", "import click\nfrom ledger import chaindb") == []
    assert violations("proof_of_learning/verify.py", "from compute import model") == []
    assert violations("proof_of_learning/judge.py", "import torch\nfrom ledger.types import unit_id") == []
    assert violations("node/pol/verifier.py", "from proof_of_learning.judge import judge") == []
    assert violations("wallet/client/hop.py", "from node.wire import OpenSession, Step") == []
    assert violations("wallet/payer.py", "from node.wire import ServerInfo") == []
    assert violations("node/node.py", "from node.chain import ChainService\n"
                      "from node.serve import LayerServer\nfrom node.mine import Miner") == []
    assert violations("node/cli/pnode.py", "from node.mine import devnet_job") == []
    assert violations("node/mine/miner.py", "from node.chain import ChainService\n"
                      "from node import torch_thread\nfrom node.wire import StepTensors") == []
    assert violations("node/mine/miner.py", "from node.mine.jobs import job_units") == []
    assert violations("node/serve/sessions.py", "from node.torch_thread import tensor_work") == []
    assert violations("node/chain/sync.py", "from node.datadir import DataDir") == []
    assert violations("node/datadir/layout.py", "from node.datadir.keys import read_seed_file") == []
    assert violations("node/mine/runner.py", "from node.pol import Verifier") == []
    assert violations("node/net/host.py", "from node.errors import NodeError") == []
    assert violations("wallet/client/remote.py", "from node.serve import SwarmView, fetch_view") == []
    assert violations("wallet/cli/__init__.py", "import node.cli.common as c\n"
                      "from node.control import control_call") == []


def test_no_import_circle():
    assert import_circles(module_graph()) == []


def test_circle_finder_finds_circles():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_circle_check_follows_lazy_re_exports():
    """``from node.net import Host`` depends on node.net.host, not on node.net's __init__."""
    graph = module_graph()
    assert "node.net.host" in graph["node.chain.sync"]
    assert lazy_homes("node.net")["Host"] == "node.net.host"
