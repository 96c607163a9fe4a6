"""A node's data directory: its keys, its genesis file and its chain store.

    D/genesis.json     the chain's genesis (JSON form of ledger.types.Genesis)
    D/chain/           LevelDB store of the chain (ledger.chaindb)
    D/chain.tip        the last tip the running node stored: {"height", "hash"}
    D/node.key         the node key (hex seed, mode 0600): signs blocks and receipts
    D/peer.key         the libp2p identity key (hex seed, mode 0600)
    D/wallet.json      the default wallet key, encrypted (node.datadir.keys)
    D/wallets/N.json   further wallet keys made by ``pwallet create --name N``
    D/peers/           LevelDB peer book: peers this node reached (node.datadir.peerbook)
    D/pol/             what a mining node keeps for the audits of its units
                       (node.pol.store.DirStore, specs/pol.md 8)

The node key is hot (the node signs with it unattended) but cannot spend:
coins belong to the wallet key, which stays encrypted at rest.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import fields
from pathlib import Path

from ledger.chaindb import ChainDB
from ledger.codec import from_json, to_json
from ledger.crypto import SigningKey
from ledger.errors import DecodeError, LedgerError, StoreCorruptError, StoreLockedError
from ledger.store import LevelDBStore
from ledger.types import Genesis
from node.errors import ChainCorruptError, ChainLockedError, DataDirError
from node.datadir.peerbook import PeerBook
from node.datadir.keys import read_seed_file, write_key_file, write_private, write_seed_file

log = logging.getLogger(__name__)

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
    tip_file = property(lambda self: self.path / "chain.tip")
    pol_dir = property(lambda self: self.path / "pol")
    peers_dir = property(lambda self: self.path / "peers")

    def open_peer_book(self) -> PeerBook:
        """The peer book ``D/peers`` (`node.datadir.peerbook.PeerBook`), created when missing.

        Raises:
            DataDirError: it is locked or cannot be opened.
        """
        try:
            return PeerBook(self.peers_dir)
        except LedgerError as exc:
            raise DataDirError(f"cannot open the peer book {self.peers_dir}: {exc}") from None

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

    def open_chain(self, *, strict: bool = False) -> ChainDB:
        """Open the chain store (a node holds it exclusively).

        When LevelDB's recovery had to drop damaged records to open it, one
        warning line says so (the blocks lost come again from peers).

        Args:
            strict: refuse such a store instead (`pnode start --strict`).

        Raises:
            DataDirError: not initialised, locked by a running node, or
                genesis.json is not the genesis the store was made with.
            ChainCorruptError: the store is damaged, or (strict) recovery
                would drop records.
        """
        self.require()
        genesis = self.read_genesis()
        try:
            store = LevelDBStore(self.chain_dir, create=False, strict=strict)
        except StoreCorruptError as exc:
            raise ChainCorruptError(f"the chain in {self.chain_dir} is damaged: {exc}") from None
        except StoreLockedError as exc:
            raise ChainLockedError(f"cannot open the chain in {self.chain_dir}: {exc}") from None
        except LedgerError as exc:
            raise DataDirError(f"cannot open the chain in {self.chain_dir}: {exc}") from None
        try:
            chain = ChainDB(store)
        except LedgerError as exc:
            store.close()
            raise ChainCorruptError(f"the chain in {self.chain_dir} is damaged: {exc}") from None
        if chain.genesis != genesis:
            differ = [f.name for f in fields(Genesis)
                      if getattr(genesis, f.name) != getattr(chain.genesis, f.name)]
            chain.close()
            raise DataDirError(
                f"{self.genesis_file} is not the genesis of the chain stored in {self.chain_dir} "
                f"({', '.join(differ)} differ; chain id {genesis.chain_id!r} in the file, "
                f"{chain.genesis.chain_id!r} in the store): restore the file, or `pnode init` "
                "a fresh data dir for that chain")
        lost = store.recovery_loss or self._tip_lost(chain)
        if lost and strict:
            chain.close()
            raise ChainCorruptError(f"{lost} (refused in strict mode)")
        if lost:
            log.warning("%s; the chain now ends at height %d (later blocks come again from "
                        "peers)", lost, chain.height)
        return chain

    def write_tip_marker(self, height: int, tip_hash: bytes) -> None:
        """Note the tip the store just made durable in ``chain.tip`` (see `open_chain`).

        Written after the store's own durable write and not fsynced itself,
        so it may lag the store but never lead it: a marker whose block the
        store lacks means the store lost blocks. Best effort: a failure to
        write it (a full disk) is the store's to report.
        """
        tmp = self.tip_file.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps({"height": height, "hash": tip_hash.hex()}) + "\n")
            os.replace(tmp, self.tip_file)
        except OSError as exc:
            log.debug("tip marker not written: %s", exc)

    def _tip_lost(self, chain: ChainDB) -> str | None:
        """What the store lost since the tip marker was written; None when nothing."""
        try:
            doc = json.loads(self.tip_file.read_text())
            height, tip_hash = int(doc["height"]), bytes.fromhex(doc["hash"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring the unreadable tip marker %s: %s", self.tip_file, exc)
            return None
        if chain.has_block(tip_hash):
            return None
        return (f"the chain store lost blocks: it held block {height} "
                f"{tip_hash.hex()[:16]} when last written ({self.tip_file}), and no longer does")

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
        self.tip_file.unlink(missing_ok=True)  # a marker of another chain would cry loss
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
