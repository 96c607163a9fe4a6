"""Fixtures of the node tests: `spawn` (real `pnode start` processes, always reaped)."""

from tests.node.prockit import spawn  # noqa: F401 (registers the fixture)
