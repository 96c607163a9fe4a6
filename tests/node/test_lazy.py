"""node.lazy: sub-packages name their API without importing it."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from node.lazy import lazy_exports
from tests.node.prockit import ROOT


def test_a_name_loads_its_module_on_first_use_and_stays():
    package = types.ModuleType("fake_pkg")
    sys.modules["fake_pkg"] = package
    try:
        package.__all__, package.__getattr__, package.__dir__ = lazy_exports(
            "fake_pkg", {"json": ("dumps",), "textwrap": ("dedent", "indent")})
        assert package.__all__ == ["dedent", "dumps", "indent"]
        import json
        assert package.dumps is json.dumps and "dumps" in vars(package)
        assert "indent" in dir(package)
        with pytest.raises(AttributeError, match="no attribute 'loads'"):
            package.loads  # noqa: B018
    finally:
        del sys.modules["fake_pkg"]


def test_a_name_exported_twice_is_refused():
    sys.modules["fake_pkg2"] = types.ModuleType("fake_pkg2")
    try:
        with pytest.raises(ValueError, match="dumps"):
            lazy_exports("fake_pkg2", {"json": ("dumps",), "pickle": ("dumps",)})
    finally:
        del sys.modules["fake_pkg2"]


@pytest.mark.parametrize("statement, absent", [
    ("from node.net import read_frame", ("libp2p", "torch")),
    ("from node.chain import node_status_view", ("libp2p", "torch")),
    ("import node.cli.pnode", ("libp2p", "torch")),
    ("import wallet.cli", ("libp2p", "torch")),
])
def test_light_imports_stay_light(statement, absent):
    """What a command needs to parse its arguments loads neither torch nor libp2p."""
    code = f"import sys\n{statement}\nprint(sorted(m for m in {absent!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("package", ["node.net", "node.wire", "node.chain", "node.serve",
                                     "node.mine"])
def test_every_exported_name_exists(package):
    import importlib
    pkg = importlib.import_module(package)
    for name in pkg.__all__:
        assert getattr(pkg, name) is not None, f"{package}.{name}"


def test_pwallet_infer_parses_its_arguments_before_torch_loads():
    """The client's OpenMP spin is set in infer's body: torch must not load while click parses.

    (A ``--wire`` choice that read `compute.wiretensor` loaded torch, and libgomp
    read the default spin before the client could set its own.)
    """
    code = ("import sys\nfrom wallet.cli import main_group\n"
            "try:\n    main_group.main(['infer', 'hi', '--peers', 'not-an-address'],"
            " standalone_mode=False)\nexcept Exception as exc:\n    print(type(exc).__name__)\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["BadParameter", "False"]


@pytest.mark.parametrize("args, words", [
    (["start", "--data-dir", "/nonexistent/pnode"], "does not exist"),
    (["start", "--peers", "/ip4/127.0.0.1/tcp/1"], "does not end in /p2p/"),
    (["start", "--listen", "nonsense"], "bad listen address"),
    (["start", "--no-serve", "--layers", "0:3"], "--no-serve cannot go with --layers"),
    (["start", "--layers", "5:2"], "START < END"),
    (["start", "--bond", "-3"], "amounts are positive"),
    (["start", "--model", "/nonexistent/m.gguf"], "does not exist"),
    (["start", "--model", "pyproject.toml"], "a server runs a GGUF file"),
])
def test_a_bad_start_argument_fails_before_torch_and_libp2p_load(args, words):
    """The checks that need neither run first: a typo costs a fraction of a second."""
    code = ("import sys\nfrom node.cli.pnode import main\nsys.argv = ['pnode', *sys.argv[1:]]\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\n"
            "print(code, 'torch' in sys.modules, 'libp2p' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.split() == ["2", "False", "False"], out.stdout + out.stderr
    assert words in out.stderr and "Traceback" not in out.stderr, out.stderr
