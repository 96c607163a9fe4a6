"""Paid sessions end to end: tabs, vouchers and claims over real chains and real SmolLM2.

Each server gains exactly bid x layers x positions it ran, the client gets
the rest back, the output is the free route's; a broke client is refused
before any step; a client that stops paying is stopped after one step of
credit and its last voucher is what the server claims. specs/network.md 9.6.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import replace

import pytest
import trio

from ledger.errors import BadSignature, StaleVoucher
from ledger.state import TAB
from ledger.tab import Claim, sign_voucher
from ledger.types import ZERO_SIG, sign
from tests.ledger.chainkit import balance
from tests.node.netkit import eventually, run
from node.serve import SessionConfig
from tests.wallet.paidkit import paid_swarm, payer_with
from tests.wallet.client.test_remote import PROMPT, local_tokens, parts  # noqa: F401 (fixtures)
from wallet.client import InferRequest
from wallet.errors import RemoteError, TooExpensive
from wallet.client.generation import Generation
from wallet.payer import ClientTab, InsufficientFunds, PaymentRefused
from wallet.client.remote import ClientConfig, open_remote
from wallet.client.session import RouteRun

NO_CHECKS = ClientConfig(spot_check_rate=0.0)


async def held_route(client, nursery, parts, steps: int, extra: int = 8) -> RouteRun:  # noqa: F811
    """A paid route over all 30 layers, driven by hand: the prompt, then ``steps - 1``
    decode steps, and left open (its client neither settles nor hangs up)."""
    ids = parts.tokenizer.encode_chat([{"role": "user", "content": PROMPT}])
    route = RouteRun(client.directory, client.host, NO_CHECKS, Generation(), len(ids) + extra,
                     nursery, payer=client.payer)
    await route.open(0, 30)
    if steps:
        await route.forward(client._embed(ids), 0)
    for pos in range(len(ids), len(ids) + steps - 1):
        await route.forward(client._embed([1]), pos)
    return route


def test_a_broke_client_stops_and_a_funded_one_pays_each_server_what_it_ran(
        tmp_path, gguf_reader, parts, local_tokens):  # noqa: F811
    async def main():
        async with AsyncExitStack() as stack:
            swarm = await paid_swarm(stack, tmp_path, gguf_reader)
            user = swarm.net.users[0]
            before = {s.wallet.public: balance(swarm.db, s.wallet.public)
                      for s in swarm.servers}
            user_before = balance(swarm.db, user.public)
            # First a client that believes it holds 0.001 coin: refused before any step.
            broke = swarm.payer(user, max_price=10)
            broke.balance = 1000
            async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                   config=NO_CHECKS, payer=broke) as client:
                with pytest.raises(InsufficientFunds, match=r"insufficient funds: need "
                                   r"\d+(\.\d+)? coins \(\d+ positions x 30 layers x bid "
                                   r"5/6/7 base units, x2 margin for failover\), balance "
                                   r"0\.001"):
                    await client.generate(InferRequest(PROMPT, max_tokens=8))
            assert all(s.server.inference.served_tokens == 0 for s in swarm.servers)
            assert broke.tabs == []
            payer = swarm.payer(user, max_price=10)
            async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                   config=NO_CHECKS, payer=payer) as client:
                result = await client.generate(InferRequest(PROMPT, max_tokens=8))
            assert result.token_ids == local_tokens(8)
            assert len(result.tabs) == 1 and len(result.payments) == 3
            positions = len(parts.tokenizer.encode_chat(
                [{"role": "user", "content": PROMPT}])) + 7
            paid = {}
            for p in result.payments:
                s = next(x for x in swarm.servers if str(x.host.peer_id) == p["peer_id"])
                assert p["amount"] == positions * 10 * s.price == p["server_counted"]
                assert p["claim"] is not None
                paid[s.wallet.public] = p["amount"]
            tab_id = bytes.fromhex(result.tabs[0]["tab"])
            await swarm.settled("every lane settled and the tab closed",
                                lambda: swarm.db.state.get(TAB + tab_id) is None
                                and all(balance(swarm.db, w) == before[w] + paid[w]
                                        for w in paid))
            assert balance(swarm.db, user.public) == user_before - sum(paid.values())
            await swarm.settled("every cashier saw its lane settled", lambda: all(
                s.cashier.stats.settled == 1 and not s.cashier.lanes for s in swarm.servers))
            assert not any(any(s.cashier.folder.glob("*.tab")) for s in swarm.servers)
    run(main, deadline=120)


def positions_of(parts, steps: int) -> int:
    """Positions a generation's first ``steps`` steps run: the prompt, then a token each."""
    return len(parts.tokenizer.encode_chat([{"role": "user", "content": PROMPT}])) + steps - 1


