"""The command lines: `pnode` (`node.cli.pnode`), the helpers both CLIs share (`node.cli.common`),
the devnet runner and the demo. Imports nothing here, so `pwallet` can take `node.cli.common`
without the whole node."""
