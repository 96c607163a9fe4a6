"""A node's data dir on disk: its layout, the chain store it opens, and its key files.

Sub-modules: `layout` (`DataDir`: the files of ``D``, the chain store opened
exclusively, the genesis file), `peerbook` (`PeerBook`: the peers reached before, in
``D/peers``) and `keys` (key files: seeds sealed with a
passphrase, public keys, files written private and atomically). Nothing
here runs a network or a model.
"""

from node.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "node.datadir.layout": ("DEFAULT_DATA_DIR", "DataDir", "read_genesis_file",
                            "write_genesis_file"),
    "node.datadir.peerbook": ("MAX_PEERS", "PEER_PREFIX", "PeerBook"),
    "node.datadir.keys": ("DEFAULT_N", "KEY_LEN", "PUBLIC_KEY_LEN", "SEED_LEN", "decrypt_seed",
                          "encrypt_seed", "read_key_file", "read_public_key", "read_seed_file",
                          "write_key_file", "write_private", "write_seed_file"),
})
