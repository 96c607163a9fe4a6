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
   each one's outputs the next one's inputs. The step's rows of the
   chain's output are compared with the route's answer (`agree`). This
   needs no intermediate outputs, so it works when the hops push to each
   other (9.3a) and the client sees only the last one's.
2. **Localisation.** On a mismatch the route stops pushing and the client
   replays the history hop by hop (`Step(0, chunks, history)`, as a
   failover does): each hop's outputs are the next one's inputs, and each
   hop's replay is also sent, identically, to a checker server holding the
   same span. Same input, same chunks: honest servers agree bit for bit on
   the same build, within `TOLERANCE` otherwise.
3. **Settling.** A hop and its checker that disagree go to a third server
   with the same input; the answer the other two reject loses (majority of
   three). A losing hop is banned for the client's lifetime
   (`SwarmDirectory.ban`) and failed over (its kept inputs replayed on a
   replacement); a losing checker is banned. The hops after it replay the
   corrected outputs, so the generation goes on from correct states. The
   three signed answers (`node.wire.SignedAnswer`: every `StepResult` is
   signed by its server) and the input they claim are kept as
   `node.wire.SpotEvidence`, written to ``ClientConfig.evidence_dir``.

Tolerance. Rows are compared one position at a time: max |a - b| over the
row at most ``TOLERANCE[codec]`` times the row's largest |value|. Measured
on SmolLM2 (CPU, 1 and 2 threads: bit-identical across thread counts), a
one-call prefill of up to 137 positions against token-by-token decoding
differs by at most 1.9e-5 (raw), 9.4e-4 (fp16), 6.7e-3 (bf16), 9.1e-3
(int8) in that measure at layers 10, 20, 30; the bounds are 1e-3, 1e-2,
5e-2, 1e-1 (7-50x margin).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import trio

from compute.wiretensor import decode_tensor, encode_tensor
from ledger.codec import decode, encode
from node.clock import now_ms
from node.net import FramingError, write_frame
from node.wire import (
    SignedAnswer, SpotEvidence, Step, StepResult, history_of, step_claim, step_positions,
)
from wallet.errors import HopFailed, NoRoute, RemoteError, ServerBusy
from wallet.client.generation import SpotReport
from wallet.client.hop import step_timeout
from wallet.client.route import Hop
from wallet.client.session import HopSession, RouteRun

#: Per wire codec: the most a row may differ, relative to the row's largest |value|.
TOLERANCE = {"raw": 1e-3, "fp16": 1e-2, "bf16": 5e-2, "int8": 1e-1}
#: Below this, a difference is nothing (rows of zeros).
_ATOL = 1e-6


