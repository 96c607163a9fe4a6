"""`python -m node.cli` runs `pnode`."""

from node.cli.pnode import main

main()
