"""Proof of Learning: per-compute-block certificates, checked by re-execution.

specs/pol.md is the normative text. A receipt commits a `UnitCert` (what
its compute block read and produced) by ``cert_hash``; a verifier drawn at
random after the receipt is fixed re-executes that one block and signs a
verdict whose ``evidence_hash`` names the `Evidence` it serves.

The unit of work and its verification, as pure code: torch is allowed;
no node, socket, clock, thread or file. What a check needs from the
network comes in as a typed `Protocol` (`judge.Fetcher`), and when to run
it is the node's (`node.mine`, `node.pol`). Modules:

- `certificate`: the wire objects (tags 33-36), their hashes,
  well-formedness rules and the distance of the threshold rule (no torch);
- `kinds`: what a pushed tensor is (`StepTensors.what`; no torch);
- `units`: a job's units, its commitments (model, data, hyperparameters)
  and its `Job` transaction;
- `phases`: a step's message keys, `Phase` and `PhaseResult`;
- `step_plan`: `StepPlan`, what each unit of a step reads, computes and
  pushes, and the certificate it commits;
- `reexecute`: one unit re-run from its committed weights and inputs;
- `judge`: the verifier's procedure on one receipt;
- `replay`: a job's steps replayed whole on a scratch model;
- `joinaudit`: windows of the chain's training replayed and compared;
- `errors`: `PolError` and its subclasses.

The package may import compute/ and ledger/, never node/ or wallet/; the
ledger never imports it (ARCHITECTURE.md, tests/test_layers.py).
"""
