"""A node's data directory: its keys, its genesis file and its chain store.

    D/genesis.json     the chain's genesis (JSON form of ledger.types.Genesis)
    D/chain/           LevelDB store of the chain (ledger.chaindb)
    D/node.key         the node key (hex seed, mode 0600): signs blocks and receipts
    D/peer.key         the libp2p identity key (hex seed, mode 0600)
    D/wallet.json      the default wallet key, encrypted (node.keys)
    D/wallets/N.json   further wallet keys made by ``pwallet create --name N``

The node key is hot (the node signs with it unattended) but cannot spend:
coins belong to the wallet key, which stays encrypted at rest.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ledger.chaindb import ChainDB
from ledger.codec import from_json, to_json
from ledger.crypto import SigningKey
from ledger.errors import DecodeError, LedgerError
from ledger.store import LevelDBStore
from ledger.types import Genesis
from node.errors import ChainCorruptError, DataDirError
from node.keys import read_seed_file, write_key_file, write_private, write_seed_file

DEFAULT_DATA_DIR = Path(os.environ.get("PNODE_DATA_DIR", Path.home() / ".pnode"))


class DataDir:
    """Paths and loaders for one data directory."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path).expanduser()

    genesis_file = property(lambda self: self.path / "genesis.json")
    chain_dir = property(lambda self: self.path / "chain")
    node_key_file = property(lambda self: self.path / "node.key")
    peer_key_file = property(lambda self: self.path / "peer.key")
    wallet_file = property(lambda self: self.path / "wallet.json")

    def wallet_path(self, name: str | None) -> Path:
        """The key file of wallet ``name`` (None: the default wallet)."""
        if name is None:
            return self.wallet_file
        if not name or "/" in name or name.startswith("."):
            raise DataDirError(f"bad wallet name {name!r}: use letters, digits, '-' or '_'")
        return self.path / "wallets" / f"{name}.json"

    def exists(self) -> bool:
        return self.genesis_file.exists() and self.chain_dir.exists()

    def require(self) -> None:
        """Raises DataDirError unless this directory holds an initialised node."""
        if not self.path.is_dir():
            raise DataDirError(f"data dir {self.path} does not exist (run `pnode init` first)")
        if not self.exists():
            raise DataDirError(f"{self.path} is not an initialised data dir (run `pnode init`)")

    def open_chain(self) -> ChainDB:
        """Open the chain store (a node holds it exclusively).

        Raises:
            DataDirError: not initialised, locked by a running node, or corrupt.
        """
        self.require()
        try:
            store = LevelDBStore(self.chain_dir, create=False)
        except LedgerError as exc:
            raise DataDirError(f"cannot open the chain in {self.chain_dir}: {exc}") from None
        try:
            return ChainDB(store)
        except LedgerError as exc:
            store.close()
            raise ChainCorruptError(f"the chain in {self.chain_dir} is damaged: {exc}") from None

    def initialise(self, genesis: Genesis, node_key: SigningKey, peer_key: SigningKey,
                   wallet_seed: bytes, passphrase: str) -> bytes:
        """Make this a node's data dir: its keys, the genesis file and the chain store.

        Args:
            genesis: the chain this node follows.
            node_key, peer_key: written as hex seed files (mode 0600).
            wallet_seed: the wallet key's seed, written encrypted under
                ``passphrase``.
            passphrase: unlocks the wallet key file.

        Returns:
            The genesis block's hash.

        Raises:
            DataDirError: already initialised, or a file exists.
            LedgerError: the genesis is not valid (the store is closed again).
        """
        if self.genesis_file.exists() or self.chain_dir.exists():
            raise DataDirError(f"{self.path} is already initialised")
        self.path.mkdir(parents=True, exist_ok=True)
        write_seed_file(self.node_key_file, node_key)
        write_seed_file(self.peer_key_file, peer_key)
        write_key_file(self.wallet_file, wallet_seed, passphrase)
        write_genesis_file(self.genesis_file, genesis)
        # The store's own `with`: it must close even when create() refuses the genesis.
        with LevelDBStore(self.chain_dir) as store:
            return ChainDB.create(store, genesis).tip_hash

    def read_genesis(self) -> Genesis:
        return read_genesis_file(self.genesis_file)

    def node_key(self) -> SigningKey:
        return read_seed_file(self.node_key_file)

    def peer_key(self) -> SigningKey:
        return read_seed_file(self.peer_key_file)


def read_genesis_file(path: Path) -> Genesis:
    """Load a genesis JSON file.

    Raises:
        DataDirError: missing, not JSON, or not a valid genesis.
    """
    try:
        doc = json.loads(Path(path).read_text())
        return from_json(doc, Genesis)
    except FileNotFoundError:
        raise DataDirError(f"genesis file {path} does not exist") from None
    except (OSError, ValueError, DecodeError) as exc:
        raise DataDirError(f"genesis file {path} is not valid: {exc}") from None


def write_genesis_file(path: Path, genesis: Genesis) -> None:
    write_private(path, json.dumps(to_json(genesis), indent=2) + "\n", mode=0o644)
