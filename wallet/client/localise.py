"""Localising a spot check's disagreement from the client's logs (specs/network.md 9.5).

Owns `LogLocaliser`, the part of `wallet.client.spotcheck.SpotChecker` that,
once a route check disagrees, judges each hop of the route on exactly the
steps it ran (`wallet.client.steplog.StepLog`) on other servers only: a
checker runs the hop's steps one by one, as the hop got them, a third
settles a disagreement (majority of three), and the route is repaired from
the first loser on. The route's hops are asked nothing, so a liar cannot
tell a checked step from any other. A mixin: the checker's candidates,
sessions, evidence and replay fallback are `SpotChecker`'s.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import trio

from compute.wiretensor import decode_tensor
from ledger.codec import encode
from node.net import FramingError, write_frame
from node.wire import (
    EMPTY_HISTORY, SignedAnswer, Step, StepResult, input_hash, next_history, step_claim,
    step_positions,
)
from wallet.client.hop import HopSession, step_timeout
from wallet.client.route import Hop
from wallet.client.spotrules import Mismatch, agree
from wallet.errors import HopFailed, ServerBusy


class LogLocaliser:
    """Judging the route's hops on their logs, and repairing it (a mixin of `SpotChecker`)."""

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
        hashes = _histories(steps)  # each claim names the running hash up to its step
        mine = [self._answer_of(session, steps[k], hashes[k]) for k in range(len(steps))]
        # An answer whose signature does not hold over a step the client sent is still
        # judged on its outputs (the input is known; the evidence then does not verify:
        # a late answer to an earlier send of the same step may be logged in its place).
        # Over a pushed step, the input the client derived may not be the one it ran.
        if any(not a.verified() and session.log.was_pushed(steps[k].pos)
               for k, a in enumerate(mine)):
            raise _Unsure()
        candidates = self._candidates(hop)
        checker, k, theirs = "", None, None
        for peer in candidates:
            try:
                k, theirs = await self._first_disagreement(Hop(peer, hop.start, hop.end),
                                                           steps, hashes, mine)
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
                                                           steps[: k + 1], hashes, None)
            except HopFailed:
                self.run.directory.exclude(peer)
                continue
            except ServerBusy:
                continue
            third = peer
            answers.append(answer)
            break
        outs = [decode_tensor(a.hidden) for a in answers]
        return self._majority(session, (checker, third), outs, answers,
                              tuple(steps[: k + 1]), steps[k].pos)

    def _majority(self, session: HopSession, others: tuple[str, str],
                  outs: list[torch.Tensor], answers: list, steps: tuple[Step, ...],
                  at: int) -> HopFailed | None:
        """Settle a hop against its checker (and a third, when one answered): keep the
        evidence, report the mismatch, ban the loser of the majority of three.

        Args:
            session: the hop's; others: the checker's and the third's peer ids
                ("" when no third answered); outs, answers: the hop's, the
                checker's (and the third's) outputs and signed answers;
            steps, at: the input every answer claims, and the position judged.

        Returns:
            A `HopFailed` for the hop when it lost (it is banned), else None.
        """
        hop, (checker, third) = session.hop, others
        loser = ""
        if third:
            if agree(outs[2], outs[1], self.codec) and not agree(outs[2], outs[0], self.codec):
                loser = hop.peer_id
            elif agree(outs[2], outs[0], self.codec) and not agree(outs[2], outs[1], self.codec):
                loser = checker
        peers = [hop.peer_id, checker, third][: len(answers)]
        path, verified = self._keep_evidence(steps, answers, peers.index(loser)
                                             if loser else len(answers), hop, at)
        self.report.mismatches.append(Mismatch(
            at, hop.start, hop.end, hop.peer_id, checker, third, loser, path, verified).as_json())
        if loser:
            self.run.directory.ban(loser)
        if loser == hop.peer_id:
            return HopFailed(f"{hop.peer_id} lost a spot check at position {at} "
                             f"(layers {hop.start}..{hop.end - 1})", session)
        return None

    async def _first_disagreement(self, hop: Hop, steps: list[Step], hashes: list[bytes],
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
                answer = self._answer_of(session, step, hashes[k], reply)
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
                voucher = session.voucher([(session.hop, t)])  # a long step pays ahead
                await write_frame(session.stream, encode(replace(step, voucher=voucher)))
        except (trio.TooSlowError, FramingError) as exc:
            raise HopFailed(f"{session.hop.peer_id} failed: {exc!r}", session) from None
        x = decode_tensor(step.hidden)
        await run._await([session], [session], x, step.pos, timeout, len(step.hidden))
        return session.last_reply

    def _answer_of(self, session: HopSession, step: Step, history: bytes,
                   reply: StepResult | None = None) -> SignedAnswer:
        """``session``'s signed answer to ``step`` after ``history`` (its log's unless ``reply``)."""
        hop = session.hop
        given = reply if reply is not None else session.log.answers[step.pos]
        claim = step_claim(session.token, self.run.directory.model_id, hop.start, hop.end,
                           step, given.hidden, history)
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


def _histories(steps: list[Step]) -> list[bytes]:
    """The running input hash after each of ``steps`` (`node.wire.InputHistory`'s rule)."""
    h, out = EMPTY_HISTORY, []
    for step in steps:
        h = next_history(h, input_hash(step))
        out.append(h)
    return out


class _Unsure(Exception):
    """A hop's log cannot be judged: an answer to a pushed step signs another input."""
