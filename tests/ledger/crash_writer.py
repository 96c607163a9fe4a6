"""Child process for the crash test: append blocks to a LevelDB chain forever.

Run as ``python -m tests.ledger.crash_writer DIR``. Opens (or creates) the
chain in DIR, then builds and adds blocks of signed transfers and receipts
as fast as it can, printing ``committed <height> <hash>`` after each
``add_block`` returns. The parent kills it with SIGKILL at random moments.
"""

from __future__ import annotations

import sys

from ledger.chaindb import ChainDB
from ledger.state import ACCOUNT
from ledger.store import LevelDBStore
from tests.ledger.chainkit import make_net, new_db, next_block, receipts_due


def main(path: str) -> None:
    net = make_net(n_nodes=3, n_users=4, with_job=True)
    store = LevelDBStore(path)
    db = ChainDB(store) if store.get(b"v1/tip") is not None else new_db(net, store)
    print(f"open {db.height} {db.tip_hash.hex()}", flush=True)
    while True:
        txs = receipts_due(db, net)
        for i, user in enumerate(net.users):
            nonce = db.state.get(ACCOUNT + user.public).nonce
            txs.append(net.transfer(user, net.users[(i + 1) % 4].public, 1, nonce=nonce))
        applied = next_block(db, net, txs)
        db.add_block(applied.block, now_ms=None)
        print(f"committed {db.height} {db.tip_hash.hex()}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
