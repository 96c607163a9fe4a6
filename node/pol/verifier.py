"""The verifier: re-executing the sampled units the chain assigns to this node (specs/pol.md 7).

Owns `Verifier`, which a mining node runs beside its `Miner`. After each
new tip it lists the `Pending` receipts that are sampled (or whose pass is
re-checked, or whose fail is appealed), name this node's key as their
verifier (or among the appeal's) and have no verdict from it yet
(`ledger.audit`), judges each
(`proof_of_learning.judge.judge`: fetch, check, re-execute, compare), keeps the
evidence where `/pnode/pol/1.0.0` serves it, and submits a signed
`Verdict` naming the evidence's hash. It also appeals every failing
verdict on this node's own receipts (specs/pol.md 6.6).

Only units of the job this node mines can be judged (it alone has the
job's config); another job's sampled receipts are left alone, and the
chain strikes the silence (specs/pol.md 6.3).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence

import trio
from libp2p.peer.id import ID

from compute.data import JobConfig
from ledger import audit
from ledger.crypto import SigningKey
from ledger.errors import ValidationError
from ledger.state import APPEAL, JOB, NODE, PENDING
from ledger.types import ZERO_SIG, Appeal, Receipt, Verdict, sign, tx_hash
from node import torch_thread
from node.chain import (
    CLOSED_STEP_BLOCKS, ChainService, TxGossip, bonded_peers, job_named, receipt_at,
    receipts_between, step_receipts, unit_receipt,
)
from proof_of_learning.units import hyper_hash
from node.pol.archive import KEEP_STATES, PolArchive, state_key
from node.pol.fetch import PolFetcher
from proof_of_learning.joinaudit import ReplayReport, replay_window, windows_of
from proof_of_learning.judge import Case, Judgement, judge
from proof_of_learning.reexecute import Reexecutor
from proof_of_learning.replay import Replayer
from proof_of_learning.certificate import FAILING, REASONS, Evidence
from proof_of_learning.errors import PolError

log = logging.getLogger(__name__)

__all__ = ["Verifier"]

class Verifier:
    """Judges this node's sampled receipts of ``config``'s job (module docstring).

    Args:
        service, txs: the node's chain service and transaction gossip.
        key: the node key (the chain names verifiers by it; it signs verdicts).
        config: the job this node mines.
        archive: where evidence is kept for `/pnode/pol/1.0.0`, and this
            node's own weight versions are read.
        fetcher: fetches what a judgement needs from peers.
        report: gets a line per verdict.
        tamper: test-only (`node.pol.attacks`): changes the evidence before
            it is signed (a lazy or malicious verifier).
        job_id: the job judged (None: the first on chain whose spec is ``config``).
    """

    def __init__(self, service: ChainService, txs: TxGossip, key: SigningKey,
                 config: JobConfig, archive: PolArchive, fetcher: PolFetcher, *,
                 report: Callable[[str], None] = lambda line: None,
                 tamper: Callable[[Case, Judgement], Evidence] | None = None,
                 job_id: bytes | None = None):
        self.service, self.txs, self.key, self.config = service, txs, key, config
        self.wanted = job_id
        self.archive, self.fetcher, self.report, self.tamper = archive, fetcher, report, tamper
        self.reexecutor: Reexecutor | None = None
        self.replayer: Replayer | None = None  # for the join-time audit's window replays
        self._replaying = trio.Lock()
        self.judged: set[bytes] = set()  # receipt hashes with a verdict submitted
        self.to_appeal: set[bytes] = set()  # own receipts failed by a verifier
        self.appealed: set[bytes] = set()  # ... whose appeal was sent
        self.appeals_sent = 0
        self.sent = {name: 0 for name in REASONS}
        self.last_step = 0  # the newest step judged (evidence is kept from it)

    def status(self) -> dict:
        """The verifier's fields of `pnode status`: verdicts sent, by reason, and appeals
        sent against fails of this node's receipts."""
        return {"verdicts": {n: c for n, c in self.sent.items() if c},
                "appeals": self.appeals_sent}

    async def run(self) -> None:
        """Judge sampled receipts until cancelled."""
        tip = None
        while True:
            if tip is not None:
                await self.service.wait_tip_change(tip)
            tip, cases = await self.service.call(self._cases)
            await self._appeal()
            for case in cases:
                if self.reexecutor is None:
                    try:
                        self.reexecutor = await torch_thread.run_sync(Reexecutor, self.config)
                    except Exception as exc:  # a job that cannot run here (its miner says so)
                        self.report(f"cannot judge this job's units: {exc}")
                        return
                await self._judge_and_send(case)

    async def _judge_and_send(self, case: Case) -> None:
        try:
            judgement = await judge(case, self.fetcher, self.reexecutor, self.archive,
                                   run_sync=torch_thread.run_sync, me=self.key.public)
        except Exception:  # a bug here must not take the node down; the chain strikes silence
            log.exception("judging receipt %s..", case.receipt_hash.hex()[:16])
            self.judged.add(case.receipt_hash)
            return
        evidence = judgement.evidence
        if self.tamper is not None:
            evidence = self.tamper(case, judgement)
        self.last_step = max(self.last_step, judgement.step)
        ev_hash = self.archive.keep_evidence(self.last_step, evidence)
        verdict = sign(Verdict(self.service.chain.chain_id, self.key.public, case.receipt_hash,
                               evidence.reason, ev_hash, ZERO_SIG), self.key)
        self.judged.add(case.receipt_hash)
        try:
            await self.txs.submit(verdict)
        except ValidationError as exc:  # e.g. its window closed meanwhile
            log.info("verdict on %s.. refused: %s", case.receipt_hash.hex()[:16], exc)
            return
        self.sent[REASONS[evidence.reason]] += 1
        detail = f" ({judgement.detail})" if judgement.detail else ""
        self.report(f"verified step {judgement.step} unit {judgement.index} of "
                    f"{case.receipt.node_key.hex()[:8]}..: {REASONS[evidence.reason]}{detail}")

    # -- the chain's view (in the chain thread) -----------------------------------------

    def _receipt_lookup(self, job_id: bytes, units, height: int):
        async def receipt_of(step: int, index: int) -> Receipt | None:
            return await self.service.call(unit_receipt, self.service.chain, job_id, units,
                                           step, index, height)
        return receipt_of

    def _cases(self) -> tuple[bytes, list[Case]]:
        """(tip, the sampled receipts this node must judge and has not)."""
        chain = self.service.chain
        st = chain.state
        me = self.key.public
        job_id, peers = self._job_and_peers()
        cases = []
        if job_id is None:
            return chain.tip_hash, cases
        pending_ids = st.ids(PENDING)
        self.judged &= set(pending_ids)  # judged receipts since settled: forget them
        self.to_appeal &= set(pending_ids)
        self.appealed &= set(pending_ids)
        accounts = None  # built once, when a case needs it
        for rh in pending_ids:
            pending = st.get(PENDING + rh)
            if pending.status == audit.FAILED and pending.node_key == me:
                self.to_appeal.add(rh)
            if not self._mine_to_judge(st, rh, pending) or rh in self.judged:
                continue
            receipt = receipt_at(chain, pending.height, rh)
            if receipt is not None and receipt.job_id == job_id:
                accounts = accounts if accounts is not None else self._accounts()
                cases.append(self._case(receipt, rh, pending.height, job_id, peers, accounts))
        return chain.tip_hash, cases

    def _mine_to_judge(self, st, rh: bytes, pending) -> bool:
        """Whether this node is drawn to judge ``pending`` and has not voted (chain thread)."""
        me = self.key.public
        if pending.status in (audit.SAMPLED, audit.RECHECKING):
            return pending.verifier == me
        if pending.status == audit.APPEALING:
            record = st.get(APPEAL + rh)
            return me in record.verifiers and \
                record.votes[record.verifiers.index(me)] == audit.NO_VOTE
        return False

    async def _appeal(self) -> None:
        """Appeal every failing verdict on this node's own receipts (specs/pol.md 6.6).

        An honest node signs only work it did as the job says, so a fail on
        it is the verifier's error or lie: fresh verifiers decide, and the
        loser is slashed. Its units stay in the archive for them to fetch
        (`AUDITED_KEEP_STEPS`).
        """
        for rh in sorted(self.to_appeal - self.appealed):
            self.appealed.add(rh)
            appeal = sign(Appeal(self.service.chain.chain_id, self.key.public, rh, ZERO_SIG),
                          self.key)
            try:
                await self.txs.submit(appeal)
            except ValidationError as exc:  # e.g. its window closed meanwhile
                log.info("appeal of %s.. refused: %s", rh.hex()[:16], exc)
                continue
            self.appeals_sent += 1
            self.report(f"appealed the failing verdict on receipt {rh.hex()[:16]}..")

    def _job_and_peers(self) -> tuple[bytes | None, list[str]]:
        """The job this node can judge, and every bonded node's peer id (chain thread)."""
        st = self.service.chain.state
        return job_named(st, hyper_hash(self.config), self.wanted), bonded_peers(st)

    def _accounts(self) -> dict[bytes, bytes]:
        """Every registered node key's account (chain thread)."""
        st = self.service.chain.state
        return {key: st.get(NODE + key).account for key in st.ids(NODE)}

    def _case(self, receipt: Receipt, rh: bytes, height: int, job_id: bytes,
              peers: list[str], accounts: dict[bytes, bytes]) -> Case:
        """A receipt's `Case`: its worker asked first, then every other bonded node."""
        units = self.service.chain.state.get(JOB + job_id).job.units
        return Case(receipt_hash=rh, receipt=receipt, units=units, height=height,
                    peers=self._worker_first(receipt, peers),
                    receipt_of=self._receipt_lookup(job_id, units, height), accounts=accounts)

    def _worker_first(self, receipt: Receipt, peers: list[str]) -> tuple[str, ...]:
        """Whom to ask for a receipt's tensors: its worker, then every other bonded node."""
        node = self.service.chain.state.get(NODE + receipt.node_key)
        worker = str(ID(node.peer_id)) if node is not None else None
        return tuple([worker] * (worker is not None) + [p for p in peers if p != worker])

    def _recent_cases(self, blocks: int) -> list[Case]:
        """Every receipt of this node's job in the last ``blocks`` blocks (chain thread)."""
        chain = self.service.chain
        job_id, peers = self._job_and_peers()
        if job_id is None:
            return []
        accounts = self._accounts()
        return [self._case(tx, tx_hash(tx), h, job_id, peers, accounts)
                for h, tx in receipts_between(chain, chain.height - blocks + 1)
                if tx.job_id == job_id]

    async def receipts_of(self, job_id: bytes, step: int) -> list[tuple[Receipt, tuple[str, ...]]]:
        """The included receipts of ``step`` of ``job_id``, each with whom to ask (its worker
        first): what `node.pol.catchup.StateCheck` compares a holder's state with."""
        def scan() -> list[tuple[Receipt, tuple[str, ...]]]:
            chain = self.service.chain
            record = chain.state.get(JOB + job_id)
            if record is None:
                return []
            peers = bonded_peers(chain.state)
            found = step_receipts(chain, job_id, record.job.units, [step],
                                  back=CLOSED_STEP_BLOCKS)
            return [(r, self._worker_first(r, peers)) for _, r in sorted(found.items())]
        return await self.service.call(scan)

    # -- the join-time audit (`pnode verify pol`) ---------------------------------------

    async def audit(self, args: dict) -> dict:
        """The ``pol_audit`` control op: judge receipts of the last ``blocks`` blocks, and
        replay windows of the job (`replay`).

        Args (of the op): ``count`` (a sample of that many, drawn with this
        node's own randomness, so no worker can know which; default 8),
        ``all`` (every one instead, and every closed step replayed from the
        initial model), ``blocks`` (default 256), ``windows`` (windows to
        replay; default 0, `pnode verify pol` asks 2). Nothing is sent to the
        chain: this is the node's own check (specs/pol.md 10).

        Raises:
            PolError: bad arguments.
        """
        count, everything, blocks = args.get("count", 8), args.get("all", False), \
            args.get("blocks", 256)
        windows = args.get("windows", 0)
        if not (isinstance(count, int) and isinstance(blocks, int) and count >= 1
                and blocks >= 1 and isinstance(everything, bool)
                and isinstance(windows, int) and windows >= 0):
            raise PolError('"count" and "blocks" must be whole numbers of at least 1, '
                           '"windows" of at least 0, "all" true or false')
        cases = await self.service.call(self._recent_cases, blocks)
        chosen = cases if everything else random.SystemRandom().sample(
            cases, min(count, len(cases)))
        if chosen and self.reexecutor is None:
            self.reexecutor = await torch_thread.run_sync(Reexecutor, self.config)
        rows = []
        for case in chosen:
            j = await judge(case, self.fetcher, self.reexecutor, self.archive,
                            run_sync=torch_thread.run_sync, me=self.key.public)
            rows.append({"receipt": case.receipt_hash.hex(), "height": case.height,
                         "worker": case.receipt.node_key.hex(), "step": j.step,
                         "index": j.index, "reason": REASONS[j.reason], "detail": j.detail})
        tally = {name: sum(r["reason"] == name for r in rows) for name in REASONS}
        failed = sum(n for name, n in tally.items() if REASONS.index(name) in FAILING)
        replays = await self.replay(windows, everything) if windows or everything else []
        return {"receipts_seen": len(cases), "judged": len(rows), "failed": failed,
                "passed": tally["pass"], "unavailable": tally["unavailable"],
                "units": rows, "windows": replays,
                "windows_failed": sum(w["status"] == "fail" for w in replays)}

    async def replay(self, windows: int, everything: bool) -> list[dict]:
        """Replay ``windows`` windows of the job's closed steps, drawn with this node's own
        randomness, or (``everything``) every closed step from the initial model
        (`proof_of_learning.joinaudit`); each window's report as JSON.

        Only windows that can start are drawn: the one from the initial model, and
        those whose first step's states miners still keep (the newest `KEEP_STATES`
        checkpoints). One replay at a time: they share the scratch model.
        """
        async with self._replaying:
            job_id, units, closed, receipts, peers = await self.service.call(self._replay_view)
            if job_id is None or not closed:
                return []
            every = self.config.state_every
            reachable = [(first, n) for first, n in windows_of(closed, every)
                         if first == 0 or first > closed - KEEP_STATES * every]
            chosen = [(0, closed)] if everything else sorted(
                random.SystemRandom().sample(reachable, min(windows, len(reachable))))
            if self.replayer is None:
                self.replayer = await torch_thread.run_sync(Replayer, self.config)
            source = self.state_source(job_id, peers)
            out = []
            for first, steps in chosen:
                try:
                    report = await replay_window(self.replayer, job_id, units, first, steps,
                                                 receipts, source, torch_thread.run_sync)
                except Exception as exc:  # a bug must not cost the other windows' results
                    log.exception("replaying steps %d..%d", first, first + steps - 1)
                    report = ReplayReport(first, steps, "unavailable",
                                          detail=f"the replay failed: {exc}")
                out.append(report.to_json())
            return out

    def _replay_view(self):
        """(job id, units, closed steps, every receipt of them by (step, unit index), peers)
        of this node's job (chain thread)."""
        chain = self.service.chain
        job_id, peers = self._job_and_peers()
        if job_id is None:
            return None, (), 0, {}, peers
        record = chain.state.get(JOB + job_id)
        units, closed = record.job.units, min(record.step, record.job.steps)
        receipts = step_receipts(chain, job_id, units, range(closed))  # the whole chain
        return job_id, units, closed, receipts, peers

    def state_source(self, job_id: bytes, peers: Sequence[str]):
        """Where a window's states come from: this node's archive, then each of ``peers``
        (`proof_of_learning.joinaudit.StateSource`; also a resuming miner's,
        `node.mine.resume`)."""
        me = str(self.fetcher.host.peer_id) if self.fetcher.host is not None else None
        others = [p for p in peers if p != me]

        async def source(step: int, part: int, n: int) -> dict | None:
            if n == 0:
                return self.archive.state(state_key(job_id, step, part)) or {}
            if n > len(others):
                return None
            return await self.fetcher.state([others[n - 1]], job_id, step, part) or {}
        return source

