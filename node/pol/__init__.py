"""Proof of Learning in a node: what workers keep, the fetch protocol, the verifier (specs/pol.md).

Sub-modules: `archive` (what a worker keeps for its verifiers, a miner's
own weight versions), `fetch` (`/pnode/pol/1.0.0`, both sides), `reexecute`
(a unit re-run from its committed weights and inputs), `judge` (the
verifier's procedure on one receipt), `verifier` (the service a mining node
runs), `catchup` (a catching-up miner's check of a holder's state),
`window` (window files: `pnode pol export`, `pnode verify cert`),
`replay` (a job's steps replayed whole on a scratch model), `joinaudit`
(windows of the chain's training replayed and compared: `pnode verify
pol`),
`attacks` (cheating, for the attack battery only).
"""

from node.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "node.pol.archive": ("KEEP_STATES", "PolArchive", "RING", "state_key"),
    "node.pol.fetch": ("ArchiveFetcher", "PolFetcher", "serve_pol"),
    "node.pol.judge": ("Case", "Judgement", "judge"),
    "node.pol.reexecute": ("Reexecutor", "Rerun", "WeightsMismatch"),
    "node.pol.verifier": ("Verifier",),
    "node.pol.catchup": ("MAX_CHECKED", "StateCheck"),
    "node.pol.window": ("WindowError", "WindowReport", "export_op", "export_window",
                        "read_window", "verify_window", "write_window"),
    "node.pol.replay": ("Replayer",),
    "node.pol.joinaudit": ("ReplayReport", "UnitCheck", "check_step", "replay_window",
                           "windows_of"),
    "node.pol.attacks": ("ATTACKS", "VERIFIER_ATTACKS", "WORKER_ATTACKS", "WorkerAttack",
                         "attack_hooks", "verifier_tamper"),
})
