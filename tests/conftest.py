"""Fixtures shared by every test package."""

from tests.clikit import pnode, pwallet  # noqa: F401  (fixtures)
