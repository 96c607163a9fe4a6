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
weights). In memory: a restarted worker cannot answer for units it ran
before the restart, and its verifiers say `UNAVAILABLE` (specs/pol.md 6.3).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from ledger.codec import encode
from ledger.crypto import H_POL_STATE, domain_hash
from ledger.types import tx_hash
from proof_of_learning.units import named_digest, tensor_digest
from proof_of_learning.certificate import Evidence, UnitCert, cert_hash, evidence_hash

__all__ = ["AUDITED_KEEP_STEPS", "KEEP_STATES", "KEEP_STEPS", "PolArchive", "RING", "state_key"]

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


def state_key(job_id: bytes, step: int, part: int) -> bytes:
    """What `/pnode/pol/1.0.0` asks a part's full state at ``step`` of ``job_id`` by
    (specs/pol.md 8): SHA-256 of ``H_POL_STATE || job_id || u64 step || u32 part``
    (``part``: a section, or `CLIENT`)."""
    return domain_hash(H_POL_STATE, job_id + step.to_bytes(8, "big") + part.to_bytes(4, "big"))


class PolArchive:
    """Certificates, evidence, tensors by digest and named sets, each stamped with a step."""

    def __init__(self, ring: int = RING, keep_steps: int = KEEP_STEPS):
        self.ring, self.keep_steps = ring, keep_steps
        self._objects: dict[bytes, tuple[int, bytes]] = {}  # cert/evidence hash: (step, encoding)
        self._tensors: dict[bytes, tuple[int, torch.Tensor]] = {}  # digest: (step, CPU tensor)
        self._named: dict[bytes, tuple[int, dict[str, bytes]]] = {}  # hash: (step, name: digest)
        self._versions: dict[int, dict[str, bytes]] = {}  # own weights: version: name: digest
        self._receipts: dict[bytes, int] = {}  # receipts whose units are kept: their step
        self._receipt_bytes: dict[bytes, bytes] = {}  # and their encodings
        self._audited: set[bytes] = set()  # kept receipts seen drawn for an audit
        # Full states of held parts by `state_key`: (step, name: tensor).
        self._states: dict[bytes, tuple[int, dict[str, torch.Tensor]]] = {}

    def __len__(self) -> int:
        return len(self._objects) + len(self._tensors) + len(self._named)

    # -- keeping ------------------------------------------------------------------------

    def keep_tensors(self, step: int, tensors: Iterable[torch.Tensor]) -> dict[bytes, torch.Tensor]:
        """Keep CPU copies by digest; returns them by digest."""
        out = {}
        for t in tensors:
            t = t.detach().to("cpu", copy=True)
            digest = tensor_digest(t)
            self._stamp_tensor(digest, t, step)
            out[digest] = t
        return out

    def keep_digested(self, step: int, tensors: Mapping[bytes, torch.Tensor]) -> None:
        """Keep tensors already digested (CPU copies, by their `tensor_digest`)."""
        for digest, t in tensors.items():
            self._stamp_tensor(digest, t, step)

    def _stamp_tensor(self, digest: bytes, t: torch.Tensor, step: int) -> None:
        old = self._tensors.get(digest)
        self._tensors[digest] = (max(step, old[0]) if old else step, old[1] if old else t)

    def keep_named(self, step: int, digests: Mapping[str, bytes]) -> bytes:
        """Keep a named set (its tensors kept apart, by digest); returns its `tensors_digest`."""
        key = named_digest(dict(digests))
        old = self._named.get(key)
        self._named[key] = (max(step, old[0]) if old else step, dict(digests))
        return key

    def keep_unit(self, step: int, cert: UnitCert, results, receipt) -> None:
        """Keep what a verifier of one signed unit needs (module docstring).

        Args:
            step: the unit's step.
            cert: its certificate.
            results: its phases' `proof_of_learning.phases.PhaseResult`s (their ``kept``
                tensors, ``weights`` and ``grads`` digests).
            receipt: the `Receipt` that commits it (see `forget`).
        """
        weights: dict[str, bytes] = {}
        grads: dict[str, bytes] = {}
        for r in results:
            self.keep_digested(step, r.kept)
            weights.update(r.weights)
            grads.update(r.grads)
        self.keep_named(step, weights)
        if grads:
            self.keep_named(step, grads)
        self.keep_cert(step, cert)
        receipt_hash = tx_hash(receipt)
        self._receipts[receipt_hash] = step
        self._receipt_bytes[receipt_hash] = encode(receipt)

    def receipt(self, receipt_hash: bytes) -> bytes | None:
        """A kept receipt's encoding."""
        return self._receipt_bytes.get(receipt_hash)

    def named_digests(self, key: bytes) -> dict[str, bytes] | None:
        """A kept named set's digests by name."""
        item = self._named.get(key)
        return None if item is None else dict(item[1])

    def receipts(self) -> dict[bytes, int]:
        """The receipts whose units are kept: their steps, by hash (a copy)."""
        return dict(self._receipts)

    def mark_audited(self, receipt_hashes: set[bytes]) -> None:
        """Note kept receipts drawn for an audit: they are kept `AUDITED_KEEP_STEPS` steps."""
        self._audited |= receipt_hashes & self._receipts.keys()

    def forget(self, done: set[bytes], step_now: int) -> None:
        """Forget the receipts in ``done`` (no audit can come) that are older than the last
        ``keep_steps`` steps (`AUDITED_KEEP_STEPS` for an audited one), then prune what
        none needs.

        Everything stamped before the oldest step of a kept receipt (or
        ``step_now - keep_steps`` when none is kept) goes.
        """
        horizon = step_now - self.keep_steps
        for h in done:
            limit = step_now - AUDITED_KEEP_STEPS if h in self._audited else horizon
            if self._receipts.get(h, limit) < limit:
                del self._receipts[h]
                self._receipt_bytes.pop(h, None)
                self._audited.discard(h)
        self.prune(min([*self._receipts.values(), max(horizon, 0)]))

    def keep_cert(self, step: int, cert: UnitCert) -> bytes:
        """Keep a certificate; returns its `cert_hash`."""
        key = cert_hash(cert)
        self._objects[key] = (step, encode(cert))
        return key

    def keep_evidence(self, step: int, evidence: Evidence) -> bytes:
        """Keep evidence this node served with a verdict; returns its `evidence_hash`."""
        key = evidence_hash(evidence)
        self._objects[key] = (step, encode(evidence))
        return key

    def keep_version(self, version: int, weights: Mapping[str, torch.Tensor]) -> None:
        """Record this node's own weights after ``version`` updates (the ring's newest)."""
        digests = {}
        for name, t in weights.items():  # equal tensors (every norm's ones) share a digest
            (digest, _), = self.keep_tensors(version, [t]).items()
            digests[name] = digest
        self._versions[version] = digests
        for old in sorted(self._versions)[:-self.ring]:
            del self._versions[old]

    def keep_state(self, job_id: bytes, step: int, part: int,
                   state: Mapping[str, torch.Tensor]) -> None:
        """Keep a held part's full state at ``step`` of ``job_id``: CPU tensors the caller
        no longer changes (`SliceAdamW.state_dict` copies). Only the states of the newest
        `KEEP_STATES` steps stay."""
        self._states[state_key(job_id, step, part)] = (step, dict(state))
        steps = sorted({s for s, _ in self._states.values()})
        for key in [k for k, (s, _) in self._states.items() if s in steps[:-KEEP_STATES]]:
            del self._states[key]

    # -- reading ------------------------------------------------------------------------

    def encoded(self, key: bytes) -> bytes | None:
        """A kept certificate's or evidence's encoding by its hash."""
        item = self._objects.get(key)
        return None if item is None else item[1]

    def tensor(self, digest: bytes) -> torch.Tensor | None:
        item = self._tensors.get(digest)
        return None if item is None else item[1]

    def named(self, key: bytes) -> dict[str, torch.Tensor] | None:
        """The named set whose `tensors_digest` is ``key``, every tensor present, else None."""
        item = self._named.get(key)
        if item is None:
            return None
        out = {name: self.tensor(d) for name, d in item[1].items()}
        return None if any(t is None for t in out.values()) else out

    def version_digests(self, version: int) -> dict[str, bytes]:
        """The `tensor_digest` of each of this node's own tensors after ``version`` updates."""
        return dict(self._versions.get(version, {}))

    def versions(self) -> list[int]:
        return sorted(self._versions)

    def state(self, key: bytes) -> dict[str, torch.Tensor] | None:
        """A kept full state by its `state_key`."""
        item = self._states.get(key)
        return None if item is None else item[1]

    def state_steps(self) -> list[int]:
        """The steps this node keeps full states of."""
        return sorted({s for s, _ in self._states.values()})

    # -- forgetting ---------------------------------------------------------------------

    def prune(self, before: int) -> None:
        """Drop what is stamped before step ``before``, except tensors of the weight ring."""
        ring = {d for digests in self._versions.values() for d in digests.values()}
        for table in (self._objects, self._named):
            for key in [k for k, item in table.items() if item[0] < before]:
                del table[key]
        for key in [k for k, item in self._tensors.items() if item[0] < before and k not in ring]:
            del self._tensors[key]
