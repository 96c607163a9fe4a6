"""What a node keeps so that its work can be re-executed, and what it keeps to re-execute others'.

Owns `PolArchive` (specs/pol.md 8). A worker keeps, for every unit it
signed, the certificate, every tensor the certificate digests (inputs as
consumed, outputs as produced, weight gradients, the weights read) and the
two named sets (`weights_hash`, `grads_hash`), until no receipt of that step
can still be audited. A verifier keeps its evidence as long, and every
miner keeps a ring of its own weight versions (what it holds after each
update), so it can judge a worker's `weights_hash` against weights of its
own rather than the worker's word. At the steps the job's ``state_every``
divides, a miner also keeps the full state (weights and AdamW moments) of
every part it holds, the newest `KEEP_STATES` of them, from which a joining
node replays windows of the chain's training (`proof_of_learning.joinaudit`).

Everything is stamped with a step and dropped by `prune`; tensors are kept
once per digest (a forward and a backward of one section read the same
weights, a state may hold a tensor a unit read). The rules live here, in an
index in memory; the payloads live in a `node.pol.store` store: a node's
data dir (``D/pol/``, `DirStore`), where every change to the index is also
a journal record, so that an archive opened again on the directory (a
restarted worker) serves what it kept before; or memory (`MemoryStore`,
where no directory is given: tests, benches, a window file's archive).
The weight ring stays in memory: it is this node's word about its own
running training, which a restart ends (specs/pol.md 8).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable, Mapping

import torch

from ledger.codec import decode, encode
from ledger.crypto import H_POL_STATE, domain_hash
from ledger.errors import DecodeError
from ledger.types import Receipt, tx_hash
from node.pol.store import CERT, EVIDENCE, OBJECT_KINDS, DirStore, MemoryStore
from proof_of_learning.units import named_digest, tensor_digest
from proof_of_learning.certificate import Evidence, UnitCert, cert_hash, evidence_hash

log = logging.getLogger(__name__)

__all__ = ["AUDITED_KEEP_STEPS", "KEEP_STATES", "KEEP_STEPS", "PolArchive", "RING", "SYNC_S",
           "state_key"]

#: Weight versions a miner keeps of its own (a verdict comes a few blocks after its unit).
RING = 16
#: Steps whose units a worker keeps even after their audits can no longer come, so
#: that `pnode pol export` can still write them.
KEEP_STEPS = 4
#: Steps a worker keeps the units of its audited receipts: if a verifier failed one,
#: the worker can still export it and anyone can re-execute it (`pnode verify cert`).
AUDITED_KEEP_STEPS = 64
#: Full states a miner keeps (the newest, by step): with the default ``state_every`` of
#: 16, a joining node can replay windows of the last 128 steps from fetched states.
KEEP_STATES = 8
#: Journal records appended before it is rewritten (when also twice what it indexes).
COMPACT_RECORDS = 1024
#: Seconds between a running node's flushes of its archive (`PolArchive.flush`): what a
#: machine crash (not a process crash) can lose of the units kept since.
SYNC_S = 5.0


def state_key(job_id: bytes, step: int, part: int) -> bytes:
    """What `/pnode/pol/1.0.0` asks a part's full state at ``step`` of ``job_id`` by
    (specs/pol.md 8): SHA-256 of ``H_POL_STATE || job_id || u64 step || u32 part``
    (``part``: a section, or `CLIENT`)."""
    return domain_hash(H_POL_STATE, job_id + step.to_bytes(8, "big") + part.to_bytes(4, "big"))


Released = tuple[set[bytes], dict[str, set[bytes]]]  # tensors, objects by kind: maybe unused


class PolArchive:
    """Certificates, evidence, tensors by digest and named sets, each stamped with a step.

    Args:
        ring: own weight versions kept (`RING`).
        keep_steps: steps kept after their audits can no longer come (`KEEP_STEPS`).
        path: a directory to keep everything in (``D/pol/`` of a node's data
            dir), opened again if it holds an archive; None: memory only.
        sync_each: fsync each unit before `keep_unit` returns (default), or
            leave it to `flush` (`node.node` flushes every `SYNC_S` seconds:
            the fsyncs were 0.45x of a PoL-free step, BENCHMARKS.md).
    """

    def __init__(self, ring: int = RING, keep_steps: int = KEEP_STEPS,
                 path: str | os.PathLike[str] | None = None, *, sync_each: bool = True):
        self.ring, self.keep_steps = ring, keep_steps
        self.store = MemoryStore() if path is None else DirStore(path, sync_each=sync_each)
        self._objects: dict[bytes, tuple[int, str]] = {}  # cert/evidence hash: (step, kind)
        self._tensors: dict[bytes, int] = {}  # digest: step
        self._named: dict[bytes, tuple[int, dict[str, bytes]]] = {}  # hash: (step, name: digest)
        self._receipts: dict[bytes, int] = {}  # receipts whose units are kept: their step
        self._receipt_bytes: dict[bytes, bytes] = {}  # and their encodings
        self._audited: set[bytes] = set()  # kept receipts seen drawn for an audit
        # Full states of held parts by `state_key`: (step, name: digest), and how many
        # states hold each digest (their tensors are kept with the units' tensors).
        self._states: dict[bytes, tuple[int, dict[str, bytes]]] = {}
        self._state_refs: Counter[bytes] = Counter()
        self._versions: dict[int, dict[str, bytes]] = {}  # own weights: version: name: digest
        self._ring: dict[bytes, torch.Tensor] = {}  # their tensors, in memory only
        self._stale = False  # a journal append failed: rewrite it at the next change
        if self.store.durable:
            self._reopen()

    def __len__(self) -> int:
        """How many things it keeps: objects, tensors (the ring's too), named sets, states."""
        return (len(self._objects) + len(self._tensors) + len(self._named) + len(self._ring)
                + len(self._states))

    # -- keeping ------------------------------------------------------------------------

    def keep_tensors(self, step: int, tensors: Iterable[torch.Tensor]) -> dict[bytes, torch.Tensor]:
        """Keep CPU copies by digest; returns them by digest."""
        out = {}
        for t in tensors:
            t = t.detach().to("cpu", copy=True)
            out[tensor_digest(t)] = t
        self.keep_digested(step, out)
        return out

    def keep_digested(self, step: int, tensors: Mapping[bytes, torch.Tensor]) -> None:
        """Keep tensors already digested (CPU copies, by their `tensor_digest`)."""
        self._commit({"op": "keep", "step": step, "tensors": self._put_tensors(tensors)})

    def keep_named(self, step: int, digests: Mapping[str, bytes]) -> bytes:
        """Keep a named set (its tensors kept apart, by digest); returns its `tensors_digest`."""
        key = named_digest(dict(digests))
        self._commit({"op": "keep", "step": step, "named": {key.hex(): _hexes(digests)}})
        return key

    def flush(self) -> None:
        """Make every write so far durable (a memory archive: nothing to do)."""
        flush = getattr(self.store, "flush", None)
        if flush is not None:
            flush()

    def keep_unit(self, step: int, cert: UnitCert, results, receipt) -> None:
        """Keep what a verifier of one signed unit needs (module docstring).

        With a directory, everything is durable when this returns (the
        miner submits the receipt after): one journal record, fsynced.

        Args:
            step: the unit's step.
            cert: its certificate.
            results: its phases' `proof_of_learning.phases.PhaseResult`s (their ``kept``
                tensors, ``weights`` and ``grads`` digests).
            receipt: the `Receipt` that commits it (see `forget`).
        """
        weights: dict[str, bytes] = {}
        grads: dict[str, bytes] = {}
        kept: dict[bytes, torch.Tensor] = {}
        for r in results:
            kept.update(r.kept)
            weights.update(r.weights)
            grads.update(r.grads)
        named = {named_digest(weights).hex(): _hexes(weights)}
        if grads:
            named[named_digest(grads).hex()] = _hexes(grads)
        record = {"op": "keep", "step": step, "tensors": self._put_tensors(kept),
                  "named": named, "objects": self._put_object(CERT, cert_hash(cert), encode(cert))}
        if record["objects"]:  # a unit kept without its certificate (a full disk) is no unit
            record["receipt"] = [tx_hash(receipt).hex(), encode(receipt).hex()]
        self._commit(record)

    def keep_cert(self, step: int, cert: UnitCert) -> bytes:
        """Keep a certificate; returns its `cert_hash`."""
        key = cert_hash(cert)
        self._commit({"op": "keep", "step": step,
                      "objects": self._put_object(CERT, key, encode(cert))})
        return key

    def keep_evidence(self, step: int, evidence: Evidence) -> bytes:
        """Keep evidence this node served with a verdict; returns its `evidence_hash`."""
        key = evidence_hash(evidence)
        self._commit({"op": "keep", "step": step,
                      "objects": self._put_object(EVIDENCE, key, encode(evidence))})
        return key

    def keep_version(self, version: int, weights: Mapping[str, torch.Tensor]) -> None:
        """Record this node's own weights after ``version`` updates (the ring's newest).

        In memory only, with or without a directory: a restarted node holds
        none of its former versions (it takes a holder's state), so it has no
        word of its own about them.
        """
        digests = {}
        for name, t in weights.items():  # equal tensors (every norm's ones) share a digest
            t = t.detach().to("cpu", copy=True)
            digest = tensor_digest(t)
            self._ring.setdefault(digest, t)
            digests[name] = digest
        self._versions[version] = digests
        for old in sorted(self._versions)[:-self.ring]:
            del self._versions[old]
        live = {d for ds in self._versions.values() for d in ds.values()}
        for d in [d for d in self._ring if d not in live]:
            del self._ring[d]

    def keep_state(self, job_id: bytes, step: int, part: int,
                   state: Mapping[str, torch.Tensor]) -> None:
        """Keep a held part's full state at ``step`` of ``job_id``: CPU tensors the caller
        no longer changes (`SliceAdamW.state_dict` copies). Only the states of the newest
        `KEEP_STATES` steps stay. A state not every tensor of which could be kept (a full
        disk) is not kept."""
        by_digest = {}
        digests = {}
        for name, t in state.items():
            digests[name] = digest = tensor_digest(t)
            by_digest[digest] = t
        if set(self._put_tensors(by_digest)) != {d.hex() for d in by_digest}:
            log.warning("pol archive: the state of part %d at step %d not kept", part, step)
            self._release(set(by_digest), {})
            return
        self._commit({"op": "state", "step": step,
                      "key": state_key(job_id, step, part).hex(), "set": _hexes(digests)})

    def _put_tensors(self, tensors: Mapping[bytes, torch.Tensor]) -> list[str]:
        """Store the tensors not kept yet; the digests (hex) of all that are kept now."""
        have = {d for d in tensors if d in self._tensors or self._state_refs[d]}
        stored = self.store.put_tensors({d: t for d, t in tensors.items() if d not in have})
        return sorted(d.hex() for d in have | stored)

    def _put_object(self, kind: str, key: bytes, data: bytes) -> dict[str, list[str]]:
        have = self._objects.get(key, (0, None))[1] == kind
        return {kind: [key.hex()]} if have or self.store.put_object(kind, key, data) else {}

    # -- receipts and retention ---------------------------------------------------------

    def receipt(self, receipt_hash: bytes) -> bytes | None:
        """A kept receipt's encoding."""
        return self._receipt_bytes.get(receipt_hash)

    def receipts(self) -> dict[bytes, int]:
        """The receipts whose units are kept: their steps, by hash (a copy)."""
        return dict(self._receipts)

    def mark_audited(self, receipt_hashes: set[bytes]) -> None:
        """Note kept receipts drawn for an audit: they are kept `AUDITED_KEEP_STEPS` steps."""
        new = (receipt_hashes & self._receipts.keys()) - self._audited
        if new:
            self._commit({"op": "audited", "hashes": sorted(h.hex() for h in new)})

    def forget(self, done: set[bytes], step_now: int) -> None:
        """Forget the receipts in ``done`` (no audit can come) that are older than the last
        ``keep_steps`` steps (`AUDITED_KEEP_STEPS` for an audited one), then prune what
        none needs.

        Everything stamped before the oldest step of a kept receipt (or
        ``step_now - keep_steps`` when none is kept) goes.
        """
        horizon = step_now - self.keep_steps
        gone = set()
        for h in done:
            limit = step_now - AUDITED_KEEP_STEPS if h in self._audited else horizon
            if self._receipts.get(h, limit) < limit:
                gone.add(h)
        steps = [s for h, s in self._receipts.items() if h not in gone]
        self.prune(min([*steps, max(horizon, 0)]), forgotten=gone)
        if self.store.durable and self.store.appended > max(
                COMPACT_RECORDS, 2 * (len(self._receipts) + len(self._named) + len(self._states))):
            self._stale = not self.store.rewrite(self._snapshot())

    def prune(self, before: int, forgotten: set[bytes] = frozenset()) -> None:
        """Drop what is stamped before step ``before`` (and the ``forgotten`` receipts)."""
        if forgotten or any(s < before for s in self._tensors.values()) \
                or any(s < before for s, _ in (*self._objects.values(), *self._named.values())):
            self._commit({"op": "forget", "hashes": sorted(h.hex() for h in forgotten),
                          "before": before})

    # -- reading ------------------------------------------------------------------------

    def encoded(self, key: bytes) -> bytes | None:
        """A kept certificate's or evidence's encoding by its hash."""
        item = self._objects.get(key)
        return None if item is None else self.store.object(item[1], key)

    def tensor(self, digest: bytes) -> torch.Tensor | None:
        """A kept tensor (of a unit, a state or the ring) by its `tensor_digest`."""
        t = self._ring.get(digest)
        if t is None and (digest in self._tensors or self._state_refs.get(digest)):
            t = self.store.tensor(digest)
        return t

    def named_digests(self, key: bytes) -> dict[str, bytes] | None:
        """A kept named set's digests by name."""
        item = self._named.get(key)
        return None if item is None else dict(item[1])

    def named(self, key: bytes) -> dict[str, torch.Tensor] | None:
        """The named set whose `tensors_digest` is ``key``, every tensor present, else None."""
        item = self._named.get(key)
        return None if item is None else self._gather(item[1])

    def version_digests(self, version: int) -> dict[str, bytes]:
        """The `tensor_digest` of each of this node's own tensors after ``version`` updates."""
        return dict(self._versions.get(version, {}))

    def versions(self) -> list[int]:
        return sorted(self._versions)

    def state(self, key: bytes) -> dict[str, torch.Tensor] | None:
        """A kept full state by its `state_key`, every tensor present, else None."""
        item = self._states.get(key)
        return None if item is None else self._gather(item[1])

    def state_steps(self) -> list[int]:
        """The steps this node keeps full states of."""
        return sorted({s for s, _ in self._states.values()})

    def _gather(self, digests: Mapping[str, bytes]) -> dict[str, torch.Tensor] | None:
        out = {}
        for name, d in digests.items():
            if (t := self.tensor(d)) is None:
                return None
            out[name] = t
        return out

    # -- the index: records, applied live and replayed ----------------------------------

    def _commit(self, record: dict) -> None:
        """Apply a record to the index, journal it durably (with a directory), then delete
        the payloads it left unused: a crash between leaves files the next open sweeps,
        never a record naming a deleted file as kept."""
        released = self._apply(record)
        if self.store.durable:
            if self._stale:  # the journal may end in a torn line: write it whole
                self._stale = not self.store.rewrite(self._snapshot())
            elif not self.store.append([record]):
                self._stale = True
        self._release(*released)

    def _release(self, tensors: set[bytes], objects: dict[str, set[bytes]]) -> None:
        self.store.drop_tensors(d for d in tensors
                                if d not in self._tensors and not self._state_refs[d])
        for kind, keys in objects.items():
            self.store.drop_objects(kind, (k for k in keys if k not in self._objects))

    def _apply(self, r: dict) -> Released:
        """Change the index as record ``r`` says; what it no longer holds.

        Raises:
            KeyError, ValueError, TypeError, DecodeError: not a record (from a
                damaged journal line; nothing is changed then).
        """
        op = r["op"]
        if op == "keep":
            step = _step(r["step"])
            tensors = [_key(k) for k in r.get("tensors", ())]
            objects = [(kind, _key(k)) for kind, keys in r.get("objects", {}).items()
                       for k in keys if _kind(kind)]
            named = {_key(k): _digests(s) for k, s in r.get("named", {}).items()}
            if any(named_digest(s) != k for k, s in named.items()):
                raise ValueError("a named set that is not its key's")
            receipt = None
            if "receipt" in r:
                h, raw = _key(r["receipt"][0]), bytes.fromhex(r["receipt"][1])
                if tx_hash(decode(raw, Receipt)) != h:
                    raise ValueError("a receipt that is not its hash's")
                receipt = h, raw
            for d in tensors:
                self._tensors[d] = max(step, self._tensors.get(d, step))
            for kind, k in objects:
                self._objects[k] = (max(step, self._objects.get(k, (step,))[0]), kind)
            for k, s in named.items():
                self._named[k] = (max(step, self._named.get(k, (step,))[0]), s)
            if receipt is not None:
                self._receipts[receipt[0]] = step
                self._receipt_bytes[receipt[0]] = receipt[1]
            return set(), {}
        if op == "audited":
            self._audited |= {_key(h) for h in r["hashes"]} & self._receipts.keys()
            return set(), {}
        if op == "forget":
            hashes, before = [_key(h) for h in r["hashes"]], _step(r["before"])
            for h in hashes:
                self._receipts.pop(h, None)
                self._receipt_bytes.pop(h, None)
                self._audited.discard(h)
            return self._prune(before)
        if op == "state":
            step, key, digests = _step(r["step"]), _key(r["key"]), _digests(r["set"])
            released = self._drop_state(key)
            self._states[key] = (step, digests)
            self._state_refs.update(set(digests.values()))
            steps = sorted({s for s, _ in self._states.values()})
            for old in [k for k, (s, _) in self._states.items() if s in steps[:-KEEP_STATES]]:
                released |= self._drop_state(old)
            return released, {}
        raise ValueError(f"unknown record {op!r}")

    def _drop_state(self, key: bytes) -> set[bytes]:
        _, digests = self._states.pop(key, (0, {}))
        self._state_refs.subtract(set(digests.values()))
        self._state_refs += Counter()  # drops the zeros
        return set(digests.values())

    def _prune(self, before: int) -> Released:
        objects: dict[str, set[bytes]] = {}
        for k in [k for k, (s, _) in self._objects.items() if s < before]:
            objects.setdefault(self._objects.pop(k)[1], set()).add(k)
        for k in [k for k, (s, _) in self._named.items() if s < before]:
            del self._named[k]
        tensors = {d for d, s in self._tensors.items() if s < before}
        for d in tensors:
            del self._tensors[d]
        return tensors, objects

    def _snapshot(self) -> list[dict]:
        """Records that rebuild the index as it is (the journal, rewritten)."""
        by_step: dict[int, dict] = {}

        def at(step: int) -> dict:
            return by_step.setdefault(step, {"op": "keep", "step": step, "tensors": [],
                                             "named": {}, "objects": {}})
        for d, s in self._tensors.items():
            at(s)["tensors"].append(d.hex())
        for k, (s, kind) in self._objects.items():
            at(s)["objects"].setdefault(kind, []).append(k.hex())
        for k, (s, digests) in self._named.items():
            at(s)["named"][k.hex()] = _hexes(digests)
        out = [by_step[s] for s in sorted(by_step)]
        out += [{"op": "keep", "step": s, "receipt": [h.hex(), self._receipt_bytes[h].hex()]}
                for h, s in self._receipts.items()]
        if self._audited:
            out.append({"op": "audited", "hashes": sorted(h.hex() for h in self._audited)})
        out += [{"op": "state", "step": s, "key": k.hex(), "set": _hexes(digests)}
                for k, (s, digests) in sorted(self._states.items(), key=lambda kv: kv[1][0])]
        return out

    def _reopen(self) -> None:
        """Rebuild the index from the journal, delete what it does not name, rewrite it."""
        skipped = 0
        for record in self.store.records():
            try:
                self._apply(record)
            except (KeyError, ValueError, TypeError, AttributeError, DecodeError):
                skipped += 1
        objects: dict[str, set[bytes]] = {kind: set() for kind in OBJECT_KINDS}
        for k, (_, kind) in self._objects.items():
            objects[kind].add(k)
        swept = self.store.sweep(set(self._tensors) | set(self._state_refs), objects)
        self._stale = not self.store.rewrite(self._snapshot())
        if self._receipts or self._states or skipped or swept:
            log.info("pol archive %s: %d units, %d tensors, %d states kept from before; "
                     "%d records skipped, %d unnamed files deleted", self.store.path,
                     len(self._receipts), len(self._tensors), len(self._states), skipped,
                     swept)


def _hexes(digests: Mapping[str, bytes]) -> dict[str, str]:
    return {name: d.hex() for name, d in digests.items()}


def _key(text: str) -> bytes:
    if not isinstance(text, str) or len(text) != 64:
        raise ValueError(f"not a 32-byte key: {text!r}")
    return bytes.fromhex(text)


def _step(value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"not a step: {value!r}")
    return value


def _kind(kind: str) -> bool:
    if kind not in OBJECT_KINDS:
        raise ValueError(f"not an object kind: {kind!r}")
    return True


def _digests(named: dict) -> dict[str, bytes]:
    if not isinstance(named, dict) or not all(isinstance(n, str) for n in named):
        raise ValueError("not a named set")
    return {name: _key(d) for name, d in named.items()}
