"""Builders for test chains: deterministic keys, a genesis, and block production.

Real keys, real signatures, real rules: nothing here bypasses validation.
"""

from __future__ import annotations

import hashlib

from dataclasses import dataclass, field, replace

from ledger import merkle
from ledger.chaindb import ChainDB
from ledger.codec import encode
from ledger.crypto import SigningKey
from ledger.genesis import TEST_PARAMS, chain_params, new_genesis, node_registration
from ledger.state import ACCOUNT, UNIT
from ledger.store import MemoryStore
from ledger.transition import producer_rank, validate_block
from ledger.types import (
    BACKWARD, COIN, FORWARD, ZERO_SIG, Block, Genesis, Job, Params, Receipt, Register, Transfer,
    UnitTemplate, sign,
)

CHAIN = "pnode-test"


def key(i: int) -> SigningKey:
    return SigningKey(i.to_bytes(4, "big") * 8)


@dataclass
class Net:
    """A test chain's cast: job authority, node operators and plain users."""

    genesis: Genesis
    authority: SigningKey
    wallets: list[SigningKey]
    nodes: list[SigningKey]
    users: list[SigningKey]
    nonces: dict[bytes, int] = field(default_factory=dict)

    def node_key(self, public: bytes) -> SigningKey:
        return next(k for k in self.nodes if k.public == public)

    def transfer(self, sender: SigningKey, recipient: bytes, amount: int,
                 nonce: int | None = None, chain_id: str = CHAIN) -> Transfer:
        if nonce is None:
            nonce = self.nonces.get(sender.public, 0)
            self.nonces[sender.public] = nonce + 1
        return sign(Transfer(chain_id, sender.public, recipient, amount, nonce, ZERO_SIG), sender)


def balance(db: ChainDB, account: bytes) -> int:
    """An account's balance at the tip (0 for one never written)."""
    record = db.state.get(ACCOUNT + account)
    return 0 if record is None else record.balance


def params(authority: bytes, **overrides) -> Params:
    return chain_params(TEST_PARAMS, authority, **overrides)


def peer_key(node: SigningKey) -> SigningKey:
    """A node's libp2p identity key in the test chains (derived from its node key)."""
    return SigningKey(bytes(b ^ 0x5A for b in node.seed()))


def registration(wallet: SigningKey, node: SigningKey, layers=(0, 30), bond=10 * COIN,
                 nonce=0, chain_id=CHAIN, peer: SigningKey | None = None) -> Register:
    """``node`` registered to ``wallet``, its peer id that of ``peer`` (default `peer_key`)."""
    return node_registration(chain_id, wallet, node, peer or peer_key(node), layers, bond, nonce)


def job(authority: SigningKey, steps=3, layers=((0, 30),), nonce=0, deposit=0,
        spec=b"{}") -> Job:
    """A job of whole-layer sections ``layers`` (forward units, then backward), by ``authority``
    (any key: with a ``deposit`` it is a paid job)."""
    units = tuple(UnitTemplate(FORWARD, a, b, 0, 0) for a, b in layers) + tuple(
        UnitTemplate(BACKWARD, a, b, 0, 0) for a, b in reversed(layers))
    j = Job(CHAIN, authority.public, bytes(32), bytes(32), hashlib.sha256(spec).digest(), spec,
            steps, units, deposit, nonce, ZERO_SIG)
    return sign(j, authority)


def make_net(n_nodes=3, n_users=2, with_job=False, layers=None, job_steps=3,
             **param_overrides) -> Net:
    authority = key(1)
    wallets = [key(100 + i) for i in range(n_nodes)]
    nodes = [key(200 + i) for i in range(n_nodes)]
    users = [key(300 + i) for i in range(n_users)]
    allocs = [(w.public, 100 * COIN) for w in wallets + users]
    regs = [registration(w, n, layers[i] if layers else (0, 30)) for i, (w, n) in
            enumerate(zip(wallets, nodes))]
    jobs = (job(authority, steps=job_steps),) if with_job else ()
    genesis = new_genesis(CHAIN, 1_000_000, params(authority.public, **param_overrides),
                          allocs, regs, jobs)
    net = Net(genesis, authority, wallets, nodes, users)
    for w in wallets:
        net.nonces[w.public] = 1
    if with_job:
        net.nonces[authority.public] = 1
    return net


def new_db(net: Net, store=None) -> ChainDB:
    return ChainDB.create(store if store is not None else MemoryStore(), net.genesis)


def copy_chain(net: Net, db: ChainDB, store=None) -> ChainDB:
    """A second chain DB holding the same main chain as ``db`` (every block re-validated)."""
    other = new_db(net, store)
    for block in list(db.iter_blocks())[1:]:
        other.add_block(block, now_ms=None)
    return other


def producer(db: ChainDB, net: Net, rank: int = 0) -> SigningKey:
    """The node key that holds ``rank`` for the next block."""
    for k in net.nodes:
        if producer_rank(db.state, db.tip, k.public) == rank:
            return k
    raise LookupError(f"no producer of rank {rank}")


def next_block(db: ChainDB, net: Net, txs=(), rank: int = 0, time_ms: int | None = None):
    """Build the next block with the rank-``rank`` producer at its earliest time."""
    k = producer(db, net, rank)
    t = time_ms if time_ms is not None else db.tip.time_ms + max(1, rank * net.genesis.params.slot_ms)
    return db.build(list(txs), k, t)


def grow(db: ChainDB, net: Net, n: int, txs_per_block=(), rank=0):
    """Add ``n`` blocks; returns the Applied results."""
    out = []
    for _ in range(n):
        applied = next_block(db, net, txs_per_block, rank=rank)
        db.add_block(applied.block, now_ms=applied.block.header.time_ms)
        out.append(applied)
    return out


def receipts_due(db: ChainDB, net: Net) -> list[Receipt]:
    """Signed receipts for every open unit, from the node it is assigned to."""
    out = []
    for uid in db.state.ids(UNIT):
        a = db.state.get(UNIT + uid)
        if not a.done:
            k = net.node_key(a.node_key)
            out.append(sign(Receipt(CHAIN, k.public, a.job_id, uid, bytes(32), bytes(32),
                                    bytes(32), bytes(32), ZERO_SIG), k))
    return out


def check_block(db: ChainDB, block, now: int | None = None):
    """`validate_block` of ``block`` on ``db``'s tip, at ``now`` (default: the block's time)."""
    return validate_block(db.state, db.tip, block, now if now is not None else block.header.time_ms)


def resign(block: Block, net, **fields) -> Block:
    """The block with header fields changed and the header signed again."""
    header = replace(block.header, **fields)
    return replace(block, header=sign(header, net.node_key(header.producer)))


def with_txs(block: Block, net, txs) -> Block:
    root = merkle.merkle_root([encode(t) for t in txs])
    return resign(replace(block, txs=tuple(txs)), net, txs_root=root)
