"""The chain's registered servers, as the client routes by them.

Owns `RegisteredNode` (one node registered and bonded on the chain the
client follows) and `registry_from_view`, which reads the answer of the
node's ``registry`` control op, or of `node.chain.registry_view` on a
stopped node's store (specs/network.md, "Control socket"), into the mapping
`wallet.client.directory.SwarmDirectory` filters servers by (peer id -> node). The
CLI does the reading (`pwallet infer`); the library only takes the mapping,
so tests and embedders choose their own registry, or none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from wallet.errors import WalletError


class RegistryError(WalletError):
    """A registry answer that does not have the fields it must have."""


@dataclass(frozen=True, slots=True)
class RegisteredNode:
    """A node registered on the chain whose account holds at least the minimum bond.

    Attributes:
        peer_id: its libp2p peer id (base58), bound by its peer key's signature.
        node_key, account: its node key and account (32 bytes each).
        bond: the account's bond, in base units.
        layers: the layers it registered, [start, end).
    """

    peer_id: str
    node_key: bytes
    account: bytes
    bond: int
    layers: tuple[int, int]


def registry_from_view(view: Mapping[str, Any]) -> dict[str, RegisteredNode]:
    """The registered nodes of a ``registry`` answer, by peer id.

    Args:
        view: the answer: a ``nodes`` list of objects with ``peer_id``,
            ``node_key``, ``account`` (hex), ``bond`` and ``layers``.

    Returns:
        Peer id (base58) -> node. Should two nodes name one peer id (only
        the peer key's holder can sign both bindings), the later in the
        list is kept: either way the client routes to that holder.

    Raises:
        RegistryError: ``nodes`` is missing, or an entry lacks a field or
            has one of the wrong type.
    """
    nodes = view.get("nodes")
    if not isinstance(nodes, list):
        raise RegistryError("the registry answer has no list of nodes")
    out: dict[str, RegisteredNode] = {}
    for entry in nodes:
        try:
            start, end = entry["layers"]
            node = RegisteredNode(str(entry["peer_id"]), bytes.fromhex(entry["node_key"]),
                                  bytes.fromhex(entry["account"]), int(entry["bond"]),
                                  (int(start), int(end)))
        except (KeyError, TypeError, ValueError) as exc:
            raise RegistryError(f"a malformed registry entry {entry!r}: {exc}") from None
        out[node.peer_id] = node
    return out
