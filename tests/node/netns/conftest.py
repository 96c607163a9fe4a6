"""Fixtures of the namespace tests: `netns` (a bridge and hosts, always torn down)."""

from tests.node.netns.nskit import netns  # noqa: F401 (registers the fixture)
