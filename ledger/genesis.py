"""Chain parameter presets and the builders of a new chain's genesis.

Owns the one home of the chain constants a new chain starts from
(``DEFAULT_PARAMS`` for `pnode init`, ``DEVNET_PARAMS`` for `pnode devnet`,
``TEST_PARAMS`` for the test chains), the registration transaction a node
makes to join (``node_registration``), and ``new_genesis``, which puts
allocations, registrations and jobs together into a ``Genesis``.

Pure: every key, the time and the chain id come in as arguments, so the same
inputs always build the same genesis. Whether a genesis can start a chain is
decided by ``ledger.transition.genesis_block``; ``new_genesis`` only refuses
what is wrong in the description itself.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Iterable, Mapping

from ledger.crypto import SigningKey, libp2p_peer_id
from ledger.errors import BadGenesis
from ledger.types import (
    COIN, ZERO_SIG, Allocation, Genesis, Job, Params, Register, binding_signature,
    peer_binding_signature, sign,
)

#: A new chain made by `pnode init`: two-second slots, room for slow nodes.
DEFAULT_PARAMS: Mapping[str, int] = MappingProxyType(dict(
    slot_ms=2000, max_future_ms=15_000, min_bond=10 * COIN, reward=COIN, challenge_window=10,
    unit_timeout=20, max_block_txs=5000, slash_bps=10_000,
    # No audits until nodes run verifiers (specs/pol.md, Status): a drawn
    # verifier that cannot answer would be struck for its silence.
    audit_bps=0, verify_fee=COIN, verdict_window=30, recheck_bps=1000,
    # The economics must hold against a fifth of the nodes colluding
    # (ledger.audit.economics_problem).
    cartel_bps=2000))

#: A devnet chain: fast slots and short windows, so a short run pays out.
DEVNET_PARAMS: Mapping[str, int] = MappingProxyType(dict(
    DEFAULT_PARAMS, slot_ms=300, challenge_window=4, unit_timeout=15,
    # Every devnet node mines and verifies: audit a tenth of the receipts. A
    # cheated receipt is then caught with probability 0.066 against a fifth
    # of the nodes colluding, so a bond of 20 rewards makes cheating lose.
    audit_bps=1000, verdict_window=10, min_bond=20 * COIN))

#: The test chains (tests/ledger/chainkit.py): windows of a few blocks, so a
#: test reaches a payout or a timeout in a handful of blocks.
TEST_PARAMS: Mapping[str, int] = MappingProxyType(dict(
    DEFAULT_PARAMS, slot_ms=1000, challenge_window=3, unit_timeout=4, verdict_window=3,
    recheck_bps=0))


def chain_params(preset: Mapping[str, int], job_authority: bytes, /, **overrides) -> Params:
    """A chain's ``Params``: a preset with the job authority, then ``overrides``.

    Args:
        preset: one of the ``*_PARAMS`` presets (every field but the job authority).
        job_authority: the account that may post training jobs.
        overrides: fields that replace the preset's (``job_authority`` too).

    Returns:
        The Params; whether their values can run a chain is checked by
        ``genesis_block``, not here.

    Raises:
        TypeError: an override or preset names no field of Params.
    """
    return replace(Params(**preset, job_authority=job_authority), **overrides)


def node_registration(chain_id: str, wallet: SigningKey, node_key: SigningKey,
                      peer_key: SigningKey, layers: tuple[int, int], bond: int,
                      nonce: int = 0) -> Register:
    """The signed transaction that registers a node and bonds ``bond`` for it.

    The node key and the peer key each sign the binding of the node key and
    the peer id to the wallet's account, and the wallet signs the whole.

    Args:
        chain_id: the chain the registration is for.
        wallet: the account's key, which pays the bond and signs.
        node_key: the node's block-producing and receipt-signing key.
        peer_key: the node's libp2p identity key; the peer id bound is
            ``ledger.crypto.libp2p_peer_id(peer_key.public)``.
        layers: the model layers served, (start, end).
        bond: base units locked as the node's bond.
        nonce: the wallet's account nonce (0 in a genesis).

    Returns:
        The Register, with its three signatures filled in.
    """
    start, end = layers
    peer_id = libp2p_peer_id(peer_key.public)
    reg = Register(chain_id, wallet.public, node_key.public, peer_id, start, end, bond, nonce,
                   binding_signature(node_key, chain_id, wallet.public, peer_id),
                   peer_binding_signature(peer_key, chain_id, wallet.public, node_key.public),
                   ZERO_SIG)
    return sign(reg, wallet)


def new_genesis(chain_id: str, time_ms: int, params: Params,
                allocations: Iterable[tuple[bytes, int]], registrations: Iterable[Register] = (),
                jobs: Iterable[Job] = ()) -> Genesis:
    """The genesis of a new chain.

    Args:
        chain_id: the new chain's id.
        time_ms: the genesis time (block 0's time), in ms since the epoch.
        params: the chain's constants (see ``chain_params``).
        allocations: (account, base units) pairs funded at genesis, in order.
        registrations: signed registrations, applied in order after the allocations.
        jobs: signed jobs, applied after the registrations.

    Returns:
        The Genesis.

    Raises:
        BadGenesis: an account allocated twice, or a registration or job
            signed for another chain.
    """
    allocs = tuple(Allocation(account, amount) for account, amount in allocations)
    # Both would fail in genesis_block too; refusing them here names the mistake
    # while the caller still knows which input it was.
    if len({a.account for a in allocs}) != len(allocs):
        raise BadGenesis("an account is allocated twice")
    regs, job_txs = tuple(registrations), tuple(jobs)
    for tx in (*regs, *job_txs):
        if tx.chain_id != chain_id:
            raise BadGenesis(f"a {type(tx).__name__} signed for chain {tx.chain_id!r}, "
                             f"not {chain_id!r}")
    return Genesis(chain_id, time_ms, params, allocs, regs, job_txs)
