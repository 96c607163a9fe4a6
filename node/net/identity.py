"""A node's libp2p identity, and the root of the host's errors.

Owns `PeerIdentity`: the Ed25519 key pair of the data dir's ``peer.key``,
whose peer id is `ledger.crypto.libp2p_peer_id` of its public key (what the
ledger records). `node.net.host` re-exports both names.
"""

from __future__ import annotations

from dataclasses import dataclass

from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID

from ledger.crypto import libp2p_peer_id
from node.errors import NodeError


class HostError(NodeError):
    """Root of the errors of the libp2p host (also: a bad identity seed)."""


@dataclass(frozen=True)
class PeerIdentity:
    """A node's libp2p identity: an Ed25519 key pair."""

    key_pair: KeyPair

    @classmethod
    def from_seed(cls, seed: bytes) -> PeerIdentity:
        """The identity of a 32-byte Ed25519 seed. Raises HostError otherwise."""
        # Ed25519PrivateKey.new(b"") would silently make a *random* key.
        if not isinstance(seed, bytes) or len(seed) != 32:
            raise HostError("a peer identity seed is 32 bytes")
        return cls(create_new_key_pair(seed))

    @property
    def public_key(self) -> bytes:
        """The raw 32-byte Ed25519 public key."""
        return self.key_pair.public_key.to_bytes()

    @property
    def peer_id(self) -> ID:
        return ID.from_pubkey(self.key_pair.public_key)

    @property
    def peer_id_bytes(self) -> bytes:
        """The peer id as the ledger records it."""
        return libp2p_peer_id(self.public_key)
