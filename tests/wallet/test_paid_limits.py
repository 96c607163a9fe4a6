"""Paid sessions against a rational client: bounded credit, tab life, double spends, slots.

Real chains, real hosts, real SmolLM2 layers, real tabs (tests/wallet/paidkit.py).
Each test is one hole of issue 28 that was open before (specs/network.md 9.6):

- a session that outlived its tab was served for free: now the servers stop
  `CLAIM_MARGIN` blocks before expiry and claim, the client goes on with a
  new tab, and every position each server ran is paid;
- the first step ran on credit whatever its size: now what passes the credit
  is paid ahead, or refused before it runs;
- a tab that lost a same-nonce race was served until it failed to land
  (9 blocks): now it leaves the mempool with the winner's block and its
  sessions end then;
- an unfunded tab held a slot (and took a funded waiter's seat) while the
  server asked the chain: now the chain's checks come before any slot.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import replace

import pytest
import torch
import trio

from ledger import schema
from ledger.crypto import SigningKey
from ledger.state import TAB
from ledger.types import ZERO_SIG, Transfer, sign, tx_hash
from node.chain import Producer
from node.clock import now_ms
from node.serve import SessionConfig
from node.wire import CREDIT_POSITIONS, TAB_ENDS, SessionError, credit, serve_until
from tests.ledger.chainkit import balance
from tests.node.netkit import eventually, run
from tests.wallet.client.test_remote import PROMPT, parts  # noqa: F401 (fixtures)
from tests.wallet.paidkit import paid_swarm, payer_with
from tests.wallet.test_paid import NO_CHECKS, held_route
from wallet.client import InferRequest
from wallet.client.generation import Generation
from wallet.client.remote import open_remote
from wallet.client.session import RouteRun
from wallet.client.route import Hop
from wallet.errors import HopFailed, RemoteError
from wallet.payer import RENEW_AHEAD, ClientTab, Payer, PaymentRefused

#: A prompt longer than a lane's credit: its one step must pay ahead.
LONG = "Say the words back: " + " ".join(["river stone"] * CREDIT_POSITIONS)


def gains(swarm, before: dict) -> list[int]:
    return [balance(swarm.db, s.wallet.public) - before[s.wallet.public] for s in swarm.servers]


@pytest.mark.parametrize("idle", [False, True], ids=["client-moves-first", "server-ends-it"])
def test_a_route_that_outlives_its_tab_goes_on_with_a_new_one_and_its_servers_are_paid(
        tmp_path, gguf_reader, parts, idle):  # noqa: F811
    """A route on a tab of the shortest life (16 blocks) goes on past it. A client that
    steps as the tab nears its end moves each hop to a new tab and settles the old session
    (every position paid); one idle past the tab's last served height finds its sessions
    ended and claimed by the servers (at most the last step, within the credit, unpaid).
    Either way the outputs are those of a route opened afterwards."""
    async def main():
        async with AsyncExitStack() as stack:
            swarm = await paid_swarm(stack, tmp_path, gguf_reader, interval_ms=400)
            user = swarm.net.users[0]
            before = {s.wallet.public: balance(swarm.db, s.wallet.public) for s in swarm.servers}
            payer = swarm.payer(user, max_price=10, blocks=16)
            ids = parts.tokenizer.encode_chat([{"role": "user", "content": PROMPT}])
            config = replace(NO_CHECKS, date_every_s=0.0)
            async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                   config=config, payer=payer) as client, \
                    trio.open_nursery() as readers:
                route = await held_route(client, readers, parts, steps=2)
                first = payer.tabs[0].tab
                last = serve_until(first.expiry_height) - (0 if idle else RENEW_AHEAD)
                await eventually(lambda: swarm.db.height >= last, "the tab nearing its end", 30)
                if idle:  # the servers end its sessions and claim, long before it expires
                    await eventually(lambda: all(s.cashier.stats.claims for s in swarm.servers),
                                     "the servers' claims", 10)
                out = await route.forward(client._embed([5]), len(ids) + 1)  # on a new tab
                assert len(payer.tabs) > 1 and route.result.failovers == 0
                await route.close()
                fresh = RouteRun(client.directory, client.host, NO_CHECKS, Generation(),
                                 len(ids) + 8, readers, payer=payer)
                await fresh.open(0, 30)
                await fresh.forward(client._embed(ids), 0)
                await fresh.forward(client._embed([1]), len(ids))
                assert torch.equal(out, await fresh.forward(client._embed([5]), len(ids) + 1))
                await fresh.close()
                readers.cancel_scope.cancel()
            tabs = [t.tab_id for t in payer.tabs]
            await swarm.settled("every tab closed by its claims", lambda: all(
                swarm.db.state.get(TAB + t) is None for t in tabs), limit=60)
            assert swarm.db.height <= first.expiry_height  # closed by claims, not by expiry
            for s, gained in zip(swarm.servers, gains(swarm, before)):
                ran = s.server.inference.served_tokens * 10 * s.price
                if idle:  # the last step before the end was vouched by no voucher
                    assert 0 < ran - gained <= credit(10, s.price)
                else:
                    assert gained == ran
                assert s.cashier.stats.expired_unclaimed == 0
    run(main, deadline=180)


class OldTab(ClientTab):
    """A client that never pays ahead (vouchers for what was delivered only)."""

    def voucher(self, through=()):
        return ClientTab.voucher(self, ())


OldPayer = payer_with(OldTab)


def test_a_step_beyond_the_credit_is_paid_ahead_or_refused_before_it_runs(
        tmp_path, gguf_reader, parts):  # noqa: F811
    async def main():
        async with AsyncExitStack() as stack:
            swarm = await paid_swarm(stack, tmp_path, gguf_reader)
            user = swarm.net.users[0]
            fair = swarm.payer(user, max_price=10)
            old = OldPayer(user, fair.chain_id, fair.nonce, fair.height, 10, balance=fair.balance,
                           height_now=fair.height_now)
            config = replace(NO_CHECKS, max_failovers=0)
            async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                   config=config, payer=old) as client:
                with pytest.raises(RemoteError, match="beyond the credit"):
                    await client.generate(InferRequest(LONG, max_tokens=2))
            assert [s.server.inference.served_tokens for s in swarm.servers] == [0, 0, 0]
            before = {s.wallet.public: balance(swarm.db, s.wallet.public) for s in swarm.servers}
            payer = swarm.payer(user, max_price=10)
            async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                   config=NO_CHECKS, payer=payer) as client:
                result = await client.generate(InferRequest(LONG, max_tokens=2))
            tabs = [t.tab_id for t in payer.tabs]
            await swarm.settled("every tab closed", lambda: all(
                swarm.db.state.get(TAB + t) is None for t in tabs))
            for s, gained in zip(swarm.servers, gains(swarm, before)):
                assert gained == s.server.inference.served_tokens * 10 * s.price > 0
            assert len(result.token_ids) == 2
    run(main, deadline=150)


def test_a_tab_that_lost_a_same_nonce_race_ends_its_sessions_and_leaves_the_mempool(
        tmp_path, gguf_reader, parts):  # noqa: F811
    async def main():
        async with AsyncExitStack() as stack:
            swarm = await paid_swarm(stack, tmp_path, gguf_reader)
            user = swarm.net.users[0]
            for s in swarm.servers:  # no block until the race is staged
                s.producer.hold()
            payer = swarm.payer(user, max_price=10)
            async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                   config=NO_CHECKS, payer=payer) as client, \
                    trio.open_nursery() as readers:
                route = await held_route(client, readers, parts, steps=2)
                tab = payer.tabs[0].tab
                tab_key = schema.mempool_key(tx_hash(tab))
                assert all(s.db.store.get(tab_key) is not None for s in swarm.servers)
                # The client's other transaction of the same nonce reached the producer
                # first (staged: its mempool holds it, the tab is held back).
                racer = sign(Transfer(tab.chain_id, user.public, swarm.net.users[1].public,
                                      1, tab.nonce, ZERO_SIG), user)
                maker = swarm.servers[2]
                await maker.service.call(lambda: maker.db.store.write([(tab_key, None)]))
                await maker.service.call(lambda: maker.db.add_to_mempool(racer))
                at = swarm.db.height
                maker.nursery.start_soon(Producer(maker.service, maker.node, now_ms,
                                                  interval_ms=300).run)
                await eventually(lambda: all(s.db.height > at for s in swarm.servers),
                                 "the racer's block everywhere", 20)
                await eventually(lambda: all(s.db.store.get(tab_key) is None
                                             for s in swarm.servers),
                                 "the losing tab evicted from every mempool", 20)
                await eventually(lambda: all(not s.server.inference.sessions
                                             for s in swarm.servers),
                                 "the servers ending the tab's sessions", 10)
                served = [s.server.inference.served_tokens for s in swarm.servers]
                route.config = replace(NO_CHECKS, max_failovers=0)
                with pytest.raises(RemoteError, match="the chain dropped the session's tab"):
                    await route.forward(client._embed([1]), route.max_len - 7)
                assert [s.server.inference.served_tokens for s in swarm.servers] == served
                assert swarm.db.state.get(TAB + tx_hash(tab)) is None
                readers.cancel_scope.cancel()
    run(main, deadline=150)


def test_an_unfunded_tab_holds_no_slot_and_takes_no_seat(tmp_path, gguf_reader, parts):  # noqa: F811
    """One slot, one seat. A holds the slot, B (funded) waits in the seat; fresh keys with
    no coins bidding 2000, their nonce next or ahead, are refused at once by the chain's
    checks: B keeps its seat and is served when A ends."""
    async def main():
        async with AsyncExitStack() as stack:
            swarm = await paid_swarm(stack, tmp_path, gguf_reader, prices=(5,), spans=((0, 30),),
                                     sessions=SessionConfig(max_sessions=1, max_waiting=1),
                                     users=2)
            a, b = swarm.net.users
            inference = swarm.servers[0].server.inference
            served: list[str] = []

            async def ask_b():
                async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                       config=NO_CHECKS, payer=swarm.payer(b, 5)) as client:
                    await client.generate(InferRequest(PROMPT, max_tokens=2))
                    served.append("b")

            async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                   config=NO_CHECKS, payer=swarm.payer(a, 5)) as holder, \
                    trio.open_nursery() as nursery:
                held = await held_route(holder, nursery, parts, steps=0, extra=2)
                nursery.start_soon(ask_b)
                await eventually(lambda: inference.room.waiting == 1, "b waiting", 10)
                for seed, nonce in ((7, 0), (8, 1), (9, 5)):
                    broke = Payer(SigningKey(bytes([seed]) * 32), swarm.net.genesis.chain_id,
                                  nonce, swarm.db.height, 2000, balance=10**15,
                                  height_now=lambda: swarm.db.height)
                    async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                           config=NO_CHECKS, payer=broke) as client:
                        with pytest.raises(PaymentRefused, match="InsufficientFunds"):
                            await client.generate(InferRequest(PROMPT, max_tokens=2))
                    assert inference.room.waiting == 1 and len(inference.sessions) == 1
                await held.close()
            assert served == ["b"]
            assert swarm.servers[0].cashier.stats.refused == 3
    run(main, deadline=150)


def test_a_session_no_server_took_gives_its_tabs_nonce_back(tmp_path, gguf_reader, parts):  # noqa: F811
    """A checker's or replacement's session the server refuses (here: layers it does not
    hold) retracts the tab opened for it, so the next tab has the next nonce, not a gap
    every server's chain would make it wait on, then refuse."""
    async def main():
        async with AsyncExitStack() as stack:
            swarm = await paid_swarm(stack, tmp_path, gguf_reader)
            payer = swarm.payer(swarm.net.users[0], max_price=10)
            async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                   config=NO_CHECKS, payer=payer) as client, \
                    trio.open_nursery() as readers:
                route = RouteRun(client.directory, client.host, NO_CHECKS, Generation(), 16,
                                 readers, payer=payer)
                nonce = payer.nonce
                with pytest.raises(HopFailed, match="refused the session"):
                    await route._open(Hop(str(swarm.servers[0].host.peer_id), 0, 30))
                assert payer.nonce == nonce and not payer.tabs
                session = await route._open(Hop(str(swarm.servers[0].host.peer_id), 0, 10))
                assert session.tab.tab.nonce == nonce  # no gap: the server took it
                await session.close()
                readers.cancel_scope.cancel()
    run(main, deadline=120)


def test_a_server_that_says_a_fresh_or_free_session_s_tab_ends_is_failed_over(
        gguf_reader, parts):  # noqa: F811
    """`TAB_ENDS` is no one's fault only of a paid session whose tab the client finds due:
    a server saying it of a free session is counted and excluded like any failure (before,
    the client asked it again for good)."""
    from tests.wallet.client.test_remote import swarm as free_swarm

    async def main():
        async with AsyncExitStack() as stack:
            hosts, servers = await free_swarm(stack, gguf_reader, [(0, 10), (10, 20), (20, 30)])
            inference = servers[1].inference

            async def ends(s, step):
                await inference._reply(s.client, SessionError(f"{TAB_ENDS}: so it says"))
                s.scope.cancel()
                return False
            inference._step = ends
            config = replace(NO_CHECKS, max_failovers=0)  # its first failure is the last
            async with open_remote([hosts[0].addrs[0]], parts, config=config) as client:
                with pytest.raises(RemoteError, match="gave up after 0 failures: .* the tab "
                                                      "ends: so it says"):
                    await client.generate(InferRequest(PROMPT, max_tokens=2))
    run(main, deadline=120)
