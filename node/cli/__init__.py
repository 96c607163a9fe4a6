"""The `pnode` command line: commands, shared CLI helpers, the devnet runner and the demo."""

from node.cli.pnode import main

__all__ = ["main"]
