"""Chain sync and block gossip: keeps a node's ChainDB level with its peers.

Owns `ChainService`, the one component that touches the node's `ChainDB`
while the node runs (specs/network.md, "Chain sync"):

- it serves ``/pnode/sync/1.0.0`` from the chain: the tip, and main-chain
  blocks by height (`node.wire.sync`);
- `ChainService.sync_from` pulls a peer's chain when the peer's tip wins the
  ledger's fork choice (`ledger.schedule.is_better_tip`: greater total weight,
  ties to the lower tip hash), walking back to the fork point when the blocks
  it gets do not connect;
- it gossips blocks on ``pnode/blocks/1`` and adds the ones it hears in the
  topic's validator (`Host.set_validator`), so gossipsub relays only blocks
  that this node added; a gossiped block whose parent is missing is not
  relayed but pulls the chain from the peer that sent it (bounded: a peer
  whose orphans' sync brought nothing sets off no other for a while, and at
  most `MAX_BACKGROUND_SYNCS` background syncs run at once).

The ChainDB is not thread-safe and validation is CPU work, so every ChainDB
call runs in a worker thread under one `trio.CapacityLimiter(1)` (`call`):
one reader or writer at a time, and the trio loop stays free. `call` also
notices when the tip moves (`wait_tip_change`, what a block producer waits
on). A peer that sends undecodable bytes, a broken chain or an invalid block
scores one point (`Host.penalize`) and its sync stops with `PeerMisbehaved`;
so does one that answers a request for blocks below the tip it just claimed
with none, or answers with a frame over `MAX_SYNC_RESPONSE_FRAME`;
blocks added before that stay (each one was fully validated).

A store error in any chain call (a failed write, a damaged table) is this
node's fault, never a peer's: it is kept in `store_fault`, `store_broken` is
set (the node stops on it, specs/network.md section 5), and sync requests
are no longer served (their streams reset, the asker unscored).
"""

from __future__ import annotations

import logging
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import trio
from libp2p.peer.id import ID

