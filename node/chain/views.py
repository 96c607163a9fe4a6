"""What the CLIs and the control socket show of the chain: accounts, status, registry.

Owns `account_view`, `node_status_view`, `registry_view` (the registered,
bonded nodes) and `receipts_view`, built in one place from a `ChainDB`,
whether a running node answers over its control socket (`node.node`) or a
command reads a stopped node's store (`node.cli`), so both answers have the
same fields and meanings. Plain functions of the store's state: call them
where the store may be read (the chain service's thread while a node runs).
"""

from __future__ import annotations

from typing import Any

from ledger.chaindb import ChainDB
from ledger.rules import bonded_nodes
from ledger.state import ACCOUNT, JAIL, NODE, Overlay
from ledger.types import Receipt, nonce_owner, tx_hash
from node.errors import NodeError


class BadQuery(NodeError):
    """A view's argument it cannot use (answered as a refusal over the control socket)."""


def account_view(chain: ChainDB, account_id: bytes) -> dict[str, Any]:
    """An account as `pwallet balance` and ``send`` read it.

    Returns:
        address (hex), chain_id, height, balance, bond, nonce (the next one
        the chain expects), queued (its transactions with a nonce waiting in
        the mempool: transfers, registrations, jobs, tabs) and next_nonce (the
        nonce its next transaction takes).
    """
    account = chain.state.get(ACCOUNT + account_id)
    nonce = account.nonce if account else 0
    queued = [tx.nonce for tx in chain.mempool() if nonce_owner(tx) == account_id]
    return {"address": account_id.hex(), "chain_id": chain.chain_id, "height": chain.height,
            "balance": account.balance if account else 0,
            "bond": account.bond if account else 0,
            "nonce": nonce, "queued": len(queued),
            "next_nonce": max([nonce, *(n + 1 for n in queued)])}


def node_status_view(chain: ChainDB, address: bytes, node_key: bytes) -> dict[str, Any]:
    """The chain's fields of `pnode status` for the node of ``node_key`` and wallet ``address``.

    Returns:
        chain_id, height, tip, address, node_key (hex), the wallet's balance
        and bond, whether the node is registered and its layers,
        jailed_until (None unless jailed past the tip) and the mempool's size.
    """
    account = chain.state.get(ACCOUNT + address)
    record = chain.state.get(NODE + node_key)
    jail = chain.state.get(JAIL + address)
    return {"chain_id": chain.chain_id, "height": chain.height, "tip": chain.tip_hash.hex(),
            "address": address.hex(), "node_key": node_key.hex(),
            "balance": account.balance if account else 0,
            "bond": account.bond if account else 0,
            "registered": record is not None,
            "layers": [record.layer_start, record.layer_end] if record else None,
            # Jailed for a missed unit deadline: last in line for units until then.
            "jailed_until": jail.until if jail and jail.until > chain.height else None,
            "mempool": len(chain.mempool())}


def registry_view(chain: ChainDB) -> dict[str, Any]:
    """The registered, bonded nodes: the servers `pwallet infer` may route through.

    The same set the chain assigns work to (`ledger.rules.bonded_nodes`);
    each node's peer id was signed by its own peer key when it registered
    (specs/ledger.md section 4.1), so an entry vouches for that peer.

    Returns:
        chain_id, height, min_bond and ``nodes``: one entry per node, in
        node-key order, with peer_id (base58, as libp2p prints it),
        node_key and account (hex), bond (base units) and the registered
        layers [start, end).
    """
    from libp2p.peer.id import ID  # here: `pwallet balance` reads views without libp2p

    nodes = [{"peer_id": ID(record.peer_id).to_base58(), "node_key": node_key.hex(),
              "account": record.account.hex(), "bond": account.bond,
              "layers": [record.layer_start, record.layer_end]}
             for node_key, record, account in bonded_nodes(Overlay(chain.state))]
    return {"chain_id": chain.chain_id, "height": chain.height,
            "min_bond": Overlay(chain.state).params().min_bond, "nodes": nodes}


def receipts_view(chain: ChainDB, node: str | None = None, job: str | None = None
                  ) -> dict[str, Any]:
    """The receipts in main-chain blocks, oldest first: what `pnode proof` takes.

    Args:
        node, job: keep only receipts whose node key / job id (hex) starts so.

    Returns:
        height and ``receipts``: per receipt its id (the hash `pnode proof`
        proves), block height, log index (its leaf in the receipt log), node
        key, job id and unit id, all hex.

    Raises:
        BadQuery: a prefix that is not hex digits (from a CLI or a control
            client alike).
    """
    for value in (node, job):
        if value is not None and (not isinstance(value, str) or not value
                                  or any(c not in "0123456789abcdef" for c in value.lower())):
            raise BadQuery(f'"{value}" is not hex (a node key or job id prefix)')
    node, job = (v.lower() if v else None for v in (node, job))
    out = []
    for block in chain.iter_blocks():
        for tx in block.txs:
            if not isinstance(tx, Receipt) or not tx.node_key.hex().startswith(node or "") \
                    or not tx.job_id.hex().startswith(job or ""):
                continue
            rid = tx_hash(tx)
            out.append({"id": rid.hex(), "height": block.header.height,
                        "log_index": chain.receipt_index(rid), "node_key": tx.node_key.hex(),
                        "job_id": tx.job_id.hex(), "unit_id": tx.unit_id.hex()})
    return {"height": chain.height, "receipts": out}
