"""Chain state: typed records under one key space, overlays, and the state root.

State is a map from keys (one kind byte + an id) to records. ``MemoryState``
holds the committed state of a node's tip; an ``Overlay`` stacks uncommitted
writes on any reader, which is how a block is applied (and thrown away if it
is invalid) and how a reorg rewinds without touching the committed copy.

The state root is the RFC 6962 Merkle root over every record, sorted by key,
each leaf being ``len(key) || key || encode(record)``. It commits balances,
nonces, bonds, waits, registrations, jobs, assignments, pending rewards, the
coin supply, jailed nodes, open tabs, spot cases, the receipt log's frontier and
the chain parameters.

Determinism: every iteration that can affect the state goes through
``ids(kind)``, which is sorted; dict order never leaks into consensus.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, Protocol

from ledger import merkle
from ledger.codec import decode, encode
from ledger.errors import DecodeError, SupplyMismatch
from ledger.tab import TabRecord, locked
from ledger.records import (
    Account, AppealRecord, Assignment, Beacon, Jail, JobRecord, LogState, NodeRecord, Pending,
    SpotCase, Supply,
)
from ledger.types import Params

ACCOUNT, NODE, JOB, UNIT, PENDING, META = b"A", b"N", b"J", b"U", b"P", b"M"
JAIL, TAB, APPEAL, SPOT = b"X", b"T", b"V", b"S"
KEY_PARAMS, KEY_SUPPLY, KEY_LOG = META + b"params", META + b"supply", META + b"log"
KEY_BEACON = META + b"beacon"

_KIND_TYPES: dict[bytes, tuple[type, ...]] = {
    ACCOUNT: (Account,), NODE: (NodeRecord,), JOB: (JobRecord,), UNIT: (Assignment,),
    PENDING: (Pending,), JAIL: (Jail,), TAB: (TabRecord,), APPEAL: (AppealRecord,),
    SPOT: (SpotCase,),
    META: (Params, Supply, LogState, Beacon),
}

_META_TYPES: dict[bytes, tuple[type, ...]] = {
    KEY_PARAMS: (Params,), KEY_SUPPLY: (Supply,), KEY_LOG: (LogState,), KEY_BEACON: (Beacon,),
}

EMPTY_ACCOUNT = Account(balance=0, nonce=0, bond=0, last_served_height=0)


def decode_record(key: bytes, data: bytes) -> Any:
    """Decode a stored record, checking that its type fits its key's kind.

    Raises:
        DecodeError: unknown kind or a record of the wrong type.
    """
    kinds = _META_TYPES.get(key) if key[:1] == META else _KIND_TYPES.get(key[:1])
    if kinds is None:
        raise DecodeError(f"unknown state key {key[:16]!r}")
    return decode(data, kinds)


def leaf_data(key: bytes, record: Any) -> bytes:
    return bytes([len(key)]) + key + encode(record)


class StateReader(Protocol):
    """Read access to a state: what block rules need."""

    def get(self, key: bytes) -> Any | None: ...

    def ids(self, kind: bytes) -> list[bytes]: ...

    def leaf_hashes(self) -> Mapping[bytes, bytes]: ...


class MemoryState:
    """The committed state, fully in memory, with cached leaf hashes."""

    def __init__(self, records: Mapping[bytes, Any] | None = None):
        self._records: dict[bytes, Any] = {}
        self._kinds: dict[bytes, set[bytes]] = {k: set() for k in _KIND_TYPES}
        self._leaves: dict[bytes, bytes] = {}
        self.apply(dict(records or {}))

    def get(self, key: bytes) -> Any | None:
        return self._records.get(key)

    def ids(self, kind: bytes) -> list[bytes]:
        return sorted(self._kinds[kind])

    def leaf_hashes(self) -> Mapping[bytes, bytes]:
        return self._leaves

    def items(self) -> Iterator[tuple[bytes, Any]]:
        return iter(sorted(self._records.items()))

    def apply(self, writes: Mapping[bytes, Any | None]) -> None:
        """Commit writes (None deletes)."""
        for key, record in writes.items():
            kind, rest = key[:1], key[1:]
            if record is None:
                self._records.pop(key, None)
                self._kinds[kind].discard(rest)
                self._leaves.pop(key, None)
            else:
                self._records[key] = record
                self._kinds[kind].add(rest)
                self._leaves[key] = merkle.leaf_hash(leaf_data(key, record))


class Overlay:
    """Uncommitted writes over a reader; reads see the writes first."""

    def __init__(self, base: StateReader):
        self.base = base
        self.writes: dict[bytes, Any | None] = {}

    def get(self, key: bytes) -> Any | None:
        if key in self.writes:
            return self.writes[key]
        return self.base.get(key)

    def put(self, key: bytes, record: Any) -> None:
        self.writes[key] = record

    def delete(self, key: bytes) -> None:
        self.writes[key] = None

    def ids(self, kind: bytes) -> list[bytes]:
        live = set(self.base.ids(kind))
        for key, record in self.writes.items():
            if key[:1] == kind:
                (live.add if record is not None else live.discard)(key[1:])
        return sorted(live)

    def leaf_hashes(self) -> Mapping[bytes, bytes]:
        leaves = dict(self.base.leaf_hashes())
        for key, record in self.writes.items():
            if record is None:
                leaves.pop(key, None)
            else:
                leaves[key] = merkle.leaf_hash(leaf_data(key, record))
        return leaves

    def undo(self) -> dict[bytes, Any | None]:
        """The base's values of every written key: applying them reverts."""
        return {key: self.base.get(key) for key in self.writes}

    # Typed accessors used by the block rules.

    def account(self, account_id: bytes) -> Account:
        return self.get(ACCOUNT + account_id) or EMPTY_ACCOUNT

    def put_account(self, account_id: bytes, account: Account) -> None:
        self.put(ACCOUNT + account_id, account)

    def params(self) -> Params:
        return self.get(KEY_PARAMS)

    def supply(self) -> Supply:
        return self.get(KEY_SUPPLY)

    def log(self) -> LogState:
        return self.get(KEY_LOG)


def state_root(reader: StateReader) -> bytes:
    """Merkle root over all records, sorted by key."""
    leaves = reader.leaf_hashes()
    return merkle.root_from_hashes([leaves[k] for k in sorted(leaves)])


def check_supply(reader: StateReader) -> None:
    """Check that balances + bonds + the coins tabs, jobs and spot cases lock == premine + minted
    - burned.

    Raises:
        SupplyMismatch: with both sides, if they differ.
    """
    supply: Supply = reader.get(KEY_SUPPLY)
    held = 0
    for account_id in reader.ids(ACCOUNT):
        account = reader.get(ACCOUNT + account_id)
        held += account.balance + account.bond
    for tab_id in reader.ids(TAB):
        held += locked(reader.get(TAB + tab_id))
    for job_id in reader.ids(JOB):
        held += reader.get(JOB + job_id).escrow
    for case_id in reader.ids(SPOT):
        held += reader.get(SPOT + case_id).deposit
    expected = supply.premine + supply.minted - supply.burned
    if held != expected:
        raise SupplyMismatch(f"accounts hold {held}, rules minted {expected}")


def flatten(writes_in_order: Iterable[Mapping[bytes, Any | None]]) -> dict[bytes, Any | None]:
    """Merge successive write sets; later writes win."""
    out: dict[bytes, Any | None] = {}
    for writes in writes_in_order:
        out.update(writes)
    return out