class StingyTab(ClientTab):
    """A client's tab that stops counting what it owes after ``pays`` steps per hop."""

    pays = 2

    def deliver(self, hop, positions):
        seen = self.__dict__.setdefault("seen", {})
        seen[hop.peer_id] = seen.get(hop.peer_id, 0) + 1
        if seen[hop.peer_id] <= self.pays:
            ClientTab.deliver(self, hop, positions)


StingyPayer = payer_with(StingyTab)


def test_a_client_that_stops_paying_gets_one_step_of_credit(
        tmp_path, gguf_reader, parts):  # noqa: F811
    async def main():
        async with AsyncExitStack() as stack:
            swarm = await paid_swarm(stack, tmp_path, gguf_reader)
            user = swarm.net.users[0]
            before = {s.wallet.public: balance(swarm.db, s.wallet.public) for s in swarm.servers}
            fair = swarm.payer(user, max_price=10)
            payer = StingyPayer(user, fair.chain_id, fair.nonce, fair.height, 10,
                                balance=fair.balance)
            config = ClientConfig(spot_check_rate=0.0, max_failovers=0)
            async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                   config=config, payer=payer) as client:
                with pytest.raises(RemoteError, match="payment behind"):
                    await client.generate(InferRequest(PROMPT, max_tokens=8))
            # Three steps ran everywhere (the third on credit); two were vouched for.
            ran, vouched = positions_of(parts, 3), positions_of(parts, 2)
            assert [s.server.inference.served_tokens for s in swarm.servers] == [ran] * 3
            tab_id = payer.tabs[0].tab_id
            await swarm.settled("every lane claimed and the tab closed", lambda: (
                swarm.db.state.get(TAB + tab_id) is None and all(
                    balance(swarm.db, s.wallet.public) > before[s.wallet.public]
                    for s in swarm.servers)))
            for s in swarm.servers:
                gained = balance(swarm.db, s.wallet.public) - before[s.wallet.public]
                assert gained == vouched * 10 * s.price  # the last voucher, not a unit more
            assert balance(swarm.db, user.public) == fair.balance - vouched * 10 * (5 + 6 + 7)
    run(main, deadline=120)


def test_a_client_gone_silent_is_claimed_after_the_idle_timeout(
        tmp_path, gguf_reader, parts):  # noqa: F811
    async def main():
        async with AsyncExitStack() as stack:
            swarm = await paid_swarm(stack, tmp_path, gguf_reader, idle_timeout=1.5)
            user = swarm.net.users[0]
            before = {s.wallet.public: balance(swarm.db, s.wallet.public) for s in swarm.servers}
            payer = swarm.payer(user, max_price=10)
            async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                   config=NO_CHECKS, payer=payer) as client, \
                    trio.open_nursery() as readers:
                await held_route(client, readers, parts, steps=3)  # then silence
                tab_id = payer.tabs[0].tab_id
                vouched = positions_of(parts, 2)  # the last voucher covers two of three steps
                await swarm.settled("every server claimed after its idle timeout", lambda: (
                    swarm.db.state.get(TAB + tab_id) is None and all(
                        balance(swarm.db, s.wallet.public) > before[s.wallet.public]
                        for s in swarm.servers)), limit=40)
                readers.cancel_scope.cancel()
            for s in swarm.servers:
                gained = balance(swarm.db, s.wallet.public) - before[s.wallet.public]
                assert gained == vouched * 10 * s.price
            assert balance(swarm.db, user.public) == payer.balance - vouched * 10 * (5 + 6 + 7)
    run(main, deadline=120)


