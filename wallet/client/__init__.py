"""The inference client: a prompt in, tokens out, from this process or over the swarm.

Every wallet module that speaks the inference protocol lives here (the layer
test holds it so); the rest of `wallet` keeps keys, the payer and the light
chain view. A new client-side feature (an HTTP API, fine-tuning) comes in
beside these modules and takes this interface:

- `InferRequest`, `Token`, `prompt_ids` (`prompt`): what a user asks, what a
  generation yields, and the one encoding of a prompt;
- `LocalModel`, `exported_model` (`local`): the whole model in this process;
- `open_remote`, `RemoteModel`, `ClientParts`, `load_client_parts`
  (`remote`): the model spread over servers, found through the swarm view;
- `ClientConfig`, `Generation`, `Served`, `SpotReport` (`generation`): a
  remote generation's settings and report.

Inner modules: `route` (plans hops: `plan_route`, `replan`), `directory`
(`SwarmDirectory`: the servers a client can use), `hop` (one hop's
session), `session` (`RouteRun`: a route's sessions across a generation),
`failover` (replacing a hop, or moving it to a new tab),
`spotcheck` (`SpotChecker`: recomputing a hop to catch a lying server).
Importing this package loads none of them (no torch, no libp2p).
"""

from node.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "wallet.client.prompt": ("InferRequest", "Token", "prompt_ids"),
    "wallet.client.local": ("LocalModel", "exported_model"),
    "wallet.client.remote": ("ClientParts", "RemoteModel", "load_client_parts", "open_remote"),
    "wallet.client.generation": ("ClientConfig", "Generation", "Served", "SpotReport"),
})
