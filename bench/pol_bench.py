"""Proof of Learning figures (issue 16): verification cost, honest distances, detection, bytes.

One process plays a worker running the devnet's default job (its units
phase by phase, archived as a miner archives them: tests/node/pol/polkit.py)
and a verifier judging every unit with the node's own code
(`proof_of_learning.judge.judge`, a `Reexecutor`, fetches answered from the worker's
archive through the protocol's encoder: the network is left out, the
bytes are counted).

1. Cost: seconds to train a step (every unit's phases: the baseline) vs
   seconds to judge every unit of it, both at the job's pinned thread count
   (`JobConfig.threads`, 2), step by step,
   the verifier holding the unit's layers as the draw prefers (its own
   weights of the step in its ring: not fetched);
   the verification fraction at an audit rate p is p x the median of the
   per-step judge / train ratios (target <= 10 % at the default p = 0.1).
2. Honest distances: the worker at the job's 2 threads, a verifier that
   ignores the pin at 1; the largest distance over every committed tensor
   (0: bit-exact), against the threshold.
3. Detection: per worker attack (node/pol/attacks.py; --attacks), the
   share of a cheater's units an audit fails, and the receipts a cheater
   signs before its first failing audit at p (1 / (p x share)).
4. Bytes: a receipt, a verdict, evidence (exact, tolerance), and what one
   audit fetches.

5. The join-time audit: seconds to train a chain of ``--chain-steps`` steps
   (the baseline) against seconds to replay it all from the initial model,
   every receipt compared (`proof_of_learning.joinaudit`), and one window from the
   last checkpoint's kept states.

Usage:  .venv/bin/python bench/pol_bench.py [--steps 9] [--seeds 1] [--audit-bps 1000]
                                            [--chain-steps 200] [--attacks KIND,...]
                                            [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import benchkit  # noqa: E402
import torch  # noqa: E402
import trio  # noqa: E402

from ledger.codec import encode  # noqa: E402
from ledger.crypto import SigningKey  # noqa: E402
from ledger.types import ZERO_SIG, Verdict  # noqa: E402
from node.pol import WORKER_ATTACKS, ArchiveFetcher, PolArchive, WorkerAttack  # noqa: E402
from node.wire import PolReply  # noqa: E402
from proof_of_learning.certificate import (  # noqa: E402
    EXACT, FAILING, PASS, REASONS, UNAVAILABLE, bits_float,
)
from proof_of_learning.judge import judge, run_inline  # noqa: E402
from proof_of_learning.reexecute import Reexecutor  # noqa: E402
from node.pol.archive import state_key  # noqa: E402
from proof_of_learning.joinaudit import replay_window  # noqa: E402
from proof_of_learning.replay import Replayer  # noqa: E402
from tests.node.pol.polkit import JOB, case_of, make_worker, run_step  # noqa: E402

DEFAULT_JOB = {"batch_size": 16, "seq_len": 64}  # the devnet's: `devnet_job`'s defaults


_REEXECUTORS: dict = {}


def judge_step(w, t: int, threads: int | None = None, archive=None, chain=None
               ) -> tuple[dict, float, list[int]]:
    """(judgement per unit index, seconds, fetched bytes per unit).

    ``threads``: the verifier's intra-op thread count (None: the job's, as
    every node pins it); another count plays a node that ignored the pin.
    Re-runs inline on this thread, where the count is set. The `Reexecutor`
    is made once per job and count, as a node makes it (not timed).
    ``chain(index)``: the receipts on chain when unit ``index`` is judged
    (default: the worker's own).
    """
    rx = _REEXECUTORS.get((id(w.config), threads))
    if rx is None:
        rx = _REEXECUTORS[(id(w.config), threads)] = Reexecutor(w.config)
    rx.plan.threads = threads or w.config.threads
    out, sizes = {}, []
    began = time.perf_counter()
    for (step, index) in sorted(w.receipts):
        if step != t:
            continue
        fetcher = ArchiveFetcher({"worker": w.archive})
        case = case_of(w, t, index, None if chain is None else chain(index))
        out[index] = trio.run(functools.partial(judge, run_sync=run_inline), case,
                              fetcher, rx, archive or PolArchive())
        sizes.append(fetcher.bytes)
    return out, time.perf_counter() - began, sizes



def cost_and_noise(steps: int, seed: int = 0) -> dict:
    w = make_worker(2, **DEFAULT_JOB, seed=seed)
    train_s, judge_s, worst, passes, units, fetched, exact = 0.0, 0.0, 0.0, 0, 0, [], 0
    ratios = []
    for t in range(steps):
        # The verifier holds the unit's layers, as the draw prefers: its own weights of
        # step t (an honest holder's are the worker's) are in its ring.
        ring = PolArchive()
        ring.keep_version(t, dict(w.model.named_parameters()))
        began = time.perf_counter()
        run_step(w, t)
        seconds_t = time.perf_counter() - began
        train_s += seconds_t
        _, seconds, sizes = judge_step(w, t, archive=ring)  # the cost, at the job's count
        judge_s += seconds
        ratios.append(seconds / seconds_t)
        fetched += sizes
        judged, _, _ = judge_step(w, t, threads=1)  # the noise: another thread count
        for j in judged.values():
            units += 1
            passes += j.reason == PASS
            exact += j.evidence.mode == EXACT
            for d in j.evidence.distances:
                worst = max(worst, bits_float(d.rel_max_err_bits) or 0.0)
    return {"steps": steps, "units": units, "train_s": train_s, "judge_s": judge_s,
            "median_ratio": statistics.median(ratios),
            "honest_pass": passes, "honest_exact": exact, "honest_worst_distance": worst,
            "fetch_bytes_per_audit": sum(fetched) / len(fetched)}


def overhead(steps: int, audit_bps: int, recheck_bps: int, seed: int = 0) -> dict:
    """The cost of PoL against PoL-free training of the same job, step by step, alternating.

    PoL-free: `compute.train.train_step_decomposed` (the same blocks, no digests, no
    certificates, no archive). The worker: the miner's phases with every PoL duty
    (digests, certificates, its archive on disk as `pnode start` keeps it, the
    update). The verifier: every unit of the step judged (`judge_step`), as a
    verifier not holding the layers (weights fetched). Per step the three ratios
    to PoL-free; the fractions are their medians: the worker's overhead
    (worker / free - 1) and verification at the rates (p x (1 + r) x judge / free:
    a pass is re-checked with probability r).
    """
    import tempfile
    from compute.data import batch, load_corpus, make_model
    from compute.device import pinned_threads
    from compute.train import make_sections, train_step_decomposed
    with tempfile.TemporaryDirectory() as tmp:
        w = make_worker(2, **DEFAULT_JOB, seed=seed, path=Path(tmp) / "pol", sync_each=False)
        config = w.config
        model = make_model(config)
        sections = make_sections(model, config)
        corpus = load_corpus(config.data)
        free, worker, judged = [], [], []
        for t in range(steps):
            ids, targets = batch(config, t, corpus=corpus)
            began = time.perf_counter()
            with pinned_threads(config.threads):
                train_step_decomposed(model, sections, ids, targets)
            free.append(time.perf_counter() - began)
            began = time.perf_counter()
            run_step(w, t)
            worker.append(time.perf_counter() - began)
            judged.append(judge_step(w, t)[1])
    p, r = audit_bps / 10_000, recheck_bps / 10_000
    worker_ratio = statistics.median(x / f for x, f in zip(worker, free))
    judge_ratio = statistics.median(j / f for j, f in zip(judged, free))
    verify = p * (1 + r) * judge_ratio
    return {"steps": steps, "free_s": sum(free), "worker_s": sum(worker),
            "judge_s": sum(judged), "worker_ratio": worker_ratio, "judge_ratio": judge_ratio,
            "worker_overhead": worker_ratio - 1, "verification": verify,
            "total": worker_ratio - 1 + verify, "audit_bps": audit_bps,
            "recheck_bps": recheck_bps}


def detection(kinds=WORKER_ATTACKS) -> dict:
    torch.set_num_threads(1)
    out = {}
    for kind in kinds:
        if kind == "poisoned-push":
            continue  # refused by the receiver, not audited (specs/consensus.md 5.3)
        w = make_worker(2)
        attack = WorkerAttack(kind)
        verifier = PolArchive()
        honest = make_worker(2, key=SigningKey(b"\x06" * 32))  # another account
        for t in range(2):
            run_step(w, t, attack.run_phase(w.plan) if kind != "stale-weights" else None,
                     attack.certify)
            run_step(honest, t)
            verifier.keep_version(t + 1, dict(honest.model.named_parameters()))
            if kind == "stale-weights":  # the cheater never steps: back to its initial weights
                with torch.no_grad():
                    for p, p0 in zip(w.model.parameters(), make_worker(2).model.parameters()):
                        p.copy_(p0)
        # Only a holder's own weights unmask stale ones (the other attacks' weights drift from
        # the cheated updates too, which the ring would also catch: left out to show each kind),
        # and only where another account's receipt of the step backs them: here every unit
        # but the one judged is the honest account's.
        stale = kind == "stale-weights"
        judged, _, _ = judge_step(w, 1, archive=verifier if stale else None, chain=(
            lambda i: {**honest.receipts, (1, i): w.receipts[(1, i)]}) if stale else None)
        failed = [j.reason for j in judged.values() if j.reason in FAILING]
        out[kind] = {"units": len(judged), "failed": len(failed),
                     "unavailable": sum(j.reason == UNAVAILABLE for j in judged.values()),
                     "reasons": sorted({REASONS[r] for r in failed})}
    return out


def join_replay(steps: int, every: int = 16) -> dict:
    """Seconds to train ``steps`` steps (the baseline) against seconds for a joining node
    to replay them all from the initial model, every receipt compared, and one window of
    ``every`` steps from the last checkpoint's kept states. Both at the job's pinned
    thread count; the worker's own count 1 and the replaying node's 2, to show the pin
    is what makes the replay exact."""
    torch.set_num_threads(1)
    w = make_worker(2, **DEFAULT_JOB, state_every=every)  # its step count: not checked
    began = time.perf_counter()
    for t in range(steps):
        run_step(w, t)
    train_s = time.perf_counter() - began

    async def source(step, part, n):
        return None if n else w.archive.state(state_key(JOB, step, part)) or {}
    rp = Replayer(w.config)
    torch.set_num_threads(2)  # another node, another count: the job's pin holds
    began = time.perf_counter()
    whole = trio.run(replay_window, rp, JOB, w.units, 0, steps, w.receipts, None, run_inline)
    out = {"steps": steps, "train_s": train_s, "replay_s": time.perf_counter() - began,
           "replay_status": whole.status, "units_bit_exact": whole.matched,
           "units": len(w.receipts), "window_first": None}
    kept = [s for s in w.archive.state_steps() if s < steps]  # a window of 1 step at least
    if kept:
        began = time.perf_counter()
        window = trio.run(replay_window, rp, JOB, w.units, kept[-1],
                          min(every, steps - kept[-1]), w.receipts, source, run_inline)
        out.update(window_first=kept[-1], window_steps=window.replayed,
                   window_s=time.perf_counter() - began, window_status=window.status)
    return out


def sizes() -> dict:
    w = make_worker(2)
    run_step(w, 0)
    receipt = w.receipts[(0, 3)]
    verdict = Verdict("devnet-abcdef", b"v" * 32, bytes(32), 1, bytes(32), ZERO_SIG)
    judged, _, _ = judge_step(w, 0)
    exact = len(encode(judged[3].evidence))
    bad = make_worker(2)
    run_step(bad, 0, WorkerAttack("scaled-gradients").run_phase(bad.plan))
    tol = max(len(encode(j.evidence)) for j in judge_step(bad, 0)[0].values())
    return {"receipt": len(encode(receipt)), "receipt_weights_hash_field": 34,
            "verdict": len(encode(verdict)), "evidence_exact": exact, "evidence_tolerance": tol,
            "empty_reply": len(encode(PolReply(0, b"", ())))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=9, help="steps per seed")
    ap.add_argument("--seeds", type=int, default=1, help="job seeds (initial weights, batches)")
    ap.add_argument("--audit-bps", type=int, default=1000)
    ap.add_argument("--recheck-bps", type=int, default=1000)
    ap.add_argument("--attacks", default=",".join(WORKER_ATTACKS),
                    help="comma-separated worker attacks to detect [default: all]")
    ap.add_argument("--chain-steps", type=int, default=200,
                    help="steps of the chain a joining node replays")
    ap.add_argument("--json", action="store_true")
    args = benchkit.parse_args(ap, {"steps": 1, "chain_steps": 2, "attacks": "scaled-gradients"})
    p = args.audit_bps / 10_000
    runs = [cost_and_noise(args.steps, seed) for seed in range(args.seeds)]
    cost = {k: sum(r[k] for r in runs) for k in ("steps", "units", "train_s", "judge_s",
                                                  "honest_pass", "honest_exact")}
    cost["median_ratio"] = statistics.median(r["median_ratio"] for r in runs)
    cost["honest_worst_distance"] = max(r["honest_worst_distance"] for r in runs)
    cost["fetch_bytes_per_audit"] = statistics.mean(r["fetch_bytes_per_audit"] for r in runs)
    honest_cost = overhead(args.steps, args.audit_bps, args.recheck_bps)
    det = detection([k for k in args.attacks.split(",") if k])
    size = sizes()
    join = join_replay(args.chain_steps)
    fraction = p * cost["median_ratio"]
    info = {"cost": cost, "verification_fraction": fraction, "audit_bps": args.audit_bps,
            "overhead": honest_cost, "detection": det, "bytes": size, "join": join}
    benchkit.report(args, info, lambda: print_table(cost, fraction, p, det, size, join,
                                                    honest_cost), indent=1)


def print_table(cost: dict, fraction: float, p: float, det: dict, size: dict, join: dict,
                over: dict) -> None:
    print(f"against PoL-free training of the same job ({over['steps']} steps, medians of "
          "per-step ratios):")
    print(f"{'  PoL-free step (baseline), s/step':44} {over['free_s'] / over['steps']:>14.3f}")
    print(f"{'  worker with PoL (disk archive), s/step':44} "
          f"{over['worker_s'] / over['steps']:>14.3f}   {over['worker_ratio']:.2f}x")
    print(f"{'  judge every unit, s/step':44} {over['judge_s'] / over['steps']:>14.3f}   "
          f"{over['judge_ratio']:.2f}x")
    print(f"{'  worker overhead':44} {over['worker_overhead']:>14.1%}")
    rates = f"p = {over['audit_bps'] / 10_000:g}, r = {over['recheck_bps'] / 10_000:g}"
    print(f"{'  verification at ' + rates:44} {over['verification']:>14.1%}")
    print(f"{'  total':44} {over['total']:>14.1%}\n")
    print(f"{'measure':44} {'value':>14}")
    print(f"{'train: every unit of a step, s/step':44} {cost['train_s'] / cost['steps']:>14.3f}"
          "   (baseline)")
    print(f"{'judge: every unit of a step, s/step':44} {cost['judge_s'] / cost['steps']:>14.3f}")
    print(f"{'judge / train, median over steps':44} {cost['median_ratio']:>14.2f}x")
    print(f"{f'verification fraction at p = {p:g}':44} {fraction:>14.1%}")
    print(f"{'honest units passed (2 vs 1 threads)':44} "
          f"{cost['honest_pass']:>7}/{cost['units']:<6}")
    print(f"{'  of them bit-exact':44} {cost['honest_exact']:>7}/{cost['units']:<6}")
    print(f"{'largest honest distance':44} {cost['honest_worst_distance']:>14.3g}")
    print(f"{'bytes fetched per audit (mean)':44} {cost['fetch_bytes_per_audit']:>14,.0f}")
    for k, v in size.items():
        print(f"{'bytes: ' + k:44} {v:>14,}")
    print(f"\njoin-time audit of a {join['steps']}-step chain:")
    print(f"{'  train every step (baseline)':44} {join['train_s']:>13.1f}s")
    print(f"{'  replay every step from the initial model':44} {join['replay_s']:>13.1f}s"
          f"   {join['replay_s'] / join['train_s']:.2f}x of training, {join['replay_status']}, "
          f"{join['units_bit_exact']}/{join['units']} units bit-exact")
    if join["window_first"] is not None:
        print(f"{'  one window from the step-' + str(join['window_first']) + ' states':44} "
              f"{join['window_s']:>13.1f}s   {join['window_steps']} steps, "
              f"{join['window_status']}")
    print(f"\n{'attack':20} {'units failed':>14} {'receipts to catch at p':>24}  reasons")
    for kind, d in det.items():
        share = d["failed"] / d["units"]
        expect = f"{1 / (p * share):.1f}" if share else "never"
        unavailable = f" ({d['unavailable']} unavailable)" if d["unavailable"] else ""
        print(f"{kind:20} {d['failed']:>6}/{d['units']:<7} {expect:>24}  "
              f"{', '.join(d['reasons'])}{unavailable}")


if __name__ == "__main__":
    main()