def test_a_double_spent_tab_is_refused(tmp_path, gguf_reader, parts, local_tokens):  # noqa: F811
    """Two generations at once, each tab locking most of the balance with the same nonce:
    the second tab a server sees is refused by its chain before any step runs."""
    async def main():
        async with AsyncExitStack() as stack:
            swarm = await paid_swarm(stack, tmp_path, gguf_reader)
            user = swarm.net.users[0]
            payers = [swarm.payer(user, max_price=10) for _ in range(2)]
            for p in payers:
                p.margin = 5_000  # each tab locks more than half of the 100 coins
            outcomes: list = [None, None]

            async def one(i):
                async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                       config=NO_CHECKS, payer=payers[i]) as client:
                    try:
                        outcomes[i] = await client.generate(InferRequest(PROMPT, max_tokens=6))
                    except PaymentRefused as exc:
                        outcomes[i] = exc
            async with trio.open_nursery() as both:
                both.start_soon(one, 0)
                both.start_soon(one, 1)
            won = [o for o in outcomes if not isinstance(o, Exception)]
            lost = [o for o in outcomes if isinstance(o, Exception)]
            assert len(won) == 1 and len(lost) == 1, outcomes
            assert won[0].token_ids == local_tokens(6)
            assert "the chain refuses the tab" in str(lost[0])
    run(main, deadline=120)


def test_a_failover_stays_paid_and_the_output_identical(
        tmp_path, gguf_reader, parts, local_tokens):  # noqa: F811
    async def main():
        async with AsyncExitStack() as stack:
            swarm = await paid_swarm(stack, tmp_path, gguf_reader, prices=(5, 6, 7, 6),
                                     spans=((0, 10), (10, 20), (20, 30), (10, 20)))
            user = swarm.net.users[0]
            before = {s.wallet.public: balance(swarm.db, s.wallet.public) for s in swarm.servers}
            payer = swarm.payer(user, max_price=10, blocks=30)
            by_id = {str(s.host.peer_id): s for s in swarm.servers}
            seen: list[int] = []
            killed = []

            async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                   config=NO_CHECKS, payer=payer) as client:
                def kill(token) -> None:
                    seen.append(token.id)
                    if len(seen) == 3:
                        hop = next(h for h in client.route if h.start == 10)
                        killed.append(by_id[hop.peer_id])
                        by_id[hop.peer_id].host.stop()
                result = await client.generate(InferRequest(PROMPT, max_tokens=8), kill)
            assert result.token_ids == local_tokens(8) and result.failovers == 1
            assert len(result.tabs) == 2  # the route's, then the replacement's
            paid = {p["peer_id"]: p for p in result.payments}
            assert str(killed[0].host.peer_id) not in paid  # it never settled
            for peer, p in paid.items():
                assert p["amount"] == p["server_counted"] > 0
            # Every live server is paid what it vouched for; the dead one's lane comes
            # back to the client when the tab expires, with whatever nobody claimed.
            live = [s for s in swarm.servers if s is not killed[0]]
            await swarm.settled("the claims landed and both tabs are gone", lambda: all(
                swarm.db.state.get(TAB + bytes.fromhex(t["tab"])) is None for t in result.tabs)
                and all(balance(swarm.db, s.wallet.public) > before[s.wallet.public]
                        for s in live if str(s.host.peer_id) in paid), limit=60)
            gains = {s.wallet.public: balance(swarm.db, s.wallet.public) - before[s.wallet.public]
                     for s in swarm.servers}
            for s in live:
                p = paid.get(str(s.host.peer_id))
                assert gains[s.wallet.public] == (p["amount"] if p else 0)
            # The dead server claimed (before its host was gone) or not: at most what
            # the route's tab vouched for it, never the step it died in.
            dead = killed[0]
            vouched = payer.tabs[0].owed(str(dead.host.peer_id))
            assert gains[dead.wallet.public] in (0, vouched)
            assert balance(swarm.db, user.public) == payer.balance - sum(gains.values())
    run(main, deadline=150)


def test_max_price_keeps_to_cheap_servers_and_names_the_cheapest_ask(
        tmp_path, gguf_reader, parts):  # noqa: F811
    async def main():
        async with AsyncExitStack() as stack:
            swarm = await paid_swarm(stack, tmp_path, gguf_reader, prices=(5, 6, 9, 7),
                                     spans=((0, 10), (10, 20), (20, 30), (20, 30)))
            user = swarm.net.users[0]
            async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                   config=NO_CHECKS, payer=swarm.payer(user, 8)) as client:
                result = await client.generate(InferRequest(PROMPT, max_tokens=3))
            assert {p["bid"] for p in result.payments} == {5, 6, 7}  # not the server at 9
            async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                   config=NO_CHECKS, payer=swarm.payer(user, 6)) as client:
                with pytest.raises(TooExpensive, match=r"every server that covers layer 20 "
                                   r"asks more than --max-price 6: the cheapest asks 7"):
                    await client.generate(InferRequest(PROMPT, max_tokens=3))
            async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                   config=NO_CHECKS) as free_only:
                with pytest.raises(TooExpensive, match=r"free servers only \(--max-price 0\)"):
                    await free_only.generate(InferRequest(PROMPT, max_tokens=3))
            assert all(s.server.inference.served_tokens == 0 for s in swarm.servers
                       if s.price == 9)
    run(main, deadline=120)


