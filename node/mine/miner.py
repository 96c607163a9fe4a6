"""Mining: running the units of a training job that the chain assigns to this node.

Owns `Miner`, the component a mining `pnode start` runs (specs/consensus.md
section 5). The chain decides everything: which job (a `Job` whose
``hyper_hash`` is this node's job config), which step is open, which node
runs each unit of it (the longest-wait rule, `ledger.rules`). The miner:

1. holds the job's model and the optimizer state of every section its
   registered span covers, plus the client part (embedding, final norm,
   head), which every miner holds;
2. for each unit of the open step assigned to it, phase by phase
   (`proof_of_learning.step_plan`: a unit of whole layers is one phase, a piece of a split
   layer runs half by half): waits for the phase's inputs, runs it
   (`compute.blocks`), pushes its outputs to every node that could need
   them (`node.wire.train`: to every holder of the consuming sections,
   so a unit reassigned after a timeout finds its inputs at its new node
   too); after a unit's last phase, signs a `Receipt` (input, output and
   weight-gradient hashes) and submits it;
3. once the chain has moved past a step, applies that step's update: every
   holder of a section receives the section's weight gradients and steps
   the same AdamW, so replicas stay equal (bit for bit on one build, at the
   job's pinned thread count; up to rounding across hardware); every
   ``average_every`` updates the replicas of each section also average
   their weights (`node.mine.averaging`, eq. 7-8), which removes such drift
   and leaves equal replicas as they are.

Which unit reads and sends what (a forward's states to the holders of s+1,
a backward's gradients to those of s-1 and of s) is the plan's
(`proof_of_learning.step_plan`, specs/consensus.md 5).

Three collaborators, made once the miner is set up for the job: a `Transfer`
(`node.mine.transfer`) keeps, pushes and receives the step's tensors, a
`StateSync` (`node.mine.state_sync`) fetches the held parts' state from
another holder when this node is behind, and serves it to others, and a
`Resumer` (`node.mine.resume`) replays the job from kept states when no
holder is ahead (a node that mines alone and restarted).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch
import trio

from compute.data import JobConfig, batch, job_corpus, make_model
from compute.train import make_sections
from compute.errors import ComputeError
from compute.wiretensor import WireTensorError
from ledger.crypto import SigningKey
from ledger.errors import ValidationError
from ledger.state import JOB
from ledger.types import ZERO_SIG, Receipt, sign, unit_id
from node import torch_thread
from node.chain import ChainService, TxGossip, given_up, job_named
from node.errors import BadPush, MinerError
from node.mine.averaging import Averager, average_round
from node.mine.export import FINAL_UPDATE_WAIT_S, export_weights
from node.mine.jobs import MinerView, check_job, miner_view, step_workers, unauditable
from node.mine.parts import KeptStates, ServeState, StateAccepts, Tamper, UnitArchive
from node.mine.resume import Resumer
from node.mine.state_sync import StateSync
from node.mine.transfer import Transfer
from node.wire import CLIENT, STATE_PROTOCOL, TRAIN_PROTOCOL
from proof_of_learning.phases import Phase, PhaseResult
from proof_of_learning.step_plan import StepPlan
from proof_of_learning.units import commitments, hyper_hash

log = logging.getLogger(__name__)

__all__ = ["BadPush", "Miner", "MinerError"]


class Miner:
    """Runs this node's units of the job ``config`` as the chain assigns them.

    Args:
        service, txs: the node's chain service and transaction gossip.
        node_key: signs receipts (the key the chain assigns units to).
        config: the job this node trains (found on chain by its hashes).
        log_file: where each computed loss is appended as a JSON line.
        average_every: updates between averaging rounds of the replicas.
        wait_s: most seconds to wait for a unit's inputs before looking again.
        report: gets the lines `pnode start` prints.
        device: where the model, its optimizers and the step's tensors live
            ("cpu", or "cuda:N" for `pnode start --gpu N`); what goes on the
            wire and into hashes is moved to the CPU first.
        archive: each unit's certificate and tensors, kept for its verifier,
            and this node's own weight versions, kept to judge others'
            (`node.mine.parts.UnitArchive`; None: keep nothing).
        tamper: test-only (`node.mine.parts.Tamper`): a cheating worker's
            phase runner, update rule, certificates and pushes.
        state_check: whether to take a holder's state when catching up
            (`node.mine.parts.StateAccepts`; None: the first that fits).
        job_id: the on-chain job to mine (None: the first whose spec is
            ``config``).
        serve_state: ``serve_state(job_id, handler)`` registers the job's
            state server with a router of the node's (None: this miner
            takes `STATE_PROTOCOL` itself).
        kept_states: where kept states come from, to resume by replay when
            no holder is ahead (`node.mine.parts.KeptStates`; None: never).
    """

    def __init__(self, service: ChainService, txs: TxGossip, node_key: SigningKey,
                 config: JobConfig, *, log_file: Path | None = None, average_every: int = 10,
                 wait_s: float = 20.0, report: Callable[[str], None] = lambda line: None,
                 device: str = "cpu", archive: UnitArchive | None = None,
                 tamper: Tamper | None = None, state_check: StateAccepts | None = None,
                 job_id: bytes | None = None, serve_state: ServeState | None = None,
                 kept_states: KeptStates | None = None):
        self.service, self.txs, self.key, self.config = service, txs, node_key, config
        self.wanted, self.serve_state = job_id, serve_state
        self.resumer = None if kept_states is None else Resumer(service, config, kept_states)
        self._unresumable: tuple[int, str] | None = None  # (open step, why) of the last try
        self.hyper = hyper_hash(config)
        self.host = service.host
        self.log_file, self.average_every, self.wait_s = log_file, average_every, wait_s
        self.report, self.device = report, torch.device(device)
        self.archive, self.tamper, self.state_check = archive, tamper, state_check
        self.me = str(self.host.peer_id)
        self.job_id: bytes | None = None
        self.version = 0  # updates applied: the step whose units this node may run
        self.units_done = 0
        self.losses: list[tuple[int, int, float]] = []  # (step, replica, loss)
        # Made in `_setup`: the step's tensors in and out; catching up with holders.
        self.transfer: Transfer | None = None
        self.state_sync: StateSync | None = None
        # Receipts of the units run by (step, unit index): one handed back, the same again.
        self._receipts: dict[tuple[int, int], Receipt] = {}
        # Phases run of units not yet signed, by (step, unit index): their results.
        self._phases: dict[tuple[int, int], dict[str, PhaseResult]] = {}
        self.view: MinerView | None = None  # the last look at the chain
        # Set once this node could take a unit (set up for the job, or sure it has none).
        self.ready = trio.Event()
        self._said: str | None = None
        self._averagers: dict[int, Averager] = {}
        self._background: trio.Nursery | None = None
        # Given to the `Transfer` at setup (see its Args).
        self.push_wait_s, self.push_retry_s = 5.0, 60.0
        self._poisoned: int | None = None  # the attack battery's: the step last poisoned
        self.done = False  # the job is over and this miner stopped

    def status(self) -> dict:
        """Mining fields of `pnode status`."""
        last = self.losses[-1] if self.losses else None
        return {"job": self.job_id.hex() if self.job_id else None, "step": self.version,
                "units_done": self.units_done,
                "loss": None if last is None else round(last[2], 4),
                "loss_step": None if last is None else last[0],
                "pushes_refused": self.transfer.refused if self.transfer else 0}

    async def run(self, *, task_status: trio.TaskStatus[Miner] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Mine until the job is finished (module docstring); return then."""
        async with trio.open_nursery() as self._background:  # pushes still being retried
            task_status.started(self)
            await self._mine()
            self._background.cancel_scope.cancel()

    async def _mine(self) -> None:
        while True:
            view = self.view = await self.service.call(self._look)
            if self.archive is not None and view.job_id is not None:
                done, audited = await self.service.call(unauditable, self.service.chain.state,
                                                        self.archive.receipts(), view.step)
                self.archive.mark_audited(audited)
                self.archive.forget(done, view.step)
            if self.job_id is not None and view.job_id != self.job_id:  # a reorg took it
                return self.report(f"mining: job {self.job_id.hex()[:16]}.. left the chain")
            if self.job_id is not None and view.step >= view.steps:  # finished, or given up
                dropped = await self.service.call(given_up, self.service.chain, view.job_id)
                with trio.move_on_after(0 if dropped else FINAL_UPDATE_WAIT_S):  # the last
                    while self.version < view.steps and not (  # updates, if they come
                            self.version == view.steps - 1
                            and await self._apply_update(self.version)):
                        if not await self._catch_up(view):
                            await trio.sleep(1.0)
                self.done = True
                return self.report(self._ended(view, dropped))
            if not await self._ready(view):
                await self.service.wait_tip_change(view.tip)
                continue
            if self.tamper is not None and view.step != self._poisoned:
                self._poisoned = view.step
                pushes = await torch_thread.run_sync(self.tamper.poison, self.plan, view.step,
                                                     view.mine)
                await self.transfer.push_all(pushes, job_id=view.job_id, holders=view.holders,
                                             miners=[p for p in view.miners if p != self.me])
            todo = [phase for i in view.mine if (view.step, i) not in self._receipts
                    for phase in self.plan.phases(i)
                    if phase.kind not in self._phases.get((view.step, i), {})]
            if todo:
                await self._run_phase(view, min(todo, key=lambda p: p.order))
                continue
            for index in view.mine:  # run already, not on chain yet: (again) in the mempool
                await self._submit(self._receipts[(view.step, index)])
            await self.service.wait_tip_change(view.tip)

    async def _ready(self, view: MinerView) -> bool:
        """Set up for the job and catch up with the open step; False: nothing to do now."""
        if view.job_id is None:
            self._say("mining: no job on the chain matches this node's job config")
            self.ready.set()
            return False
        if view.span is None:
            self._say("mining: this node is not registered, so no units are assigned to it")
            self.ready.set()
            return False
        if self.job_id is None:
            try:
                await self._setup(view)
            finally:
                self.ready.set()
        if view.step >= view.steps and self.version >= view.steps:
            self._say(f"mining: job {view.job_id.hex()[:16]}.. finished ({view.steps} steps)")
            return False
        while self.version < view.step:
            # One update behind: it is (being) pushed here. Further behind (this node
            # joined late or was down): a holder's state, else a replay of kept states.
            if self.version == view.step - 1 and await self._apply_update(self.version):
                continue
            if not await self._catch_up(view):  # say what it waits for, and from whom
                self._say(f"mining: out of step at update {self.version} of {view.step}: "
                          f"{self.transfer.lacking(self.version, view.step)}"
                          + (f" (no resume from kept states: {self._unresumable[1]})"
                             if self._unresumable else ""))
                return False
        return True

    def _ended(self, view: MinerView, dropped: bool) -> str:
        """What the miner says of a job the chain no longer trains: finished only if it
        applied every update."""
        job = f"mining: job {view.job_id.hex()[:16]}.."
        if self.version >= view.steps:
            return f"{job} finished at step {view.steps} of {view.steps}"
        why = "the chain gave it up (a step did not close in time)" if dropped else \
            "the chain finished it, but its last updates did not come here"
        return (f"{job} ended unfinished here: {why}; this node's weights are at step "
                f"{self.version} of {view.steps}, and `pnode job export` refuses them")

    def _say(self, line: str) -> None:
        if line != self._said:
            self._said = line
            self.report(line)

    def _look(self) -> MinerView:  # the chain's view (chain thread)
        chain = self.service.chain
        return miner_view(chain, job_named(chain.state, self.hyper, self.wanted), self.key.public)

    async def _keep_version(self) -> None:
        """Record this node's own weights at ``version`` (what it judges others' against)."""
        if self.archive is not None:
            weights = await torch_thread.run_sync(self._own_weights)
            self.archive.keep_version(self.version, weights)

    def _own_weights(self) -> dict[str, torch.Tensor]:
        """The whole parameters this node keeps up to date: its whole-layer sections', the
        client part's (a piece's parameter is only partly its own, so it is left out)."""
        params = dict(self.model.named_parameters())
        names = [n for s in self.held if self.plan.pieces[s] is None
                 for i in range(self.sections.forward[s].layer_start,
                                self.sections.forward[s].layer_end)
                 for n in params if n.startswith(f"layers.{i}.")]
        head = "tok_emb.weight" if self.model.config.tie_embeddings else "lm_head.weight"
        names += ["tok_emb.weight", "norm.weight", head]
        return {n: params[n] for n in dict.fromkeys(names)}

    async def _setup(self, view: MinerView) -> None:
        """Build the job's model and check it against the chain's commitments.

        Raises:
            MinerError: the job's hashes or units are not this config's.
        """
        job = await self.service.call(lambda: self.service.chain.state.get(JOB + view.job_id).job)
        built = await torch_thread.run_sync(self._build)
        check_job(job, built["commitments"], self.sections, self.config.replicas,
                  self.config.classes, self.plan.compute_class())
        self.job_id, self.units = view.job_id, job.units
        lo, hi = view.span
        self.held = [s for s, spec in enumerate(self.sections.forward)
                     if lo <= spec.layer_start and spec.layer_end <= hi]
        for s in [*self.held, CLIENT]:
            averager = Averager(self.host, f"{self.job_id.hex()[:32]}/{s}",
                                lambda s=s: self._weights(s),
                                lambda w, s=s: self._install(s, w), timeout=10.0)
            averager.start()
            self._averagers[s] = averager
        self.transfer = Transfer(
            self.host, self._background, job_id=self.job_id, replicas=self.config.replicas,
            expected=self.plan.expected, registered=self._registered, producer=self._producer,
            version=lambda: self.version, wait_tip_change=self.service.wait_tip_change,
            device=self.device, wait_s=self.wait_s, push_wait_s=self.push_wait_s,
            push_retry_s=self.push_retry_s)
        self.state_sync = StateSync(self.host, job_id=self.job_id, held=self.held,
                                    optimizer=self._optimizer, registered=self._registered,
                                    version=lambda: self.version, wait_s=self.wait_s,
                                    accepts=self.state_check)
        # Only now: a push that comes earlier fails, and its sender tries again.
        self.host.set_handler(TRAIN_PROTOCOL, self.transfer.receive)
        if self.serve_state is not None:  # one handler routes every job's (node.mine.runner)
            self.serve_state(self.job_id, self.state_sync.serve)
        else:
            self.host.set_request_handler(STATE_PROTOCOL, self.state_sync.serve,
                                          max_request_size=1024)
        await self._keep_version()
        held = ", ".join(f"{self.sections.forward[s].layer_start}:"
                         f"{self.sections.forward[s].layer_end}" for s in self.held)
        self._say(f"mining job {self.job_id.hex()[:16]}..: holding sections [{held}] and the "
                  "client part")

    def _build(self) -> dict:
        """Build the job's model, corpus and plan; MinerError: it can never run here (its
        model does not build, its data gives no batch: anyone may post it, it stops no one)."""
        try:
            self.model = make_model(self.config).to(self.device)
            self.sections = make_sections(self.model, self.config)
            self.corpus = job_corpus(self.config)
            batch(self.config, 0, 0, self.config.replicas, corpus=self.corpus)  # it can run
        except (ComputeError, MemoryError, RuntimeError) as exc:
            raise MinerError(f"the job cannot run: {exc}") from None
        self.k, c = len(self.sections.forward), self.config
        self.plan = StepPlan(self.model, self.sections, (c.batch_size, c.seq_len, c.model.dim),
                             c.replicas, c.threads)
        return {"commitments": commitments(self.config)}

    def _producer(self, key) -> str | None:
        """The peer the chain assigned the unit that pushes ``key`` (open step only)."""
        view = self.view
        if view is None or key[0] != view.step:
            return None
        return view.assignees.get(self.plan.producer(key))

    def _registered(self) -> tuple[str, ...] | None:
        """Every registered node's peer id as the last look saw them (None before it)."""
        return None if self.view is None else self.view.miners

    # -- units --------------------------------------------------------------------------

    async def _run_phase(self, view: MinerView, phase: Phase) -> None:
        """Run one phase of a unit once its inputs are here and push its outputs.

        After the unit's last phase, sign its receipt and submit it.
        """
        t, index = view.step, phase.index
        needs = self.plan.needs(t, phase)
        got = await self.transfer.wait(needs, view.tip)
        if got is None:
            return  # not here yet and the chain moved on: look again (it may have reassigned)
        shard = batch(self.config, t, phase.replica, self.config.replicas, corpus=self.corpus)
        ids, targets = (x.to(self.device) for x in shard)
        run = self.plan.run if self.tamper is None else self.tamper.run_phase(self.plan)
        result = await torch_thread.run_sync(run, phase, t, dict(zip(needs, got)), ids, targets)
        try:
            await self.transfer.push_all(result.pushes, job_id=view.job_id,
                                         miners=view.miners, holders=view.holders)
        except WireTensorError as exc:  # non-finite outputs (the run diverged): not work
            self._say(f"mining: step {t} unit {index} gave non-finite values ({exc}); "
                      "not pushed, no receipt")
            await self.service.wait_tip_change(view.tip)
            return
        if result.loss is not None:
            self._record_loss(t, phase.replica, result.loss)
            shard = f" (replica {phase.replica})" if self.config.replicas > 1 else ""
            self.report(f"step {t}: loss {result.loss:.4f}{shard}")
        done = self._phases.setdefault((t, index), {})
        done[phase.kind] = result
        if not phase.last:
            return
        unit = unit_id(view.job_id, t, self.units[index])
        results = list(done.values())
        cert = self.plan.certificate(view.job_id, t, unit, index, results)
        if self.tamper is not None:
            cert = self.tamper.certify(cert)
        hashes = self.plan.receipt_hashes(view.job_id, t, unit, index, results, cert)
        receipt = sign(Receipt(self.service.chain.chain_id, self.key.public, view.job_id, unit,
                               *hashes, ZERO_SIG), self.key)
        if self.archive is not None:
            self.archive.keep_unit(t, cert, results, receipt)
        self._receipts[(t, index)] = receipt
        del self._phases[(t, index)]
        if await self._submit(receipt):
            self.units_done += 1

    async def _submit(self, receipt: Receipt) -> bool:
        """Admit and gossip a receipt; False when the chain refuses it now."""
        try:
            await self.txs.submit(receipt)
            return True
        except ValidationError as exc:  # e.g. reassigned meanwhile: kept for a hand-back
            log.info("receipt of unit %s.. refused: %s", receipt.unit_id.hex()[:16], exc)
            return False

    def _record_loss(self, step: int, replica: int, loss: float) -> None:
        self.losses.append((step, replica, loss))
        if self.log_file is not None:
            with open(self.log_file, "a") as f:
                f.write(json.dumps({"step": step, "replica": replica, "loss": loss,
                                    "time": time.time()}) + "\n")

    # -- updates and averaging ----------------------------------------------------------

    async def _apply_update(self, t: int) -> bool:
        """Apply step ``t``'s update to the held sections and the client part."""
        needs = [self.plan.update_needs(t, r, self.held) for r in range(self.config.replicas)]
        keys = [key for keys in needs for key in keys]
        workers = await self.service.call(step_workers, self.service.chain, self.job_id, t)
        producers = {key: workers[unit] for key in keys
                     if (unit := self.plan.producer(key)) in workers}
        if any(peer == self.me for _, peer in self.transfer.missing(keys, producers)):
            return False  # its own push, of a unit run before a restart: it never comes
        got = await self.transfer.wait(keys, producers=producers)
        if got is None:
            return False
        messages, at = [], 0
        for keys in needs:  # each replica's, in `update_needs` order
            messages.append(got[at:at + len(keys)])
            at += len(keys)
        await torch_thread.run_sync(self._step_optimizers, messages, t + 1)
        self.transfer.drop_through(t)
        for key in [key for key in self._receipts if key[0] <= t]:
            del self._receipts[key]
        for key in [key for key in self._phases if key[0] <= t]:
            del self._phases[key]
        self.version = t + 1
        if self.version % self.average_every == 0:
            await self._average()
        await self._keep_version()
        await self._keep_states()
        return True

    async def _keep_states(self) -> None:
        """At a checkpoint step, keep every held part's full state: what a joining node
        replays from, and this node resumes from after a restart (`node.mine.resume`)."""
        if self.archive is not None and self.version % self.config.state_every == 0:
            states = await torch_thread.run_sync(lambda: {
                s: {k: v.to("cpu") for k, v in self._optimizer(s).state_dict().items()}
                for s in [*self.held, CLIENT]})
            for s, state in states.items():
                self.archive.keep_state(self.job_id, self.version, s, state)

    def _step_optimizers(self, messages: list, version: int) -> None:
        grads = self.plan.update_grads(messages)
        for s in self.held:
            if self.tamper is None or self.tamper.steps_section(s):
                self.sections.optimizers[s].step(grads)
        self.sections.client.step(grads)
        # What the weights are now (the compute thread's view), for the states it serves.
        self.state_sync.weights_version = version

    async def export_weights(self) -> tuple[int, dict[str, torch.Tensor]]:
        """(updates applied, the whole model's weights then), on the CPU
        (`node.mine.export.export_weights`, whose Raises it has)."""
        return await export_weights(self)

    def _optimizer(self, s: int):
        return self.sections.client if s == CLIENT else self.sections.optimizers[s]

    def _weights(self, s: int) -> dict[str, torch.Tensor]:
        opt = self._optimizer(s)
        # On the CPU for the averager, which mixes them with what comes off the wire.
        return {key: w.to("cpu") for key, w in opt.weights().items()}

    def _install(self, s: int, weights: dict[str, torch.Tensor]) -> None:
        self._optimizer(s).load_weights(weights)

    async def _average(self) -> None:
        """One averaging round per held section (and the client part) with the other holders."""
        view = self.view
        groups = {s: view.miners if s == CLIENT else view.holders[s] for s in self._averagers}
        await average_round(self._averagers, groups, self.me, self.version)

    # -- catching up: the state of a holder ---------------------------------------------

    async def _catch_up(self, view: MinerView) -> bool:
        """Take every held part's weights and AdamW state at the open step: from holders,
        else by a replay from kept states (`node.mine.resume`; once per open step)."""
        if await self.state_sync.fetch(job_id=view.job_id, step=view.step,
                                       miners=view.miners, holders=view.holders):
            how = "with the holders' weights"
        else:
            if self.resumer is None or (self._unresumable or (None,))[0] == view.step:
                return False
            got = await self.resumer.resume(view.job_id, self.units, view.step, view.miners)
            if isinstance(got, str):
                self._unresumable = (view.step, got)
                return False
            await torch_thread.run_sync(self.state_sync.restore_all, {
                s: got.states[s] for s in [*self.held, CLIENT]}, view.step)
            how = (f"from the state kept at step {got.start}, replayed {view.step - got.start} "
                   "steps, each unit equal to its receipt")
        self.version = view.step
        await self._keep_version()
        await self._keep_states()
        self._say(f"mining: caught up at step {view.step} {how}")
        return True
