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
from node.errors import BadRequest


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
        BadRequest: a prefix that is not hex digits (from a CLI or a control
            client alike).
    """
    for value in (node, job):
        if value is not None and (not isinstance(value, str) or not value
                                  or any(c not in "0123456789abcdef" for c in value.lower())):
            raise BadRequest(f'"{value}" is not hex (a node key or job id prefix)')
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


#: View arguments only a local caller may give (not JSON: the control op refuses them).
LOCAL_ONLY = frozenset({"progress"})


def read_views() -> dict[str, Any]:
    """The views a command may ask a running node for by name (the control op ``view``).

    A command that reads the chain asks the running node for one of these,
    or, with no node running, calls the same function on the store
    (`node.cli.common.read_view`): one code path, the same answer.
    """
    from node.chain.jobviews import job_view, jobs_view

    return {"receipts": receipts_view, "registry": registry_view, "jobs": jobs_view,
            "job": job_view, "params": params_view, "block": block_view, "proof": proof_view,
            "verify": verify_view, "history": history_view, "hash": hash_view}


def hash_view(chain: ChainDB, height: int) -> dict[str, Any]:
    """The hash (hex) of the main-chain block at ``height``; None above the tip."""
    if not isinstance(height, int) or isinstance(height, bool) or height < 0:
        raise BadRequest(f"a height is a whole number >= 0, got {height!r}")
    found = chain.hash_at(height)
    return {"height": chain.height, "hash": found.hex() if found else None}


def _height(chain: ChainDB, height: Any) -> int:
    """``height`` checked against the chain (None: the tip)."""
    if height is None:
        return chain.height
    if not isinstance(height, int) or isinstance(height, bool) or height < 0:
        raise BadRequest(f"a height is a whole number >= 0, got {height!r}")
    if height > chain.height:
        raise BadRequest(f"no block at height {height}: the tip is {chain.height}")
    return height


def block_view(chain: ChainDB, height: int | None = None) -> dict[str, Any]:
    """A main-chain block (default: the tip) as JSON: ``hash``, ``header``, ``txs`` (each
    with its ``id``).

    Raises:
        BadRequest: no block at that height.
    """
    from ledger.codec import to_json
    from ledger.types import block_hash

    block = chain.block_at(_height(chain, height))
    doc = {"hash": block_hash(block.header).hex(), **to_json(block)}
    for tx, entry in zip(block.txs, doc["txs"]):
        entry["id"] = tx_hash(tx).hex()
    return doc


def proof_view(chain: ChainDB, txid: str) -> dict[str, Any]:
    """The inclusion proof of a receipt (against the tip's log root) or any other
    transaction (against its block's transactions root), as `pnode proof` writes it.

    Args:
        txid: the id in hex, or a prefix of it (`find_by_prefix`; a prefix is
            looked for in every main-chain block).

    Raises:
        ProofError: not hex, or no receipt or main-chain transaction (or more
            than one) has that id.
    """
    from ledger.codec import to_json
    from node.chain.jobviews import find_by_prefix
    from node.errors import ProofError

    wanted = find_by_prefix(txid, lambda: (tx_hash(tx) for block in chain.iter_blocks()
                                           for tx in block.txs), "transaction", ProofError)
    try:
        found = chain.receipt_proof(wanted) if chain.receipt_index(wanted) is not None else \
            chain.tx_proof(wanted)
    except KeyError:
        raise ProofError(f"{txid} is neither in this chain's log nor in a main-chain block "
                         "(not yet included?)") from None
    return {"kind": type(found).__name__, **to_json(found)}


def verify_view(chain: ChainDB, upto: int | None = None,
                progress: Any = None) -> dict[str, Any]:
    """Re-validate the main chain from genesis (up to block ``upto``), its supply and state.

    A running node does it in its chain thread: it follows no new block
    meanwhile (seconds for thousands of blocks).

    Returns:
        ``ok`` and ``height`` and ``tip`` (hex) when it holds; else ``ok``
        false with ``error`` (the error's type) and ``reason``.

    Raises:
        BadRequest: ``upto`` is above the tip.
    """
    from ledger.errors import StoreError, ValidationError

    height = _height(chain, upto)
    try:
        chain.verify_chain(progress=progress, upto=upto)
    except (ValidationError, StoreError) as exc:
        return {"ok": False, "error": type(exc).__name__, "reason": str(exc)}
    return {"ok": True, "height": height, "tip": chain.hash_at(height).hex()}


def params_view(chain: ChainDB) -> dict[str, Any]:
    """The chain's parameters (`ledger.types.Params`; amounts in base units, keys in hex)."""
    params = Overlay(chain.state).params()
    out = {name: getattr(params, name) for name in params.__dataclass_fields__}
    out["job_authority"] = params.job_authority.hex()
    return {"chain_id": chain.chain_id, "height": chain.height, "params": out}


def _id32(text: Any, what: str) -> bytes:
    """A 32-byte id (an address, a transaction id) from its 64 hex digits.

    Raises:
        BadRequest: anything else.
    """
    try:
        raw = bytes.fromhex(text) if isinstance(text, str) else b""
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise BadRequest(f'"{text}" is not {what} (64 hex digits)')
    return raw


def history_view(chain: ChainDB, address: str) -> dict[str, Any]:
    """`node.chain.history.history_rows` of the account ``address`` (hex), with the tip's
    height and the account's balance.

    Raises:
        BadRequest: ``address`` is not 64 hex digits.
    """
    from node.chain.history import balance_of, history_rows

    account = _id32(address, "an address")
    return {"address": account.hex(), "height": chain.height,
            "balance": balance_of(chain, account), "history": history_rows(chain, account)}