def test_a_dishonest_server_cannot_claim_more_than_was_vouched(
        tmp_path, gguf_reader, parts):  # noqa: F811
    """Mid-session, server 0 forges a larger voucher, then claims a real one twice."""
    async def main():
        async with AsyncExitStack() as stack:
            swarm = await paid_swarm(stack, tmp_path, gguf_reader)
            user, s = swarm.net.users[0], swarm.servers[0]
            before = balance(swarm.db, s.wallet.public)
            payer = swarm.payer(user, max_price=10)
            async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                   config=NO_CHECKS, payer=payer) as client, \
                    trio.open_nursery() as readers:
                run_ = await held_route(client, readers, parts, steps=2)
                tab_id = payer.tabs[0].tab_id
                await swarm.settled("the tab in a block",
                                    lambda: s.db.state.get(TAB + tab_id) is not None)
                bill = s.cashier.lanes[tab_id].bill
                held = bill.voucher  # what the client signed: the prompt's step
                node = s.node
                forged = replace(held, amounts=tuple(a * 100 for a in held.amounts))
                with pytest.raises(BadSignature):  # the client's signature does not cover it
                    await s.txs.submit(sign(Claim(held.chain_id, node.public,
                                                  sign_voucher(node, forged), False, ZERO_SIG),
                                            node))
                claim = sign(Claim(held.chain_id, node.public, held, False, ZERO_SIG), node)
                await s.txs.submit(claim)
                await swarm.settled("the claim in a block", lambda: any(
                    s.db.state.get(TAB + tab_id).paid))
                with pytest.raises(StaleVoucher):  # the same voucher again pays nothing new
                    await s.txs.submit(claim)
                await run_.close()
                readers.cancel_scope.cancel()
            await swarm.settled("the tab settled", lambda: s.db.state.get(TAB + tab_id) is None)
            owed = payer.tabs[0].owed(str(s.host.peer_id))
            assert owed == bill.paid == positions_of(parts, 2) * 10 * s.price
            assert balance(swarm.db, s.wallet.public) - before == owed
    run(main, deadline=120)


def test_a_full_server_admits_the_higher_bid_first(tmp_path, gguf_reader, parts):  # noqa: F811
    """One slot, one seat in the waiting room. A holds the slot; B (up to 6) waits at
    the ask (5); C (up to 9) is told the room admits 6, bids 6 and takes B's seat; B
    cannot bid 7, waits, and asks again at its ask. When A settles, C is served first."""
    async def main():
        async with AsyncExitStack() as stack:
            swarm = await paid_swarm(stack, tmp_path, gguf_reader, prices=(5,), spans=((0, 30),),
                                     sessions=SessionConfig(max_sessions=1, max_waiting=1),
                                     users=3)
            a, b, c = swarm.net.users
            order: list[str] = []
            results = {}

            async def ask(name, user, max_price):
                async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                       config=NO_CHECKS, payer=swarm.payer(user, max_price)
                                       ) as client:
                    results[name] = await client.generate(
                        InferRequest(PROMPT, max_tokens=3),
                        lambda t: order.append(name) if name not in order else None)

            async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                   config=NO_CHECKS, payer=swarm.payer(a, 5)) as holder, \
                    trio.open_nursery() as nursery:
                held = await held_route(holder, nursery, parts, steps=0, extra=2)
                inference = swarm.servers[0].server.inference
                nursery.start_soon(ask, "b", b, 6)
                await eventually(lambda: inference.room.waiting == 1, "b waiting", 10)
                nursery.start_soon(ask, "c", c, 9)
                # c is told 6, outbids b, b is told 7 (which it cannot bid): two Busy.
                await eventually(lambda: inference.refused_busy >= 2, "c outbidding b", 10)
                assert inference.room.waiting == 1
                await held.close()
            assert order == ["c", "b"]
            assert [p["bid"] for p in results["c"].payments] == [6]  # raised to what it took
            assert [p["bid"] for p in results["b"].payments] == [5]  # 7 was past its max
    run(main, deadline=120)
