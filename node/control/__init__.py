"""The control room: how the CLIs talk to a running node, and what it answers.

Sub-modules: `server` (the ``D/node.sock`` channel: `ControlServer`, and the
client side `control_call` / `control_request`; no knowledge of any op) and
`ops` (`NodeOps`: every op a running node answers, from its chain, miner
and verifier). A new op goes into `ops`; a new CLI command calls it by name.
"""

from node.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "node.control.server": ("IDLE_TIMEOUT_S", "LISTEN_BACKLOG", "MAX_REQUEST", "MAX_RESPONSE",
                            "SOCK_FILE", "ControlError", "ControlOp",
                            "ControlServer", "NodeNotRunning", "control_call",
                            "control_request", "socket_path"),
    "node.control.ops": ("NodeOps",),
})
