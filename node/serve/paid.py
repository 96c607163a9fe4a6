"""The paid side of an inference server's sessions (specs/network.md 9.6).

Owns `PaidSessions`, the part of `node.serve.sessions.InferenceServer` that
deals with its `node.serve.cashier.Cashier`: the checks of a request's tab
before it is seated (`_precheck`, then `_vet`: the chain's, before any slot
or seat), the end of a tab's sessions when it can no longer pay
(`_end_tab`, the cashier's ``on_end``), a step's delivery counted owed
(`_delivered`), and the client's `Settle`. A mixin: the sessions, the reply
and the cashier's bills are the server's own.
"""

from __future__ import annotations

from node.serve.admission import ClientAtLimit, ServerFull, SessionRefused
from node.serve.billing import PaymentError
from node.serve.cashier import Cashier
from node.wire import OpenSession, SessionError, Settle, Settled


class PaidSessions:
    """A server's paid sessions: tabs checked, ended, delivered, settled (a mixin)."""

    @property
    def cashier(self) -> Cashier | None:
        """Payments; None: free sessions only, no tabs."""
        return self._cashier

    @cashier.setter
    def cashier(self, cashier: Cashier | None) -> None:
        self._cashier = cashier
        if cashier is not None:
            cashier.on_end = self._end_tab

    def _end_tab(self, tab_id: bytes, why: str) -> None:
        """End the sessions paid by tab ``tab_id`` that are between steps (a session in a
        step ends at its next one, which `Cashier.take` refuses)."""
        for s in list(self.sessions.values()):
            if s.bill is not None and s.bill.tab_id == tab_id and not s.lock.locked():
                s.ending = why
                s.scope.cancel()

    async def _vet(self, tab) -> None:
        """`Cashier.vet`, its refusal a `SessionRefused`.

        Each vet reads the chain (the mempool applied) and may wait 5 s for a
        tab's predecessors, before any slot is held: so a client (its tab's
        account) has at most ``max_sessions_per_peer`` tabs checked at once,
        and the server at most ``max_sessions`` (`ClientAtLimit`, `ServerFull`
        otherwise), or one funded account could keep the chain service busy
        with tabs whose nonce is ahead.
        """
        vetting, account, limits = self._vetting, tab.client, self.config.limits()
        if vetting.get(account, 0) >= limits.per_peer:
            raise ClientAtLimit(vetting[account], limits.per_peer)
        if sum(vetting.values()) >= limits.max_sessions:
            raise ServerFull(sum(vetting.values()))
        vetting[account] = vetting.get(account, 0) + 1
        try:
            await self.cashier.vet(tab)
        except PaymentError as exc:
            raise SessionRefused(str(exc)) from None
        finally:
            vetting[account] -= 1
            if not vetting[account]:
                del vetting[account]

    def _precheck(self, req: OpenSession):
        """The tab and lane paying for ``req`` (None: free), checked without the chain.

        Raises:
            SessionRefused: a tab where this server takes none, a free session
                where it asks a price, or a tab that is bad in itself.
        """
        if self.cashier is None:
            if req.tab:
                raise SessionRefused("this server takes no tabs (it follows no chain): "
                                     "open a free session")
            return None
        try:
            return self.cashier.precheck(req, req.layer_end - req.layer_start)
        except PaymentError as exc:
            raise SessionRefused(str(exc)) from None

    async def _settle(self, s, msg: Settle) -> None:
        """The client's final voucher: keep it, claim the lane, say what is owed."""
        if s.bill is None:
            await self._reply(s.client, SessionError("a free session has nothing to settle"))
            return
        try:
            s.bill.settle(msg.voucher)
        except PaymentError as exc:
            await self._reply(s.client, SessionError(str(exc)[:256]))
            return
        bill, s.bill = s.bill, None
        claim = await self.cashier.release(bill)
        await self._reply(s.client, Settled(bill.owed, claim or bytes(32)))

    def _delivered(self, s) -> None:
        """The step's outputs left: a paid session's bill counts them (`Cashier.delivered`)."""
        charge, s.pending_charge = s.pending_charge, 0
        if s.bill is not None and charge:
            self.cashier.delivered(s.bill, charge)