def agree(a: torch.Tensor, b: torch.Tensor, codec: str = "raw") -> bool:
    """Whether two answers for the same positions agree (module docstring: Tolerance).

    Args:
        a, b: hidden states (1, T, C) for the same positions.
        codec: the wire codec both came through.

    Returns:
        True when shapes match and every row is within the codec's tolerance
        (a NaN anywhere disagrees).
    """
    if a.shape != b.shape:
        return False
    a, b = a.float(), b.float()
    diff = (a - b).abs().amax(dim=-1)
    scale = torch.maximum(a.abs().amax(dim=-1), b.abs().amax(dim=-1))
    return bool((diff <= TOLERANCE[codec] * scale + _ATOL).all())


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One settled (or unsettled) disagreement, as the generation reports it.

    pos: the step's position; start, end: the hop's layers; peer_id: the
    hop's server; checker, third: the other servers asked ("" if none);
    loser: the peer the majority rejected ("" if unsettled); evidence: the
    file the evidence went to ("" if none); verified: whether every answer
    of the evidence verifies (signature and claimed input).
    """

    pos: int
    start: int
    end: int
    peer_id: str
    checker: str
    third: str
    loser: str
    evidence: str
    verified: bool

    def as_json(self) -> dict:
        return {"pos": self.pos, "layers": [self.start, self.end], "peer_id": self.peer_id,
                "checker": self.checker, "third": self.third, "loser": self.loser or None,
                "evidence": self.evidence or None, "verified": self.verified}


def load_evidence(path: str | Path) -> SpotEvidence:
    """The evidence record in ``path`` (written by a `SpotChecker`).

    Raises:
        DecodeError: the file is not an encoded `SpotEvidence`.
        OSError: it cannot be read.
    """
    return decode(Path(path).read_bytes(), SpotEvidence)


class SpotChecker:
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

    # -- localisation from the logs ----------------------------------------------------------

    async def _localise(self, pos: int, y: torch.Tensor) -> torch.Tensor:
        """Judge every hop on the steps it ran (its `StepLog`), asking only other servers.

        Returns ``y`` when no hop loses (a checker of the route check was
        wrong), else the outputs after the losers are replaced and the hops
        after them replayed. Falls back to `_settle` when some hop's log is
        incomplete or inconsistent (a copy that never came, a pushed step
        whose answer signs another input) and no hop lost on its log.
        """
        run = self.run
        await self._await_logs()
        lost: dict[HopSession, HopFailed] = {}
        unsure = False
        for session in list(run.sessions):
            steps = session.log.history()
            try:
                verdict = None if steps is None else await self._judge_log(session, steps)
            except _Unsure:
                verdict = None
                steps = None
            if steps is None:
                unsure = True
            elif verdict is not None:
                lost[session] = verdict
        if not lost:
            return await self._settle(pos) if unsure else y
        return await self._recover(lost, pos)

    async def _await_logs(self) -> None:
        """Wait (a step timeout at most) for the copies the linked hops send after pushing."""
        with trio.move_on_after(self.run.config.step_timeout):
            while any(s.log.history() is None for s in self.run.sessions):
                await trio.sleep(0.02)

    async def _judge_log(self, session: HopSession, steps: list[Step]) -> HopFailed | None:
        """Run ``session``'s steps on a checker (a third if they differ); a `HopFailed` if it lost.

        Raises:
            _Unsure: an answer to a pushed step does not sign the input the
                client derived (the hop before may have pushed something else
                than it copied): nobody can be blamed from the log.
        """
        hop = session.hop
        mine = [self._answer_of(session, steps, k) for k in range(len(steps))]
        for k, answer in enumerate(mine):
            if not answer.verified():
                if session.log.was_pushed(steps[k].pos):
                    raise _Unsure()
                return self._lost(session, steps[k].pos, f"signed no claim of step {k} it ran")
        candidates = self._candidates(hop)
        checker, k, theirs = "", None, None
        for peer in candidates:
            try:
                k, theirs = await self._first_disagreement(Hop(peer, hop.start, hop.end),
                                                           steps, mine)
            except HopFailed:
                self.run.directory.exclude(peer)
                continue
            except ServerBusy:
                continue
            checker = peer
            break
        if not checker or k is None:
            return None  # it agrees with its checker, or nobody else holds its layers
        answers, third = [mine[k], theirs], ""
        for peer in candidates[candidates.index(checker) + 1:]:
            try:
                _, answer = await self._first_disagreement(Hop(peer, hop.start, hop.end),
                                                           steps[: k + 1], None)
            except HopFailed:
                self.run.directory.exclude(peer)
                continue
            except ServerBusy:
                continue
            third = peer
            answers.append(answer)
            break
        outs = [decode_tensor(a.hidden) for a in answers]
        loser = ""
        if third:
            if agree(outs[2], outs[1], self.codec) and not agree(outs[2], outs[0], self.codec):
                loser = hop.peer_id
            elif agree(outs[2], outs[0], self.codec) and not agree(outs[2], outs[1], self.codec):
                loser = checker
        peers = [hop.peer_id, checker, third][: len(answers)]
        at = steps[k].pos
        path, verified = self._keep_evidence(tuple(steps[: k + 1]), answers,
                                             peers.index(loser) if loser else len(answers),
                                             hop, at)
        self.report.mismatches.append(Mismatch(
            at, hop.start, hop.end, hop.peer_id, checker, third, loser, path, verified).as_json())
        if loser:
            self.run.directory.ban(loser)
        if loser == hop.peer_id:
            return HopFailed(f"{hop.peer_id} lost a spot check at position {at} "
                             f"(layers {hop.start}..{hop.end - 1})", session)
        return None

    def _lost(self, session: HopSession, pos: int, why: str) -> HopFailed:
        """``session``'s hop lost without a vote (it broke the protocol): banned, reported."""
        hop = session.hop
        self.run.directory.ban(hop.peer_id)
        self.report.mismatches.append(Mismatch(pos, hop.start, hop.end, hop.peer_id, "", "",
                                               hop.peer_id, "", False).as_json())
        return HopFailed(f"{hop.peer_id} {why} (layers {hop.start}..{hop.end - 1})", session)

    async def _first_disagreement(self, hop: Hop, steps: list[Step],
                                  mine: list[SignedAnswer] | None
                                  ) -> tuple[int | None, SignedAnswer]:
        """``steps`` one by one on a fresh session on ``hop``, as the hop ran them.

        Returns (the index of the first step whose answer disagrees with
        ``mine``, or None; the checker's signed answer there, else at the
        last step). Each step goes as it went (same chunks, same bytes), so
        the checker's running input hash is the hop's and its claims sign
        the same history (what makes them evidence together).
        """
        session = await self.run._open(hop)
        try:
            for k, step in enumerate(steps):
                reply = await self._feed(session, step)
                answer = self._answer_of(session, steps, k, reply)
                if mine is not None and not agree(decode_tensor(mine[k].hidden),
                                                  decode_tensor(reply.hidden), self.codec):
                    return k, answer
            return None, answer
        finally:
            await self._close([session])

    async def _feed(self, session: HopSession, step: Step) -> StepResult:
        """Send ``step``'s very bytes to ``session`` (with its voucher); its answer."""
        run, t = self.run, step_positions(step)
        timeout = step_timeout(run.config, run.directory.throughput(session.hop.peer_id), t,
                               max(len(step.chunks), 1))
        session.sent[step.pos] = t
        session.log.sent(step)
        try:
            with trio.fail_after(timeout):
                await write_frame(session.stream, encode(replace(step,
                                                                 voucher=session.voucher())))
        except (trio.TooSlowError, FramingError) as exc:
            raise HopFailed(f"{session.hop.peer_id} failed: {exc!r}", session) from None
        x = decode_tensor(step.hidden)
        await run._await([session], [session], x, step.pos, timeout, len(step.hidden))
        return session.last_reply

    def _answer_of(self, session: HopSession, steps: list[Step], k: int,
                   reply: StepResult | None = None) -> SignedAnswer:
        """``session``'s signed answer to ``steps[k]`` (from its log unless ``reply``)."""
        hop = session.hop
        given = reply if reply is not None else session.log.answers[steps[k].pos]
        claim = step_claim(session.token, self.run.directory.model_id, hop.start, hop.end,
                           steps[k], given.hidden, history_of(steps[: k + 1]))
        return SignedAnswer(self._public_key(hop.peer_id), claim, given.hidden,
                            given.signature)

    async def _recover(self, lost: dict[HopSession, HopFailed], pos: int) -> torch.Tensor:
        """Replace the hops in ``lost``, replay the hops after the first; the step's outputs.

        The route goes on client-driven (as after a failover): each hop
        after the first loser replays the corrected inputs from position 0
        in their chunks, so every cache is rebuilt from correct states.
        """
        run = self.run
        await run._stop_pushing()
        i = min(run.sessions.index(s) for s in lost)
        history: list[torch.Tensor] = []
        while i < len(run.sessions):
            session = run.sessions[i]
            exc = lost.get(session)
            if exc is None:
                run._keep(session, history)
                try:
                    history, i = await run._replay(session, history), i + 1
                    continue
                except HopFailed as again:
                    if again.session is not session:
                        raise
                    exc = again
            after, full = await run._fail_over(i, exc, 0)
            history = (list(run.inputs[run.sessions[after].hop.start])
                       if after < len(run.sessions) else [full])
            i = after
        run.outputs = [torch.cat(history, dim=1)]
        return run.outputs[0][:, pos:]

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
        checker = verdicts[0][0]
        third = verdicts[1][0] if len(verdicts) > 1 else ""
        loser = ""
        if third:
            c3 = verdicts[1][1]
            if agree(c3, verdicts[0][1], self.codec) and not agree(c3, mine, self.codec):
                loser = hop.peer_id
            elif agree(c3, mine, self.codec) and not agree(c3, verdicts[0][1], self.codec):
                loser = checker
        peers = [hop.peer_id, checker, third][: len(answers)]
        path, verified = self._keep_evidence((self._step(history),), answers,
                                             peers.index(loser)
                                             if loser else len(answers), hop, pos)
        self.report.mismatches.append(Mismatch(
            pos, hop.start, hop.end, hop.peer_id, checker, third, loser, path,
            verified).as_json())
        if loser:
            self.run.directory.ban(loser)
        if loser == hop.peer_id:
            return HopFailed(f"{hop.peer_id} lost a spot check at position {pos} "
                             f"(layers {hop.start}..{hop.end - 1})", session)
        return None

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


class _Unsure(Exception):
    """A hop's log cannot be judged: an answer to a pushed step signs another input."""
