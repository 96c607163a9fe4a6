"""Proof of Learning: per-compute-block certificates, checked by re-execution.

specs/pol.md is the normative text. A receipt commits a `UnitCert` (what
its compute block read and produced) by ``cert_hash``; a verifier drawn at
random after the receipt is fixed re-executes that one block and signs a
verdict whose ``evidence_hash`` names the `Evidence` it serves.

Modules:

- `proof_of_learning.certificate`: the wire objects (tags 33-36), their
  hashes, well-formedness rules and the distance of the threshold rule
  (pure core: no torch, no node, no clock, socket or file);
- `proof_of_learning.errors`: `PolError` and its subclasses.

The package may import compute/ and ledger/, never node/ or wallet/; the
ledger never imports it (DESIGN.md section 2, tests/test_layers.py).
"""
