"""The node's chain: blocks, side branches, the tip state, the log and the mempool.

``ChainDB`` owns one ``KeyValueStore``. Each accepted block is written in one
atomic batch (block, metadata, state changes, undo record, log leaves, height
index, tip), and so is a whole reorg, so a process killed at any instant
reopens on a consistent tip. On open the tip state is loaded into memory and
its root checked against the tip header: a store that disagrees with itself
is refused rather than served.

Side branches are stored but not applied. When a block arrives on a side
branch, the state at its parent is rebuilt in memory (undo records back to
the fork point, then the branch replayed) and the block is fully validated.
If the branch becomes heavier than the main chain, the switch is one batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from ledger import merkle, schema
from ledger.codec import decode, encode
from ledger.errors import (
    BadJob, DecodeError, ForkTooDeep, StoreCorruptError, UnknownParent, ValidationError,
    in_context,
)
from ledger.proofs import ReceiptProof, TxProof
from ledger.rules import apply_tx
from ledger.schedule import is_better_tip
from ledger.state import MemoryState, Overlay, StateReader, decode_record, flatten, state_root
from ledger.store import KeyValueStore
from ledger.transition import Applied, Context, build_block, genesis_block, validate_block
from ledger.tab import MIN_TAB, OpenTab
from ledger.types import (
    TX_TYPES, Block, Genesis, Header, Job, Receipt, block_hash, encode_block, nonce_owner, tx_hash,
)

EXTENDED, REORG, SIDE, KNOWN = "extended", "reorg", "side", "known"

#: Deepest reorg a node performs. Attack note: replaying a side branch costs
#: its depth in block validations for each block that arrives on it, so an
#: unbounded depth lets any producer make every node do quadratic work; and
#: a branch forking further back than this is a history rewrite, not a race.
MAX_REORG_DEPTH = 64


@dataclass(frozen=True, slots=True)
class AddResult:
    """What ``add_block`` did: extended the tip, switched branches, or stored a side block."""

    status: str
    hash: bytes
    height: int
    reorg_depth: int = 0


class ChainDB:
    """A chain stored in a key-value store, with its tip state in memory."""

    def __init__(self, store: KeyValueStore, *, sync: bool = True):
        """Open an existing chain. Use ``ChainDB.create`` for a new one.

        Raises:
            StoreCorruptError: no chain in the store, or a tip whose state
                does not match its header.
        """
        self.store = store
        self.sync = sync
        raw_genesis = store.get(schema.GENESIS)
        tip = store.get(schema.TIP)
        if raw_genesis is None or tip is None:
            raise StoreCorruptError("the store holds no chain (run `pnode init` first)")
        try:
            self.genesis: Genesis = decode(raw_genesis, Genesis)
            self.tip_hash: bytes = tip
            self.tip: Header = self.block(tip).header
            self.state = MemoryState()
            self.state.apply({k[len(schema.STATE):]: decode_record(k[len(schema.STATE):], v)
                              for k, v in store.iterate(schema.STATE)})
        except (DecodeError, KeyError) as exc:
            raise StoreCorruptError(f"undecodable chain record: {exc}") from None
        if state_root(self.state) != self.tip.state_root:
            raise StoreCorruptError(f"state does not match the tip at height {self.tip.height}")

    @classmethod
    def create(cls, store: KeyValueStore, genesis: Genesis, *, sync: bool = True) -> "ChainDB":
        """Write block 0 of a new chain to an empty store.

        Raises:
            BadGenesis: the genesis cannot start a chain.
            StoreCorruptError: the store already holds a chain.
        """
        if store.get(schema.TIP) is not None:
            raise StoreCorruptError("the store already holds a chain")
        applied = genesis_block(genesis)
        ops = _block_ops(applied, weight=applied.weight)
        ops += [(schema.GENESIS, encode(genesis)), (schema.height_key(0), applied.hash),
                (schema.TIP, applied.hash)]
        store.write(ops, sync=sync)
        return cls(store, sync=sync)

    def close(self) -> None:
        """Close the store this chain lives in; calling it again does nothing.

        A closed store's methods raise StoreClosedError, so every read of
        this ChainDB does too after close() (except close() itself).
        """
        # The store contract makes close() idempotent, so this can delegate.
        self.store.close()

    def __enter__(self) -> "ChainDB":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- reading ----------------------------------------------------------------

    @property
    def height(self) -> int:
        return self.tip.height

    @property
    def chain_id(self) -> str:
        return self.genesis.chain_id

    def block(self, block_hash: bytes) -> Block:
        raw = self.store.get(schema.block_key(block_hash))
        if raw is None:
            raise KeyError(block_hash.hex())
        return decode(raw, Block)

    def has_block(self, block_hash: bytes) -> bool:
        return self.store.get(schema.meta_key(block_hash)) is not None

    def meta(self, block_hash: bytes) -> schema.BlockMeta:
        raw = self.store.get(schema.meta_key(block_hash))
        if raw is None:
            raise KeyError(block_hash.hex())
        return decode(raw, schema.BlockMeta)

    def hash_at(self, height: int) -> bytes | None:
        """Hash of the main-chain block at ``height``, or None above the tip."""
        return self.store.get(schema.height_key(height))

    def block_at(self, height: int) -> Block:
        block_hash = self.hash_at(height)
        if block_hash is None:
            raise KeyError(f"no block at height {height} (tip is {self.height})")
        return self.block(block_hash)

    def undo_at(self, height: int) -> dict[bytes, Any]:
        """What main-chain block ``height`` (>= 1) wrote over: each key's record before it
        (None: the block created it).

        Raises:
            KeyError: no block at that height.
            StoreCorruptError: its undo record is missing.
        """
        block_hash = self.hash_at(height)
        if block_hash is None or height < 1:
            raise KeyError(f"no block with an undo record at height {height} (tip is {self.height})")
        return self._undo(block_hash)

    def log_leaves(self, size: int | None = None) -> list[bytes]:
        """The first ``size`` leaves of the receipt log (all by default)."""
        size = self.tip.log_size if size is None else size
        leaves = [v for _, v in self.store.iterate(schema.LOG)][:size]
        if len(leaves) != size:
            raise StoreCorruptError(f"log holds {len(leaves)} leaves, header says {size}")
        return leaves

    def receipt_index(self, receipt_hash: bytes) -> int | None:
        raw = self.store.get(schema.receipt_key(receipt_hash))
        return None if raw is None else int.from_bytes(raw, "big")

    def receipt_proof(self, receipt_hash: bytes) -> ReceiptProof:
        """A proof that a receipt is in the log committed by the tip header.

        Raises:
            KeyError: the receipt is not in the main chain's log.
        """
        index = self.receipt_index(receipt_hash)
        if index is None:
            raise KeyError(f"receipt {receipt_hash.hex()} is not in the log")
        leaves = self.log_leaves()
        receipt = decode(leaves[index], Receipt)
        path = merkle.inclusion_proof(leaves, index)
        return ReceiptProof(receipt, index, tuple(path), self.tip)

    def tx_proof(self, txid: bytes) -> TxProof:
        """A proof that a transaction is in a main-chain block (searched from the tip down).

        Raises:
            KeyError: no main-chain block holds it.
        """
        for height in range(self.height, 0, -1):
            block = self.block_at(height)
            encoded = [encode(tx) for tx in block.txs]
            for index, raw in enumerate(encoded):
                if tx_hash(block.txs[index], raw) == txid:
                    return TxProof(block.txs[index], index, len(encoded),
                                   tuple(merkle.inclusion_proof(encoded, index)), block.header)
        raise KeyError(f"transaction {txid.hex()} is in no main-chain block")

    # -- writing ----------------------------------------------------------------

    def build(self, txs: Sequence[Any], key, time_ms: int) -> Applied:
        """Build (but do not add) the next block on the tip."""
        return build_block(self.state, self.tip, txs, key, time_ms)

    def add_block(self, block: Block, now_ms: int | None) -> AddResult:
        """Validate a block and store it, switching branches when it wins.

        Raises:
            UnknownParent: the parent is not stored (sync it first).
            ValidationError: the block breaks a rule (nothing is written).
        """
        applied_hash = block_hash(block.header)
        if self.has_block(applied_hash):
            return AddResult(KNOWN, applied_hash, block.header.height)
        parent_hash = block.header.prev_hash
        if not self.has_block(parent_hash):
            raise UnknownParent(f"parent {parent_hash.hex()[:16]}.. of height "
                                f"{block.header.height} is unknown")
        parent = self.block(parent_hash).header
        base, branch = self._state_at(parent_hash)
        applied = validate_block(base, parent, block, now_ms)
        weight = self.meta(parent_hash).weight + applied.weight
        if parent_hash == self.tip_hash:
            self._extend(applied, weight)
            return AddResult(EXTENDED, applied.hash, block.header.height)
        if not is_better_tip(weight, applied.hash, self.meta(self.tip_hash).weight, self.tip_hash):
            self.store.write(_block_ops(applied, weight, stored_only=True), sync=self.sync)
            return AddResult(SIDE, applied.hash, block.header.height)
        depth = self._reorg([*branch, applied], weight)
        return AddResult(REORG, applied.hash, block.header.height, depth)

    def _extend(self, applied: Applied, weight: int) -> None:
        ops = _block_ops(applied, weight)
        ops += [(schema.state_key(k), None if v is None else encode(v))
                for k, v in applied.writes.items()]
        ops += [(schema.height_key(applied.block.header.height), applied.hash),
                (schema.TIP, applied.hash)]
        ops += [(schema.mempool_key(tx_hash(tx, raw)), None)
                for tx, raw in zip(applied.block.txs, applied.encoded_txs)]
        self.store.write(ops, sync=self.sync)
        self.state.apply(applied.writes)
        self.tip_hash, self.tip = applied.hash, applied.block.header
        self._prune_mempool()

    def _prune_mempool(self) -> None:
        """Drop queued transactions that can never apply again (specs/ledger.md 7, note 4).

        Three kinds, all for good: a transaction whose nonce the account has
        used already (nonces only grow: the loser of a same-nonce race, a
        resent one), a tab whose expiry is now under `MIN_TAB` blocks away
        (a stale tab: heights only grow), and a job the rules refuse whatever the state (`BadJob`:
        too many steps, units or a spec that do not fit). Everything else
        stays: a receipt, verdict or appeal that fails now may fit after the
        next block. Attack note: both once stayed for good, and every
        admission re-checks the whole queue.
        """
        st = Overlay(self.state)
        ctx = Context(height=self.height + 1, prev_hash=self.tip_hash, chain_id=self.chain_id)
        dead = []
        for key, raw in self.store.iterate(schema.MEMPOOL):
            tx = decode(raw, TX_TYPES)
            owner = nonce_owner(tx)
            if owner is not None and tx.nonce < st.account(owner).nonce:
                dead.append(key)
            elif isinstance(tx, OpenTab) and tx.expiry_height - ctx.height < MIN_TAB:
                dead.append(key)  # heights only grow: its life stays too short
            elif isinstance(tx, Job):
                try:
                    apply_tx(Overlay(self.state), ctx, tx, raw)
                except BadJob:
                    dead.append(key)
                except ValidationError:
                    pass  # funds or nonce: may fit later
        if dead:
            self.store.write([(key, None) for key in dead], sync=self.sync)

    def _state_at(self, block_hash: bytes) -> tuple[StateReader, list[Applied]]:
        """The state after ``block_hash``, and the side-branch blocks replayed to get it."""
        if block_hash == self.tip_hash:
            return self.state, []
        fork, side = self._fork_point(block_hash)
        depth = self.height - self.meta(fork).height
        if depth > MAX_REORG_DEPTH:
            raise ForkTooDeep(f"branch forks {depth} blocks below the tip; at most "
                              f"{MAX_REORG_DEPTH} are reorganised")
        rewound = Overlay(self.state)
        rewound.writes = flatten(self._undo(h) for h in self._main_since(fork))
        state: StateReader = rewound
        branch: list[Applied] = []
        for side_hash in side:
            blk = self.block(side_hash)
            parent = self.block(blk.header.prev_hash).header
            applied = validate_block(state, parent, blk, None)
            layer = Overlay(state)
            layer.writes = dict(applied.writes)
            state = layer
            branch.append(applied)
        return state, branch

    def _reorg(self, branch: list[Applied], weight: int) -> int:
        """Switch the main chain to ``branch`` (fork point .. new tip) in one batch.

        Transactions of the abandoned blocks go back to the mempool (the
        producer drops those that no longer apply); those of the new branch
        leave it.
        """
        fork_hash = branch[0].block.header.prev_hash
        old_main = self._main_since(fork_hash)  # tip first
        fork_header = self.block(fork_hash).header
        ops: list[tuple[bytes, bytes | None]] = []
        for old_hash in old_main:
            old = self.block(old_hash)
            ops += [(schema.mempool_key(tx_hash(tx)), encode(tx)) for tx in old.txs]
            ops.append((schema.undo_key(old_hash), None))
            ops.append((schema.height_key(old.header.height), None))
            ops += [(schema.receipt_key(tx_hash(tx)), None)
                    for tx in old.txs if isinstance(tx, Receipt)]
        ops += [(schema.log_key(i), None) for i in range(fork_header.log_size, self.tip.log_size)]
        # Final state = rewound base plus the branch: every key either side touched.
        final = Overlay(self.state)
        final.writes = flatten([flatten(self._undo(h) for h in old_main),
                                *(a.writes for a in branch)])
        for i, applied in enumerate(branch):
            parent_weight = self.meta(applied.block.header.prev_hash).weight
            block_weight = weight if i == len(branch) - 1 else parent_weight + applied.weight
            ops += _block_ops(applied, block_weight)
            ops.append((schema.height_key(applied.block.header.height), applied.hash))
            ops += [(schema.mempool_key(tx_hash(tx, raw)), None)
                    for tx, raw in zip(applied.block.txs, applied.encoded_txs)]
        ops += [(schema.state_key(k), None if v is None else encode(v))
                for k, v in final.writes.items()]
        ops.append((schema.TIP, branch[-1].hash))
        self.store.write(ops, sync=self.sync)
        self.state.apply(final.writes)
        self.tip_hash, self.tip = branch[-1].hash, branch[-1].block.header
        self._prune_mempool()
        return len(old_main)

    def _undo(self, block_hash: bytes) -> dict[bytes, Any]:
        raw = self.store.get(schema.undo_key(block_hash))
        if raw is None:
            raise StoreCorruptError(f"main-chain block {block_hash.hex()[:16]}.. has no undo")
        undo = decode(raw, schema.Undo)
        return {e.key: decode_record(e.key, e.value) if e.value else None for e in undo.entries}

    def _main_since(self, ancestor: bytes) -> list[bytes]:
        """Main-chain hashes from the tip down to (not including) ``ancestor``."""
        out, cursor = [], self.tip_hash
        while cursor != ancestor:
            out.append(cursor)
            cursor = self.meta(cursor).parent
        return out

    def _fork_point(self, block_hash: bytes) -> tuple[bytes, list[bytes]]:
        """The main-chain ancestor of ``block_hash`` and the side blocks after it."""
        side, cursor = [], block_hash
        while True:
            meta = self.meta(cursor)
            if self.hash_at(meta.height) == cursor:
                return cursor, side[::-1]
            side.append(cursor)
            cursor = meta.parent

    # -- mempool ----------------------------------------------------------------------

    def admit(self, tx: Any) -> bytes:
        """Check a transaction against the tip state and the mempool, then queue it.

        Returns:
            The transaction's hash.

        Raises:
            ValidationError: the transaction would not fit in the next block
                (after the transactions already queued).
        """
        st, ctx = self.pending_state()
        apply_tx(st, ctx, tx)
        return self.add_to_mempool(tx)

    def pending_state(self) -> tuple[Overlay, Context]:
        """The state the next block would start from with the mempool applied, and its context.

        What a new transaction is checked against (`admit`), and what a
        serving node vets a session's tab against before it seats it.
        """
        st = Overlay(self.state)
        ctx = Context(height=self.height + 1, prev_hash=self.tip_hash, chain_id=self.chain_id)
        for queued in self.mempool():
            try:
                apply_tx(st, ctx, queued)
            except ValidationError:
                continue  # stale; the producer will drop it
        return st, ctx

    def add_to_mempool(self, tx: Any) -> bytes:
        """Queue a transaction for a later block, unchecked; returns its hash."""
        h = tx_hash(tx)
        self.store.write([(schema.mempool_key(h), encode(tx))], sync=self.sync)
        return h

    def mempool(self) -> list[Any]:
        """Queued transactions, in an order a block can take them: by nonce.

        Receipts and verdicts (no nonce) come first; each account's
        transactions come in nonce order, so none is dropped for a gap.
        """
        txs = [decode(v, TX_TYPES) for _, v in self.store.iterate(schema.MEMPOOL)]
        return sorted(txs, key=lambda tx: getattr(tx, "nonce", -1))

    # -- audit ------------------------------------------------------------------------

    def verify_chain(self, progress: Callable[[int], None] | None = None,
                     upto: int | None = None) -> None:
        """Re-validate every main-chain block from genesis, and the stored state.

        Args:
            progress: called with each height once it is validated.
            upto: stop after this height (the stored-state check needs the tip).

        Raises:
            ValidationError: a block breaks a rule; the message starts with its height.
            StoreCorruptError: the stored chain or state disagree with the replay.
        """
        applied = genesis_block(self.genesis)
        if applied.hash != self.hash_at(0):
            raise StoreCorruptError("height 0: block 0 does not match the genesis")
        state = MemoryState(applied.writes)
        parent = applied.block.header
        last = self.height if upto is None else min(upto, self.height)
        for height in range(1, last + 1):
            block = self.block_at(height)
            try:
                applied = validate_block(state, parent, block, None)
            except ValidationError as exc:
                raise in_context(exc, f"height {height}") from None
            state.apply(applied.writes)
            parent = block.header
            if progress:
                progress(height)
        if last < self.height:
            return
        if state_root(state) != state_root(self.state):
            raise StoreCorruptError("the stored tip state differs from the replayed one")
        if merkle.merkle_root(self.log_leaves()) != self.tip.log_root:
            raise StoreCorruptError("the stored receipt log differs from the tip header")

    def iter_blocks(self) -> Iterator[Block]:
        for height in range(self.height + 1):
            yield self.block_at(height)


def _block_ops(applied: Applied, weight: int, *, stored_only: bool = False) -> list:
    """Store ops for a block; with its undo, log leaves and receipt index unless side-only."""
    h = applied.block.header
    meta = schema.BlockMeta(h.height, h.prev_hash, schema.weight_bytes(weight), applied.rank)
    ops: list[tuple[bytes, bytes | None]] = [
        (schema.block_key(applied.hash), encode_block(applied.block.header, applied.encoded_txs)),
        (schema.meta_key(applied.hash), encode(meta)),
    ]
    if stored_only:
        return ops
    undo = schema.Undo(tuple(
        schema.UndoEntry(k, b"" if v is None else encode(v)) for k, v in sorted(applied.undo.items())
    ))
    ops.append((schema.undo_key(applied.hash), encode(undo)))
    for i, leaf in enumerate(applied.log_appends):
        index = applied.log_start + i
        ops.append((schema.log_key(index), leaf))
        ops.append((schema.receipt_key(tx_hash(None, leaf)), schema.u64(index)))
    if h.height == 0:  # genesis state comes with block 0
        ops += [(schema.state_key(k), encode(v)) for k, v in applied.writes.items() if v is not None]
    return ops
