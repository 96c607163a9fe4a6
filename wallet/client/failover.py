"""Moving a route's hop to another session: a failover, or a tab at its end.

Owns `Failover`, the part of `wallet.client.session.RouteRun` that replaces a
hop (specs/network.md 9.4 and 9.6): a failed hop is excluded and its kept
inputs replayed, chunk by chunk, on a replacement (rebuilt first when they
were pushed), so the rebuilt KV caches are bit-identical; a hop whose tab
nears its last served height moves the same way to a new tab, blaming no
one (`_renew_due`). A mixin: the sessions, inputs, payer and replays are the
run's own.
"""

from __future__ import annotations

import torch
import trio

from wallet.errors import HopFailed, RemoteError


class Failover:
    """Replacing hops of a route (a mixin of `wallet.client.session.RouteRun`)."""

    async def _renew_due(self) -> None:
        """Move each hop whose tab nears its last served height to a new tab (`Payer.due`).

        The old session is settled as it closes (its server is paid for every
        position), and its kept inputs are replayed on the new one, as in a
        failover that blames no one. The chain's height is asked at most every
        ``date_every_s``; a server ends a session the client did not move in
        time (`node.wire.TAB_ENDS`) and the client moves it then.
        """
        if self.payer is None:
            return
        if trio.current_time() - self._dated >= self.config.date_every_s:
            self._dated = trio.current_time()
            await self.payer.date()
        i = 0
        while i < len(self.sessions):
            s = self.sessions[i]
            if s.tab is None or s.error is not None or not self.payer.due(s.tab):
                i += 1
                continue
            await self._stop_pushing()
            await self._settle(s)
            i, _ = await self._fail_over(i, HopFailed(f"the tab paying {s.hop.peer_id} nears "
                                                      "its end", s, tab_ended=True))

    async def _fail_over(self, i: int, exc: Exception, pos: int = 0
                         ) -> tuple[int, torch.Tensor]:
        """Replace hop ``i`` and replay its inputs; returns (next hop index, its output).

        The replacement may be several servers; each replays the inputs in
        their original chunks, and its outputs are the next one's inputs
        (and the next hop's, which are then complete). The output returned
        is the replacement's at positions ``pos..``: the step under way's,
        which may have gone in several chunks.
        """
        i = await self._rebuild_inputs(i)
        failed = self.sessions[i]
        span = (failed.hop.start, failed.hop.end)
        kept = self.inputs[span[0]]
        while True:
            await failed.close()
            if not await self._tab_due(failed, exc):  # a tab at its end is no one's fault:
                failed.served.failed = True  # the hop goes on, on a new tab
                self._count_failure(exc)
                self.directory.exclude(failed.hop.peer_id)
            await self.directory.refresh()
            replacement = await self._open_span(*span)
            history = kept
            try:
                for failed in replacement:
                    self._keep(failed, history)
                    history = await self._replay(failed, history)
            except HopFailed as again:
                exc = again  # ``failed`` is the replacement that failed: exclude it, retry
                for session in replacement:
                    await session.close()
                continue
            except BaseException:  # e.g. a history too large for one frame: free them
                for session in replacement:
                    await session.close()
                raise
            self.sessions[i: i + 1] = replacement
            self.on_route([s.hop for s in self.sessions])
            after = i + len(replacement)
            if after < len(self.sessions):
                self._keep(self.sessions[after], history)
            return after, torch.cat(history, dim=1)[:, pos:]

    async def _tab_due(self, session, exc: Exception) -> bool:
        """Whether ``exc`` is ``session``'s tab at its end (`node.wire.TAB_ENDS`), no fault.

        Only of a paid session whose tab is due by the client's own look at
        the chain (`Payer.due`): a server that says it of a fresh tab, or of
        a free session, fails as for any other reason (attack note: else it
        could send the client round the same server for good).
        """
        if not getattr(exc, "tab_ended", False) or self.payer is None or session.tab is None:
            return False
        await self.payer.date()
        return self.payer.due(session.tab)

    async def _rebuild_inputs(self, i: int) -> int:
        """Make hop ``i``'s kept inputs complete: replay the hops before it whose outputs are not.

        Pushed steps never passed through the client, so it replays the
        first kept hop's inputs onward (each server rolls its cache back to
        position 0 and recomputes it bit for bit); a hop that fails on the
        way is failed over in turn.

        Returns:
            Hop ``i``'s index now (a hop before it may have become several).
        """
        k = max(j for j in range(i + 1) if self.sessions[j].hop.start in self.kept)
        while k < i:
            session = self.sessions[k]
            try:
                history = await self._replay(session, self.inputs[session.hop.start])
            except HopFailed as exc:
                after, _ = await self._fail_over(k, exc)
                i += after - k - 1  # the failed hop became (after - k) hops
                k = after
                continue
            k += 1
            self._keep(self.sessions[k], history)
        return i

    def _count_failure(self, exc: Exception) -> None:
        self.result.failovers += 1
        if self.result.failovers > self.config.max_failovers:
            raise RemoteError(f"gave up after {self.config.max_failovers} "
                              f"failures: {exc}") from None
