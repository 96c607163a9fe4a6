"""The chain's random beacon: one VRF output per block that its producer cannot choose.

Owns the beacon's three rules (specs/ledger.md 5.1 step 4b): block 0's
beacon is fixed by the chain id; block b's producer proves, with its node
key, the ECVRF (`ledger.vrf`) over the parent's beacon and b, and the
block's beacon is the hash of that proof's output. The state keeps the
latest (`ledger.records.Beacon` under `KEY_BEACON`).

Attack note: a block hash can be ground (time, which transactions, their
order); a VRF output cannot, since one key has one output per input. What
is left to a producer is to withhold its block, which hands the slot to the
next in the ladder and its own, other output: one re-draw per slot held,
priced in `ledger.audit.economics_problem` (specs/pol.md 5.1).
"""

from __future__ import annotations

from ledger import crypto, vrf

H_BEACON = crypto.H_BEACON
NO_PROOF = bytes(vrf.PROOF_BYTES)  # block 0's vrf_proof: nobody produced it


def genesis_beacon(chain_id: str) -> bytes:
    """Block 0's beacon: H("pnode:beacon:genesis:" || utf8(chain id)), known to all."""
    return crypto.domain_hash(H_BEACON, b"genesis:" + chain_id.encode())


def vrf_input(parent_beacon: bytes, height: int) -> bytes:
    """The ECVRF input (alpha) of block ``height``: "pnode:beacon:" || parent's beacon || u64 height."""
    return H_BEACON + parent_beacon + height.to_bytes(8, "big")


def beacon_from_proof(producer: bytes, parent_beacon: bytes, height: int, proof: bytes) -> bytes:
    """Check a block's proof and return its beacon: H("pnode:beacon:" || VRF output).

    Raises:
        BadBeacon: the proof is not ``producer``'s VRF proof over this input.
    """
    output = vrf.verify(producer, vrf_input(parent_beacon, height), proof)
    return crypto.domain_hash(H_BEACON, output)


def prove_beacon(key: crypto.SigningKey, parent_beacon: bytes, height: int) -> tuple[bytes, bytes]:
    """(proof, beacon) for the block ``height`` that ``key`` produces."""
    proof = vrf.prove(key.seed(), vrf_input(parent_beacon, height))
    return proof, crypto.domain_hash(H_BEACON, vrf.proof_to_hash(proof))