from ledger import schema
from ledger.chaindb import EXTENDED, KNOWN, MAX_REORG_DEPTH, REORG, AddResult, ChainDB
from ledger.codec import decode, encode
from ledger.errors import (
    DecodeError, ForkTooDeep, StoreError, TimeInFuture, UnknownParent, ValidationError,
)
from ledger.schedule import is_better_tip
from ledger.types import Block, block_hash
from node.clock import Clock
from node.errors import NodeError
from node.net import GossipError, Host, LocalFault, RequestError, ResponseTooLarge
from node.wire import (
    BLOCKS_TOPIC, MAX_BLOCKS_PER_REQUEST, MAX_BLOCKS_RESPONSE_BYTES, MAX_SYNC_REQUEST_FRAME,
    MAX_SYNC_RESPONSE_FRAME, SYNC_PROTOCOL, BlocksRequest, BlocksResponse, SyncRequest, TipRequest,
    TipResponse, encode_blocks_response,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

_FIRST_STEP_BACK = 8  # blocks fetched below an unconnected block; doubles each time
#: Background syncs (set off by gossip and by `sync_soon`) running at once.
MAX_BACKGROUND_SYNCS = 4
#: After a sync that an orphan block set off brought nothing from that peer,
#: its next orphans set off none for this long, doubling up to the second
#: figure. Attack note: a block with an unknown parent cannot be validated,
#: so a peer can gossip them for free; each would cost a sync without this.
ORPHAN_SYNC_GAP_S = (0.5, 30.0)


class SyncError(NodeError):
    """A sync from a peer that stopped before reaching the peer's tip."""


class SyncFailed(SyncError):
    """No fault proven: the peer is unreachable, on another chain, forks too
    deep, or sent blocks from the future (clocks disagree)."""


class PeerMisbehaved(SyncError):
    """The peer sent undecodable bytes, a broken chain or an invalid block
    (scored with `Host.penalize`)."""


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What a completed `ChainService.sync_from` did."""

    peer: ID
    added: int  # blocks newly stored (main chain or side branch)
    height: int  # our tip afterwards
    tip_hash: bytes
    reorg_depth: int = 0  # deepest branch switch during the sync (0: none)


@dataclass(slots=True)
class _Outcome:
    """What adding a run of blocks did (returned from the worker thread)."""

    done: int  # blocks consumed from the front of the run
    results: list[AddResult]
    missing_parent: bool = False  # block ``done`` has an unknown parent
    error: ValidationError | None = None  # block ``done`` is invalid


class ChainService:
    """Serves, syncs and gossips one ChainDB over one `Host`."""

    def __init__(self, chain: ChainDB, host: Host, clock: Clock, *,
                 request_timeout: float = 30.0,
                 on_sync: Callable[[SyncResult], None] = lambda result: None,
                 on_tip: Callable[[int, bytes], None] = lambda height, tip_hash: None):
        """
        Args:
            chain: the node's chain (only touched through `call` from now on).
            host: the running host.
            clock: local time in ms.
            request_timeout: seconds per sync request.
            on_sync: called after each sync that added blocks (background ones too).
            on_tip: called with the new tip's height and hash whenever a chain
                call moved it, in the worker thread, once the store made it
                durable (the node's tip marker, `DataDir.write_tip_marker`).
        """
        self.chain, self.host, self.clock = chain, host, clock
        self.request_timeout = request_timeout
        self.on_sync, self.on_tip = on_sync, on_tip
        self._db = trio.CapacityLimiter(1)
        self._peer_locks: defaultdict[ID, trio.Lock] = defaultdict(trio.Lock)
        self._queued: set[ID] = set()
        self._nursery: trio.Nursery | None = None
        self._tip_seen = chain.tip_hash
        self._tip_moved = trio.Event()
        self.store_fault: StoreError | None = None  # the first store error met
        self.store_broken = trio.Event()
        self._background = trio.CapacityLimiter(MAX_BACKGROUND_SYNCS)
        self._orphan_gap: dict[ID, tuple[float, float]] = {}  # peer -> (quiet until, gap)
        self.background_syncs = 0  # started so far (a figure for tests and status)

    async def run(self, *, task_status: trio.TaskStatus[ChainService] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Serve sync requests and follow block gossip until cancelled or the host stops."""
        self.host.set_request_handler(SYNC_PROTOCOL, self._serve,
                                      max_request_size=MAX_SYNC_REQUEST_FRAME)
        self.host.set_validator(BLOCKS_TOPIC, self._on_gossip)
        try:
            await self.host.join(BLOCKS_TOPIC)
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    task_status.started(self)
                    await self.host.wait_stopped()
                    nursery.cancel_scope.cancel()  # the host stopped: drop background syncs
                finally:
                    self._nursery = None
        finally:
            self.host.set_validator(BLOCKS_TOPIC, None)

    # -- the chain, one caller at a time ------------------------------------------------

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in a worker thread, alone with the ChainDB.

        The one way to touch the chain while the service runs (a block
        producer builds its blocks through it too).

        Raises:
            StoreError: the store failed (kept in `store_fault`, see the module).
        """
        def alone() -> T:
            before = self.chain.tip_hash
            out = fn(*args)
            if self.chain.tip_hash != before:
                self.on_tip(self.chain.height, self.chain.tip_hash)
            return out
        try:
            return await trio.to_thread.run_sync(alone, limiter=self._db)
        except StoreError as exc:
            if self.store_fault is None:
                self.store_fault = exc
                self.store_broken.set()
            raise
        finally:
            if self.chain.tip_hash != self._tip_seen:
                self._tip_seen = self.chain.tip_hash
                self._tip_moved.set()
                self._tip_moved = trio.Event()

    async def wait_tip_change(self, tip_hash: bytes) -> None:
        """Return once the main-chain tip is no longer ``tip_hash``."""
        while self.chain.tip_hash == tip_hash:
            await self._tip_moved.wait()

    async def add_block(self, block: Block) -> AddResult:
        """Add a block (e.g. one this node produced) and gossip it if it became the tip.

        Raises:
            UnknownParent, ValidationError: as `ChainDB.add_block`.
        """
        result = await self.call(self.chain.add_block, block, self.clock())
        if result.status in (EXTENDED, REORG):
            await self._announce(block)
        return result

    async def tip(self) -> TipResponse:
        """Our main-chain tip, as the sync protocol describes it."""
        return await self.call(self._tip)

    def _tip(self) -> TipResponse:
        chain = self.chain
        genesis = chain.hash_at(0)
        assert genesis is not None
        return TipResponse(chain.height, chain.tip_hash,
                           chain.meta(chain.tip_hash).total_weight, genesis)

    def _raw_blocks(self, start: int, count: int) -> bytes:
        """A `BlocksResponse` of stored block encodings, sent as they are stored."""
        out: list[bytes] = []
        size = 0
        for height in range(start, start + count):
            h = self.chain.hash_at(height)
            raw = None if h is None else self.chain.store.get(schema.block_key(h))
            if raw is None or (out and size + len(raw) > MAX_BLOCKS_RESPONSE_BYTES):
                break
            out.append(raw)
            size += len(raw)
        return encode_blocks_response(out)

    def _add_run(self, blocks: list[Block], now_ms: int) -> _Outcome:
        """Add linked blocks in order until one fails (worker thread)."""
        results: list[AddResult] = []
        for i, block in enumerate(blocks):
            try:
                results.append(self.chain.add_block(block, now_ms))
            except UnknownParent:
                return _Outcome(i, results, missing_parent=True)
            except ValidationError as exc:
                return _Outcome(i, results, error=exc)
        return _Outcome(len(blocks), results)

    # -- serving ------------------------------------------------------------------------

    async def _serve(self, peer: ID, request: bytes) -> bytes:
        # A DecodeError (garbage, a count over the cap) makes the host reset
        # the stream and score the peer; a fault of our own store must not.
        msg = decode(request, SyncRequest)
        if self.store_fault is not None:
            raise LocalFault(f"not serving sync: this node's store failed: {self.store_fault}")
        try:
            if isinstance(msg, TipRequest):
                return encode(await self.call(self._tip))
            return await self.call(self._raw_blocks, msg.start_height, msg.count)
        except StoreError as exc:
            raise LocalFault(f"not serving sync: this node's store failed: {exc}") from None

    # -- pulling ------------------------------------------------------------------------

    async def sync_from(self, peer: ID) -> SyncResult:
        """Pull ``peer``'s chain if its tip beats ours under the fork choice.

        Returns once we hold the peer's tip (as seen when the sync began) or
        the peer has no better chain; syncs from one peer run one at a time.

        Raises:
            PeerMisbehaved: the peer sent garbage or an invalid block (scored).
            SyncFailed: unreachable peer, another chain, a fork deeper than
                ``MAX_REORG_DEPTH``, or blocks too far in the future.
        """
        async with self._peer_locks[peer]:
            return await self._sync_locked(peer)

    async def connect(self, addr: str) -> ID:
        """Dial a peer (`Host.connect`) and catch up with it in the background.

        Raises:
            DialError: as `Host.connect`.
        """
        peer = await self.host.connect(addr)
        self.sync_soon(peer)
        return peer

    def sync_soon(self, peer: ID, *, orphan: bool = False) -> None:
        """Sync from ``peer`` in the background.

        At most one sync per peer is queued, and `MAX_BACKGROUND_SYNCS` run
        at once. With ``orphan`` (a block of ``peer``'s had an unknown
        parent), nothing is queued while the peer is in its quiet gap
        (`ORPHAN_SYNC_GAP_S`).
        """
        if self._nursery is None or peer in self._queued or peer == self.host.peer_id:
            return
        if orphan and trio.current_time() < self._orphan_gap.get(peer, (0.0, 0.0))[0]:
            return
        self._queued.add(peer)
        self._nursery.start_soon(self._background_sync, peer, orphan)

    async def _background_sync(self, peer: ID, orphan: bool) -> None:
        added = 0
        try:
            async with self._background, self._peer_locks[peer]:
                self._queued.discard(peer)
                self.background_syncs += 1
                result = await self._sync_locked(peer)
                added = result.added
            log.debug("synced from %s: %s", peer, result)
        except SyncError as exc:
            log.info("sync from %s stopped: %s", peer, exc)
        finally:
            if orphan:
                self._note_orphan_sync(peer, added)

    def _note_orphan_sync(self, peer: ID, added: int) -> None:
        """Open (or widen) ``peer``'s quiet gap when its orphans' sync brought nothing."""
        if added:
            self._orphan_gap.pop(peer, None)
            return
        first, most = ORPHAN_SYNC_GAP_S
        gap = min(max(2 * self._orphan_gap.get(peer, (0.0, first / 2))[1], first), most)
        self._orphan_gap[peer] = (trio.current_time() + gap, gap)

    async def _sync_locked(self, peer: ID) -> SyncResult:
        """`sync_from`, then gossip our new tip if it moved (neighbours may lack it)."""
        before = self.chain.tip_hash
        try:
            result = await self._pull(peer)
            if result.added:
                self.on_sync(result)
            return result
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                if self.chain.tip_hash != before:
                    await self._announce(await self.call(self.chain.block, self.chain.tip_hash))

    async def _pull(self, peer: ID) -> SyncResult:
        theirs = await self._ask(peer, TipRequest(), TipResponse)
        ours = await self.call(self._tip)
        added, depth = 0, 0

        def result() -> SyncResult:
            return SyncResult(peer, added, self.chain.height, self.chain.tip_hash, depth)

        if theirs.genesis_hash != ours.genesis_hash:
            raise SyncFailed(f"{peer} is on another chain")
        if (not is_better_tip(theirs.weight, theirs.tip_hash, ours.weight, ours.tip_hash)
                or await self.call(self.chain.has_block, theirs.tip_hash)):
            return result()
        # Their better tip may be shorter than ours (fewer, heavier blocks).
        next_height = min(ours.height + 1, theirs.height)
        pending: deque[Block] = deque()
        step = _FIRST_STEP_BACK
        while True:
            if not pending:
                if next_height > theirs.height:
                    return result()
                count = min(MAX_BLOCKS_PER_REQUEST, theirs.height - next_height + 1)
                pending.extend(await self._fetch(peer, next_height, count))
                if not pending:
                    # The peer just claimed a tip at height >= next_height. A reorg to a
                    # shorter chain in between is possible but rare: one point, and
                    # ten such answers (a peer stalling every sync for free) a ban.
                    raise self._punish(peer, f"empty BlocksResponse for heights from "
                                             f"{next_height}, under its tip {theirs.height}")
                next_height += len(pending)
            outcome = await self.call(self._add_run, list(pending), self.clock())
            for _ in range(outcome.done):
                pending.popleft()
            added += sum(r.status != KNOWN for r in outcome.results)
            depth = max([depth, *(r.reorg_depth for r in outcome.results)])
            if outcome.error is not None:
                raise self._judge(peer, outcome.error)
            if not outcome.missing_parent:
                continue
            # The first pending block does not connect: fetch the blocks below it.
            first = pending[0].header
            floor = max(1, self.chain.height - MAX_REORG_DEPTH + 1)
            if first.height <= floor:
                raise SyncFailed(f"{peer}'s chain shares no block with ours within "
                                 f"{MAX_REORG_DEPTH} blocks of our tip")
            back = max(floor, first.height - step)
            step = min(2 * step, MAX_BLOCKS_PER_REQUEST)
            earlier = await self._fetch(peer, back, first.height - back)
            linked = earlier and block_hash(earlier[-1].header) == first.prev_hash
            if linked and len(earlier) == first.height - back:
                pending.extendleft(reversed(earlier))
            else:  # the peer switched branches meanwhile: go on from its new one
                pending = deque(earlier)
                next_height = back + len(earlier)

    def _judge(self, peer: ID, exc: ValidationError) -> SyncError:
        """The error that stops a sync on an invalid block; scores the peer if at fault."""
        if isinstance(exc, (ForkTooDeep, TimeInFuture)):
            return SyncFailed(f"{peer}: {type(exc).__name__}: {exc}")
        return self._punish(peer, f"invalid block: {type(exc).__name__}: {exc}")

    def _punish(self, peer: ID, reason: str) -> PeerMisbehaved:
        self.host.penalize(peer, 1, reason)
        return PeerMisbehaved(f"{peer}: {reason}")

    async def _ask(self, peer: ID, msg: Any, expected: type[T]) -> T:
        try:
            data = await self.host.request(peer, SYNC_PROTOCOL, encode(msg), self.request_timeout,
                                           max_response_size=MAX_SYNC_RESPONSE_FRAME)
        except ResponseTooLarge as exc:  # no honest answer is that large (one block fits)
            raise self._punish(peer, f"oversized {expected.__name__}: {exc}") from None
        except RequestError as exc:
            raise SyncFailed(str(exc)) from None
        try:
            return await trio.to_thread.run_sync(decode, data, expected)
        except DecodeError as exc:
            raise self._punish(peer, f"undecodable {expected.__name__}: {exc}") from None

    async def _fetch(self, peer: ID, start: int, count: int) -> list[Block]:
        """Blocks ``start ..`` of the peer's main chain, checked to be linked."""
        response = await self._ask(peer, BlocksRequest(start, count), BlocksResponse)
        blocks = list(response.blocks)
        if len(blocks) > count:
            raise self._punish(peer, f"{len(blocks)} blocks for a request of {count}")
        for i, block in enumerate(blocks):
            if block.header.height != start + i:
                raise self._punish(peer, f"block {i} has height {block.header.height}, "
                                         f"expected {start + i}")
            if i and block.header.prev_hash != block_hash(blocks[i - 1].header):
                raise self._punish(peer, f"block at height {start + i} does not link "
                                         "to the one below")
        return blocks

    # -- gossip ---------------------------------------------------------------------------

    async def _announce(self, block: Block) -> None:
        try:
            await self.host.publish(BLOCKS_TOPIC, encode(block))
        except GossipError as exc:  # too large for gossip: peers pull it by sync
            log.info("block %d not gossiped: %s", block.header.height, exc)

    async def _on_gossip(self, origin: ID, data: bytes, forwarder: ID) -> bool:
        """The blocks topic's validator: add the block; relay it only if it was added.

        Returns True (relay) for a valid block, new or already held. An
        undecodable or invalid block scores its origin; one whose parent is
        unknown starts a background sync from the origin if it is a
        neighbour, else from the neighbour that forwarded it (which added it,
        so holds its ancestors); one too far in the future or forking too
        deep is dropped unscored. None of these is relayed.
        """
        try:
            block = decode(data, Block)
        except DecodeError as exc:
            self._punish(origin, f"undecodable gossiped block: {exc}")
            return False
        try:
            await self.call(self.chain.add_block, block, self.clock())
            return True
        except UnknownParent:
            source = origin if origin in self.host.connected_peers() else forwarder
            self.sync_soon(source, orphan=True)
        except (ForkTooDeep, TimeInFuture) as exc:
            log.info("gossiped block %d from %s dropped: %s", block.header.height, origin, exc)
        except ValidationError as exc:
            self._punish(origin, f"invalid gossiped block: {type(exc).__name__}: {exc}")
        return False
