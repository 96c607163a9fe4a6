"""The state transition: what a block may contain and what it does.

``validate_block`` checks a received block against its parent's state;
``build_block`` makes one from candidate transactions (dropping the ones that
fail); ``genesis_block`` starts a chain. All three run the same rules, in
this order, so producer and validators always agree:

1. header: chain id, height, parent hash, producer rank and time, signature,
   and the producer's VRF proof, whose output becomes the block's beacon
   (the audit draws of step 2b read the parent's beacon first);
2. the producer and every higher-ranked producer it skipped count as served;
3. the draws due (audits, appeals, spot cases' verifiers); pending rewards
   whose challenge window has closed are paid (minted, or out of a paid
   job's deposit), spot cases whose vote window closed are judged; tabs that expired give their locked rest
   back to their clients; finished jobs with no receipt pending give the
   rest of their deposit back to their creators;
4. assignments past their deadline pass to the next-longest waiter;
5. transactions, in block order (each checks everything before it writes,
   so a rejected transaction leaves no trace);
6. the training job's open step, once complete, closes and the next is
   assigned (the next job's, once it is finished: one job at a time);
7. the supply invariant, then the log, state and txs roots.

Pure: no clock (the caller passes ``now_ms``), no I/O, no randomness.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from ledger import audit, beacon, merkle, schedule
from ledger.codec import encode
from ledger.crypto import ZERO32, SigningKey
from ledger.errors import (
    BadGenesis, BadLogRoot, BadSignature, BadStateRoot, BadTime, BadTxsRoot, TimeInFuture,
    TooManyTxs, ValidationError, WrongChainId, WrongHeight, WrongPrevHash, WrongProducer,
    in_context,
)
from ledger.rules import (
    U64_MAX, apply_tx, candidates, draw_audits, open_steps, reassign_timeouts, settle_pending,
)
from ledger.jobrules import refund_finished
from ledger.spotrules import draw_spot_cases, settle_spot_cases
from ledger.tabrules import refund_expired
from ledger.state import (
    KEY_BEACON, KEY_LOG, KEY_PARAMS, KEY_SUPPLY, NODE, MemoryState, Overlay, StateReader, check_supply,
    state_root,
)
from ledger.types import (
    MAX_BLOCK_BYTES, ZERO_SIG, Block, Genesis, Header, block_hash, sign, signature_ok,
)
from ledger.records import Beacon, LogState, Supply


@dataclass(slots=True)
class Context:
    """What the rules need to know about the block being applied."""

    height: int
    prev_hash: bytes
    chain_id: str
    log_appends: list[bytes] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Applied:
    """A block that passed (or was built by) the rules, with its effects."""

    block: Block
    hash: bytes
    writes: dict[bytes, Any]
    undo: dict[bytes, Any]
    log_appends: tuple[bytes, ...]
    log_start: int
    rank: int
    weight: int
    encoded_txs: tuple[bytes, ...]  # encode(tx) of each tx, in block order


def genesis_block(genesis: Genesis) -> Applied:
    """Block 0 and the state it creates.

    Raises:
        BadGenesis: duplicate allocations, an empty producer set, or a bad
            registration or job (with the underlying reason).
    """
    _check_params(genesis.params)
    st = Overlay(MemoryState())
    ctx = Context(height=0, prev_hash=ZERO32, chain_id=genesis.chain_id)
    premine = sum(a.amount for a in genesis.allocations)
    if premine > U64_MAX:
        raise BadGenesis(f"allocations total {premine}, more than a U64 can hold")
    if len({a.account for a in genesis.allocations}) != len(genesis.allocations):
        raise BadGenesis("an account is allocated twice")
    st.put(KEY_PARAMS, genesis.params)
    st.put(KEY_SUPPLY, Supply(premine=premine, minted=0, burned=0))
    st.put(KEY_LOG, LogState(size=0, peaks=()))
    st.put(KEY_BEACON, Beacon(beacon.genesis_beacon(genesis.chain_id)))
    for alloc in genesis.allocations:
        st.put_account(alloc.account, replace(st.account(alloc.account), balance=alloc.amount))
    try:
        for tx in (*genesis.registrations, *genesis.jobs):
            apply_tx(st, ctx, tx)
    except ValidationError as exc:
        raise BadGenesis(f"genesis {type(exc).__name__}: {exc}") from None
    if not candidates(st):
        raise BadGenesis("genesis registers no bonded node, so nobody could produce block 1")
    _finish(st, ctx)
    header = _header(st, ctx, (), time_ms=genesis.time_ms, producer=ZERO32, height=0,
                     vrf_proof=beacon.NO_PROOF)
    block = Block(header=header, txs=())
    return _applied(block, st, ctx, log_start=0, rank=0, encoded=())


#: Largest reward per compute block a chain may set (a million coins).
MAX_REWARD = 10**12
#: Largest max_block_txs a chain may set (Block.txs holds at most 100,000).
MAX_TXS_LIMIT = 100_000


def _check_params(p) -> None:
    """Raises BadGenesis for parameters under which the rules break down."""
    problems = []
    if not 1 <= p.max_block_txs <= MAX_TXS_LIMIT:
        problems.append(f"max_block_txs {p.max_block_txs} not in [1, {MAX_TXS_LIMIT}]")
    if max(p.slash_bps, p.audit_bps, p.recheck_bps) > 10_000:
        problems.append("slash_bps, audit_bps and recheck_bps are basis points: at most 10000")
    if p.unit_timeout < 1 or p.verdict_window < 1 or p.slot_ms < 1:
        problems.append("unit_timeout, verdict_window and slot_ms must be at least 1")
    if p.challenge_window < 3:  # the audit draw comes at height + 2, before the window closes
        problems.append("challenge_window must be at least 3")
    if p.verify_fee > MAX_REWARD:
        problems.append(f"verify_fee {p.verify_fee} is above {MAX_REWARD}")
    if p.cartel_bps >= 10_000:
        problems.append("cartel_bps is the colluding share of nodes: below 10000")
    cheat = audit.economics_problem(p)
    if cheat:
        problems.append(cheat)
    if not 1 <= p.reward <= MAX_REWARD:
        problems.append(f"reward {p.reward} not in [1, {MAX_REWARD}]")
    if problems:
        raise BadGenesis("; ".join(problems))


def validate_block(parent: StateReader, parent_header: Header, block: Block,
                   now_ms: int | None) -> Applied:
    """Check ``block`` against its parent and return its effects.

    Args:
        parent: the state after ``parent_header``'s block.
        parent_header: the header the block must extend.
        block: the block to check.
        now_ms: the local clock, for the "too far in the future" rule; None
            when re-validating history (the rule only guards the live edge).

    Raises:
        ValidationError: a subclass naming the first rule the block breaks.
    """
    h = block.header
    if h.chain_id != parent_header.chain_id:
        raise WrongChainId(f"header chain id {h.chain_id!r}, expected {parent_header.chain_id!r}")
    if h.height != parent_header.height + 1:
        raise WrongHeight(f"height {h.height}, expected {parent_header.height + 1}")
    if h.prev_hash != block_hash(parent_header):
        raise WrongPrevHash(f"prev_hash {h.prev_hash.hex()[:16]}.. is not the parent's hash")
    if not signature_ok(h):
        raise BadSignature(f"header of block {h.height} is not signed by its producer")
    params = parent.get(KEY_PARAMS)
    if now_ms is not None and h.time_ms > now_ms + params.max_future_ms:
        raise TimeInFuture(f"block time {h.time_ms} is more than {params.max_future_ms} ms "
                           f"after local time {now_ms}")
    if len(block.txs) > params.max_block_txs:
        raise TooManyTxs(f"{len(block.txs)} txs, at most {params.max_block_txs}")
    encoded = [encode(tx) for tx in block.txs]
    size = sum(map(len, encoded))
    if size > MAX_BLOCK_BYTES:
        raise TooManyTxs(f"{size} bytes of transactions, at most {MAX_BLOCK_BYTES}")
    if h.txs_root != merkle.merkle_root(encoded):
        raise BadTxsRoot("txs_root does not match the block's transactions")
    st, ctx, rank = _begin(parent, parent_header, h.producer, h.time_ms)
    st.put(KEY_BEACON, Beacon(beacon.beacon_from_proof(
        h.producer, parent.get(KEY_BEACON).value, h.height, h.vrf_proof)))
    log_start = st.log().size
    for i, (tx, raw) in enumerate(zip(block.txs, encoded)):
        try:
            apply_tx(st, ctx, tx, raw)
        except ValidationError as exc:
            raise in_context(exc, f"tx {i} ({type(tx).__name__})") from None
    _finish(st, ctx)
    log = st.log()
    if (h.log_size, h.log_root) != (log.size, merkle.Frontier(log.size, log.peaks).root()):
        raise BadLogRoot(f"header log (size {h.log_size}) does not match the receipt log "
                         f"(size {log.size})")
    if h.state_root != state_root(st):
        raise BadStateRoot(f"state_root of block {h.height} does not match the state")
    return _applied(block, st, ctx, log_start, rank, encoded)


def build_block(parent: StateReader, parent_header: Header, txs: Sequence[Any],
                key: SigningKey, time_ms: int) -> Applied:
    """Make and sign the next block from candidate transactions.

    Transactions that break a rule are left out (a mempool holds stale ones);
    at most ``max_block_txs`` are taken.

    Raises:
        WrongProducer / BadTime: ``key`` may not produce at ``time_ms``.
    """
    st, ctx, rank = _begin(parent, parent_header, key.public, time_ms)
    proof, new_beacon = beacon.prove_beacon(key, parent.get(KEY_BEACON).value, ctx.height)
    st.put(KEY_BEACON, Beacon(new_beacon))
    log_start = st.log().size
    limit = st.params().max_block_txs
    included, encoded, size = [], [], 0
    for tx in txs:
        if len(included) == limit:
            break
        raw = encode(tx)
        if size + len(raw) > MAX_BLOCK_BYTES:
            continue
        try:
            apply_tx(st, ctx, tx, raw)
        except ValidationError:
            continue
        included.append(tx)
        encoded.append(raw)
        size += len(raw)
    _finish(st, ctx)
    header = _header(st, ctx, encoded, time_ms=time_ms, producer=key.public,
                     height=ctx.height, prev_hash=ctx.prev_hash, vrf_proof=proof)
    block = Block(header=sign(header, key), txs=tuple(included))
    return _applied(block, st, ctx, log_start, rank, encoded)


def producer_rank(parent: StateReader, parent_header: Header, producer: bytes) -> int | None:
    """Rank of ``producer`` for the block after ``parent_header`` (None: not eligible)."""
    ranking = schedule.producer_ranking(candidates(Overlay(parent)), parent.get(KEY_BEACON).value)
    return ranking.index(producer) if producer in ranking else None


# -- steps shared by all three -----------------------------------------------------


def _begin(parent: StateReader, parent_header: Header, producer: bytes,
           time_ms: int) -> tuple[Overlay, Context, int]:
    """The header's producer and time checked, then the prelude; the caller sets the beacon.

    The caller puts the block's beacon after this returns: the prelude's
    draws read the parent's.
    """
    st = Overlay(parent)
    ctx = Context(height=parent_header.height + 1, prev_hash=block_hash(parent_header),
                  chain_id=parent_header.chain_id)
    params = st.params()
    # The tiebreak among equal waits is the parent's beacon, which its
    # producer could not choose (a block hash it could grind).
    ranking = schedule.producer_ranking(candidates(st), st.get(KEY_BEACON).value)
    if producer not in ranking:
        raise WrongProducer(f"{producer.hex()[:16]}.. is not a bonded, registered node")
    rank = ranking.index(producer)
    if time_ms <= parent_header.time_ms:
        raise BadTime(f"block time {time_ms} is not after its parent's {parent_header.time_ms}")
    earliest = parent_header.time_ms + rank * params.slot_ms
    if time_ms < earliest:
        raise BadTime(f"rank-{rank} producer may produce from time {earliest}, not {time_ms}")
    # Skipped producers count as served too: otherwise a dead rank-0 node
    # would stay first in line and delay every later block by a slot.
    for node_key in ranking[: rank + 1]:
        account_id = st.get(NODE + node_key).account
        st.put_account(account_id, replace(st.account(account_id), last_served_height=ctx.height))
    draw_audits(st, ctx)  # before finalizing: a receipt drawn now gets its verdict window
    draw_spot_cases(st, ctx)
    settle_pending(st, ctx)
    settle_spot_cases(st, ctx)
    refund_expired(st, ctx)
    refund_finished(st, ctx)
    reassign_timeouts(st, ctx)
    return st, ctx, rank


def _finish(st: Overlay, ctx: Context) -> None:
    open_steps(st, ctx)
    check_supply(st)


def _header(st: Overlay, ctx: Context, encoded_txs: Sequence[bytes], *, time_ms: int,
            producer: bytes, height: int, vrf_proof: bytes, prev_hash: bytes = ZERO32) -> Header:
    log = st.log()
    return Header(
        chain_id=ctx.chain_id, height=height, prev_hash=prev_hash, time_ms=time_ms,
        producer=producer, vrf_proof=vrf_proof, txs_root=merkle.merkle_root(encoded_txs),
        log_root=merkle.Frontier(log.size, log.peaks).root(), log_size=log.size,
        state_root=state_root(st), signature=ZERO_SIG,
    )


def _applied(block: Block, st: Overlay, ctx: Context, log_start: int, rank: int,
             encoded: Sequence[bytes]) -> Applied:
    return Applied(
        block=block, hash=block_hash(block.header), writes=dict(st.writes), undo=st.undo(),
        log_appends=tuple(ctx.log_appends), log_start=log_start, rank=rank,
        weight=schedule.block_weight(rank), encoded_txs=tuple(encoded),
    )
