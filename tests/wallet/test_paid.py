"""Paid sessions end to end: tabs, vouchers and claims over real chains and real SmolLM2.

Each server gains exactly bid x layers x positions it ran, the client gets
the rest back, the output is the free route's; a broke client is refused
before any step; a client that stops paying is stopped after one step of
credit and its last voucher is what the server claims. specs/network.md 9.6.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio

from ledger.state import TAB
from tests.ledger.chainkit import balance
from tests.node.netkit import run
from tests.wallet.paidkit import paid_swarm
from tests.wallet.test_remote import PROMPT, local_tokens, parts  # noqa: F401 (fixtures)
from wallet.client import InferRequest
from wallet.payer import InsufficientFunds
from wallet.remote import ClientConfig, open_remote

NO_CHECKS = ClientConfig(spot_check_rate=0.0)


def test_each_server_gains_what_it_ran_and_the_client_gets_the_rest_back(
        tmp_path, gguf_reader, parts, local_tokens):  # noqa: F811
    async def main():
        async with AsyncExitStack() as stack:
            swarm = await paid_swarm(stack, tmp_path, gguf_reader)
            user = swarm.net.users[0]
            before = {s.wallet.public: balance(swarm.db, s.wallet.public)
                      for s in swarm.servers}
            user_before = balance(swarm.db, user.public)
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


def test_a_broke_client_is_refused_before_any_step(tmp_path, gguf_reader, parts):  # noqa: F811
    async def main():
        async with AsyncExitStack() as stack:
            swarm = await paid_swarm(stack, tmp_path, gguf_reader)
            payer = swarm.payer(swarm.net.users[0], max_price=10)
            payer.balance = 1000  # what it believes it holds: far below the need
            async with open_remote(swarm.entry(), parts, registered=swarm.registry(),
                                   config=NO_CHECKS, payer=payer) as client:
                with pytest.raises(InsufficientFunds, match=r"insufficient funds: need "
                                   r"\d+(\.\d+)? coins \(\d+ positions x 30 layers x bid "
                                   r"5/6/7 base units, x2 margin for failover\), balance "
                                   r"0\.001"):
                    await client.generate(InferRequest(PROMPT, max_tokens=8))
            assert all(s.server.inference.served_tokens == 0 for s in swarm.servers)
            assert payer.tabs == []
    run(main, deadline=90)
