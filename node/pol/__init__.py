"""Proof of Learning in a node: what workers keep, the fetch protocol, the verifier (specs/pol.md).

The pure procedure (re-execution, the judge, replay and the join-time
audit's step check) is `proof_of_learning`; these are its services.
Sub-modules: `archive` (what a worker keeps for its verifiers, a miner's
own weight versions), `store` (where: the data dir's ``pol/``, or memory), `fetch` (`/pnode/pol/1.0.0`, both sides), `verifier`
(the service a mining node runs: draws, judges, submits verdicts), `spotvoter`
(the service a serving node runs: votes on the spot cases it is drawn for,
specs/ledger.md 5.2),
`catchup` (a catching-up miner's check of a holder's state), `window`
(window files: `pnode pol export`, `pnode verify cert`), `windowcheck`
(a window file's every byte against its job and receipts), `attacks`
(cheating, for the attack battery only).
"""

from node.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "node.pol.archive": ("KEEP_STATES", "PolArchive", "RING", "SYNC_S", "state_key"),
    "node.pol.fetch": ("ArchiveFetcher", "PolFetcher", "serve_pol"),
    "node.pol.verifier": ("Verifier",),
    "node.pol.spotvoter": ("SpotVoter", "rerun"),
    "node.pol.catchup": ("MAX_CHECKED", "StateCheck"),
    "node.pol.window": ("WINDOW_MAGIC", "WindowReport", "decode_window", "encode_window",
                        "export_op", "export_window", "read_window", "verify_window",
                        "write_window"),
    "node.pol.windowcheck": ("CheckedWindow", "Problem", "WindowError", "check_window"),
    "node.pol.attacks": ("ATTACKS", "PRODUCER_ATTACKS", "VERIFIER_ATTACKS", "WORKER_ATTACKS",
                         "WorkerAttack", "attack_parts", "withhold",
                         "attack_hooks", "verifier_tamper"),
})
