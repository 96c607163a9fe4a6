"""Spot checks: a share of a generation's steps run again by other servers and compared.

Owns `SpotChecker` (specs/network.md section 9.5). A server can serve real
layers and still answer wrong hidden states (a bug, a cheaper model, on
purpose); nothing else in the protocol would notice. So, for the steps the
client draws (the first step always, then each with probability
``ClientConfig.spot_check_rate``, from an RNG the caller passes in):

1. **Route check.** The first hop's inputs since position 0 are kept in
   every mode (`wallet.client.session.RouteRun`), so the client can rerun the
   whole history on a *checker chain*: for each hop, other servers that
   cover its span (the hop's own server where there is none), fed the
   history in one forward call (a prefill: one pass, not one per token),
   each one's outputs the next one's inputs. Every row of the chain's
   output is compared with the route's outputs since position 0
   (`RouteRun.outputs`, `agree`): one check covers every earlier step.
   This needs no intermediate outputs, so it works when the hops push to
   each other (9.3a).
2. **Localisation** (`wallet.client.localise`). On a mismatch each hop is
   judged on the steps it ran, as the client logged them with the hop's
   signed answers (`wallet.client.steplog.StepLog`; linked hops send a
   signed `StepCopy` after each push): a checker server runs them one by
   one, a third settles a disagreement (majority of three). The route's
   hops are asked nothing, so a liar cannot answer a check differently
   from its ordinary steps.
3. **Settling.** A losing hop is banned for the client's lifetime
   (`SwarmDirectory.ban`) and failed over, the hops after it replay the
   corrected outputs, so the generation goes on from correct states. The
   accused's input steps and the signed answers at the lying step are
   kept as `node.wire.SpotEvidence` (self-contained: every claim signs the
   session's running input hash), written to ``ClientConfig.evidence_dir``.
   When a log is incomplete, the older replay settle runs (`_settle`).

The comparison (`agree`, `TOLERANCE`) and the record (`Mismatch`,
`load_evidence`) are `wallet.client.spotrules`'; localisation from the
logs is `wallet.client.localise.LogLocaliser`'s.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import torch

from compute.wiretensor import encode_tensor
from ledger.codec import encode
from node.clock import now_ms
from node.wire import SignedAnswer, SpotEvidence, Step, history_of, step_claim
from wallet.errors import HopFailed, NoRoute, RemoteError, ServerBusy
from wallet.client.generation import SpotReport
from wallet.client.localise import LogLocaliser
from wallet.client.route import Hop
from wallet.client.session import HopSession, RouteRun
from wallet.client.spotrules import agree


class SpotChecker(LogLocaliser):
    """Draws, runs and settles the spot checks of one generation's `RouteRun`.

    Args:
        run: the generation's route (its sessions, kept inputs, directory).
        rng: the draw (pass a seeded `random.Random` for repeatable checks).
        report: where counts and mismatches go (the generation's).
    """

    #: The checks as they were before the logs (bench/spot_check.py's baseline): compare
    #: only the checked step's rows, and localise by replaying the route.
    legacy = False

    def __init__(self, run: RouteRun, rng: random.Random, report: SpotReport):
        self.run, self.rng, self.report = run, rng, report
        self.rate, self.codec = run.config.spot_check_rate, run.config.codec
        evidence_dir = run.config.evidence_dir
        self.evidence_dir = Path(evidence_dir) if evidence_dir else None
        self.evidence: list[SpotEvidence] = []

    def wants(self, step: int) -> bool:
        """Whether generation step ``step`` (0: the prompt) is checked."""
        if self.rate <= 0:
            return False
        draw = self.rng.random()  # drawn at every step: a seed fixes which steps are checked
        return step == 0 or draw < self.rate

    async def check(self, pos: int, y: torch.Tensor) -> torch.Tensor:
        """Check the route's answer ``y`` (1, T, C) to the step at ``pos``; the answer to use.

        The checker chain's outputs are compared with every row the route
        answered since position 0 (``legacy``: the step's rows only). Returns
        ``y`` when they agree (or no chain can run), else the outputs after
        settling (a lying hop replaced, the hops after it replayed).

        Raises:
            RemoteError: failures beyond ``max_failovers`` while settling.
        """
        run = self.run
        first = run.sessions[0].hop.start
        history = list(run.inputs.get(first, ())) if first in run.kept else []
        if sum(c.shape[1] for c in history) != pos + y.shape[1]:
            self.report.skipped += 1  # cannot happen: the first hop's inputs are kept
            return y
        hops = self._checker_chain()
        if hops is None:
            self.report.skipped += 1
            return y
        try:
            out = await self._chain(hops, torch.cat(history, dim=1))
        except (HopFailed, NoRoute, ServerBusy) as exc:  # a checker failed or is full:
            # not this route's fault, and the check is not worth a wait
            if isinstance(exc, HopFailed) and isinstance(exc.session, HopSession):
                run.directory.exclude(exc.session.hop.peer_id)
            self.report.skipped += 1
            return y
        self.report.run += 1
        routed = run.routed()
        if self.legacy or routed is None or routed.shape != out.shape:
            if agree(y, out[:, pos:], self.codec):
                return y
        elif agree(routed, out, self.codec):
            return y
        if self.legacy:
            return await self._settle(pos)
        return await self._localise(pos, y)

    # -- the route check ----------------------------------------------------------------

    def _checker_chain(self) -> list[Hop] | None:
        """Other servers over each hop's span (the hop's own where none); None if no other."""
        run, hops, other = self.run, [], False
        for session in run.sessions:
            hop = session.hop
            try:
                alt = run.directory.plan(hop.start, hop.end, also_exclude={hop.peer_id},
                                         positions=run.max_len, chunk=run.widest)
                other = True
            except NoRoute:
                alt = [hop]
            for h in alt:  # one session per server run: merge a server's adjacent spans
                if hops and hops[-1].peer_id == h.peer_id and hops[-1].end == h.start:
                    hops[-1] = Hop(h.peer_id, hops[-1].start, h.end)
                else:
                    hops.append(h)
        return hops if other else None

    async def _chain(self, hops: list[Hop], x: torch.Tensor) -> torch.Tensor:
        """``x`` (positions 0..) through fresh sessions on ``hops``, each one prefill call."""
        run, opened = self.run, []
        try:
            for hop in hops:
                opened.append(await run._open(hop))
            for session in opened:
                pieces = list(torch.split(x, run.chunk, dim=1))
                x = torch.cat(await run._replay(session, pieces), dim=1)
            return x
        finally:
            await self._close(opened)

    async def _close(self, sessions: list[HopSession]) -> None:
        """Close checker sessions and keep them out of the generation's route."""
        for session in sessions:
            await session.close()
        self.run.result.route = [s for s in self.run.result.route
                                 if all(s is not c.served for c in sessions)]

    # -- the replay settle (a log is incomplete; ``legacy``) ---------------------------------

    async def _settle(self, pos: int) -> torch.Tensor:
        """Replay the route hop by hop, each hop against a checker; the step's outputs after.

        What 9.5 did before the logs: a liar that knows a replay (position 0,
        many chunks) answers it honestly and is not caught, so this runs only
        when some hop's log is incomplete (a copy that never came) and no hop
        lost on its log, or when ``legacy`` is set (bench/spot_check.py's baseline).
        """
        run = self.run
        await run._stop_pushing()  # the client drives the rest (as after a failover)
        history = list(run.inputs[run.sessions[0].hop.start])
        i = 0
        while i < len(run.sessions):
            session = run.sessions[i]
            run._keep(session, history)
            try:
                out = await run._replay(session, history)
                lost = await self._judge(session, history, out, pos)
            except HopFailed as exc:
                if exc.session is not session:
                    raise
                lost = exc
            if lost is None:
                history, i = out, i + 1
                continue
            after, tail = await run._fail_over(i, lost, pos)
            if after == len(run.sessions):
                return tail
            history, i = list(run.inputs[run.sessions[after].hop.start]), after
        run.outputs = [torch.cat(history, dim=1)]
        return run.outputs[0][:, pos:]

    async def _judge(self, session: HopSession, history: list[torch.Tensor],
                     out: list[torch.Tensor], pos: int) -> HopFailed | None:
        """Compare hop ``session``'s replay ``out`` with a checker's, and a third's if they differ.

        Returns:
            A `HopFailed` for the hop when it lost (it is banned), else None.
        """
        hop, mine = session.hop, torch.cat(out, dim=1)
        answers = [self._signed(session, history)]
        verdicts: list[tuple[str, torch.Tensor]] = []
        for peer in self._candidates(hop):
            try:
                theirs, answer = await self._answer(Hop(peer, hop.start, hop.end), history)
            except HopFailed:
                self.run.directory.exclude(peer)
                continue
            except ServerBusy:  # full: the next candidate
                continue
            verdicts.append((peer, theirs))
            answers.append(answer)
            if len(verdicts) == 1 and agree(mine, theirs, self.codec):
                return None  # this hop agrees with its checker
            if len(verdicts) == 2:
                break
        if not verdicts:
            return None  # no other server holds these layers: nothing to compare with
        others = (verdicts[0][0], verdicts[1][0] if len(verdicts) > 1 else "")
        return self._majority(session, others, [mine, *(v[1] for v in verdicts)], answers,
                              (self._step(history),), pos)

    def _candidates(self, hop: Hop) -> list[str]:
        """Servers holding all of ``hop``'s layers, not the hop's, usable, fastest first."""
        d = self.run.directory
        avoid = d.dead | d.banned | {hop.peer_id}
        fits = [s for s in d.servers() if s.start <= hop.start and hop.end <= s.end
                and s.peer_id not in avoid and not s.busy]
        return [s.peer_id for s in sorted(fits, key=lambda s: (-d.throughput(s.peer_id),
                                                                 s.peer_id))]

    async def _answer(self, hop: Hop, history: list[torch.Tensor]
                      ) -> tuple[torch.Tensor, SignedAnswer]:
        """``history`` replayed on a fresh session on ``hop``: (outputs, its signed answer)."""
        session = await self.run._open(hop)
        try:
            out = torch.cat(await self.run._replay(session, history), dim=1)
            return out, self._signed(session, history)
        finally:
            await self._close([session])

    def _signed(self, session: HopSession, history: list[torch.Tensor]) -> SignedAnswer:
        """The server's last answer to ``session`` (a replay of ``history``), with its claim."""
        reply = session.last_reply
        hop = session.hop
        step = self._step(history)
        claim = step_claim(session.token, self.run.directory.model_id, hop.start, hop.end,
                           step, reply.hidden, history_of([step]))
        return SignedAnswer(self._public_key(hop.peer_id), claim, reply.hidden, reply.signature)

    def _step(self, history: list[torch.Tensor]) -> Step:
        """The `Step` a replay of ``history`` sent (as `RouteRun._replay` builds it)."""
        payload = encode_tensor(torch.cat(history, dim=1), self.codec)
        return Step(0, tuple(c.shape[1] for c in history), payload)

    def _public_key(self, peer_id: str) -> bytes:
        announce = self.run.directory.announcement(peer_id)
        if announce is None:
            raise RemoteError(f"no announcement of {peer_id}: its answer cannot be attributed")
        return announce.public_key

    def _keep_evidence(self, steps: tuple[Step, ...], answers: list[SignedAnswer],
                       loser: int, hop: Hop, pos: int) -> tuple[str, bool]:
        """Record the evidence (in memory, and as a file when a directory is set)."""
        steps = tuple(replace(s, voucher=b"") for s in steps)
        evidence = SpotEvidence(steps, tuple(answers), loser, now_ms())
        self.evidence.append(evidence)
        path = ""
        if self.evidence_dir is not None:
            self.evidence_dir.mkdir(parents=True, exist_ok=True)
            target = self.evidence_dir / f"{evidence.time_ms}-{hop.peer_id[-12:]}-{pos}.spot"
            target.write_bytes(encode(evidence))
            path = str(target)
        return path, evidence.verified()
