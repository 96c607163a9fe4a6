"""A development network: a fresh chain whose genesis carries a training job.

Owns what `pnode devnet` builds before it starts any process
(specs/consensus.md section 6): the nodes' keys, which layers each registers
(`devnet_spans`), and the genesis (allocations that fund the bonds, the
registrations, the job). The runner that starts the processes and sums up
lives in `node.cli.devnet_run`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from compute.blocks import model_partition
from compute.data import JobConfig, make_model
from ledger.crypto import SigningKey, libp2p_peer_id
from ledger.genesis import DEVNET_PARAMS, chain_params, new_genesis, node_registration
from ledger.types import Genesis
from proof_of_learning.units import job_tx

__all__ = ["BOND", "DEVNET_PARAMS", "DevnetKeys", "devnet_genesis", "devnet_job", "devnet_spans"]

BOND = DEVNET_PARAMS["min_bond"]


@dataclass(frozen=True, slots=True)
class DevnetKeys:
    """One devnet node's keys (`pnode init` writes the same three)."""

    node: SigningKey
    peer: SigningKey
    wallet: SigningKey

    @classmethod
    def fresh(cls) -> DevnetKeys:
        return cls(*(SigningKey(os.urandom(32)) for _ in range(3)))

    @property
    def peer_id(self) -> bytes:
        return libp2p_peer_id(self.peer.public)


def devnet_spans(n_nodes: int, sections: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The layers each node registers: node i < k takes section i, the rest the whole model.

    So every section has a holder of its own, and with more nodes than
    sections every section has a second holder (a replica) that can take
    over its units when a node dies.
    """
    whole = (sections[0][0], sections[-1][1])
    return [sections[i] if i < len(sections) and n_nodes > 1 else whole
            for i in range(n_nodes)]


def devnet_job(steps: int, n_nodes: int, **overrides) -> JobConfig:
    """The default job for ``n_nodes`` nodes: two sections (one with a single node)."""
    return JobConfig(**{"steps": steps, "k": min(2, max(n_nodes, 1)), **overrides})


def devnet_genesis(chain_id: str, keys: list[DevnetKeys], config: JobConfig, time_ms: int,
                   *, authority: SigningKey | None = None,
                   spans: list[tuple[int, int]] | None = None, **params) -> Genesis:
    """Genesis: each wallet funded with its bond, registered for `devnet_spans`, the job.

    Args:
        chain_id: the new chain's id.
        keys: each node's keys, in node order.
        config: the training job, posted by ``authority``.
        time_ms: the genesis time.
        authority: the job authority (default: the first node's wallet).
        spans: the layers each node registers (default: `devnet_spans`).
        params: overrides of `DEVNET_PARAMS`.
    """
    authority = authority or keys[0].wallet
    plan = model_partition(make_model(config), config.k, config.mlp_slices)
    sections = [(s.layer_start, s.layer_end) for s in plan.blocks()[:plan.k]]
    regs = [node_registration(chain_id, k.wallet, k.node, k.peer, span, BOND)
            for k, span in zip(keys, spans or devnet_spans(len(keys), sections))]
    # The authority's job comes after its own registration when it runs a node.
    nonce = 1 if any(k.wallet.public == authority.public for k in keys) else 0
    return new_genesis(chain_id, time_ms, chain_params(DEVNET_PARAMS, authority.public, **params),
                       [(k.wallet.public, BOND) for k in keys], regs,
                       [job_tx(config, chain_id, authority, nonce, plan)])
