"""Serving layers: placement, the swarm view, inference sessions and the layer server.

Sub-modules: `placement` (which span a server takes: pure), `swarm`
(announcements and the view of who serves what: `SwarmView`, `fetch_view`,
`announce_peer` are what a client reads), `admission` (`SessionConfig`:
who may open a session, fair order of the forward calls, compute metering),
`sessions` (`InferenceServer`: the KV-cached sessions of
`/pnode/inference`), `forward` (a session's steps as forward calls, in
fair turns, metered), `paid` (a server's paid sessions: tabs checked,
ended, settled), `push` (a session linked to the next hop's), `billing`
(what a paid session owes: pure), `cashier` (`Cashier`: a serving node's
tabs, vouchers and claims), `waiting` (a full server's waiting room, highest
bid first), `throughput` (decode speed through a span), `layer_server`
(`LayerServer`: loads the span, serves it, moves it). Never imports the chain or the miner.
"""

from node.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "node.serve.placement": ("choose_span", "should_move"),
    "node.serve.swarm": ("Announcer", "SwarmView", "announce_peer", "fetch_view"),
    "node.serve.admission": (
        "ClientAtLimit", "InferenceError", "ServerFull", "SessionBusy", "SessionConfig",
        "SessionRefused",
    ),
    "node.serve.billing": ("Bill", "PaymentError", "TabRefused", "check_tab"),
    "node.serve.cashier": ("Cashier", "TabLedger"),
    "node.serve.sessions": ("InferenceServer",),
    "node.serve.throughput": ("measure_throughput",),
    "node.serve.waiting": ("WaitingRoom",),
    "node.serve.layer_server": ("LayerServer", "ServeConfig"),
})
