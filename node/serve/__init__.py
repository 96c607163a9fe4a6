"""Serving layers: placement, the swarm view, inference sessions and the layer server.

Sub-modules: `placement` (which span a server takes: pure), `swarm`
(announcements and the view of who serves what: `SwarmView`, `fetch_view`,
`announce_peer` are what a client reads), `sessions` (`InferenceServer`: the
KV-cached sessions of `/pnode/inference`), `layer_server` (`LayerServer`:
loads the span, serves it, moves it). Never imports the chain or the miner.
"""

from node.serve.placement import choose_span, should_move
from node.serve.swarm import announce_peer, Announcer, fetch_view, SwarmView
from node.serve.sessions import InferenceServer, measure_throughput, ServerConfig
from node.serve.layer_server import LayerServer, ServeConfig

__all__ = [
    "Announcer", "InferenceServer", "LayerServer", "ServeConfig", "ServerConfig", "SwarmView",
    "announce_peer", "choose_span", "fetch_view", "measure_throughput", "should_move",
]
