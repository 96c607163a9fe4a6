"""Lazy re-exports for node's sub-packages: a name loads its module on first use.

Each sub-package's ``__init__`` names its API (trio's ``__init__`` re-exporting
from private modules is the model) without importing it: ``from node.net
import read_frame`` loads only `node.net.framing`, not libp2p with the host,
and ``from node.chain import node_status_view`` no torch or libp2p at all.
So a command's start-up pays only for what it uses (`pnode status` answers
in a fraction of a second).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, Sequence[str]]
                 ) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` for a package re-exporting ``exports``.

    Args:
        package: the package's ``__name__``.
        exports: module (absolute name) -> the names of it the package exports.

    Returns:
        (``__all__``, ``__getattr__``, ``__dir__``) to assign in the package.

    Raises:
        ValueError: a name is exported from two modules.
    """
    home: dict[str, str] = {}
    for module, names in exports.items():
        for name in names:
            if name in home:
                raise ValueError(f"{package}: {name} exported by {home[name]} and {module}")
            home[name] = module
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        module = home.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # the next lookup is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(home))

    return sorted(home), __getattr__, __dir__
