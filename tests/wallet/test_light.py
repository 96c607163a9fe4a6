"""wallet.light against a real node's wallet desk: a wallet without a node of its own.

Its account, the registry, a transfer submitted and one refused, garbage
that scores the client, a paid generation whose tab came from the peer's view.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio

from ledger.types import COIN, ZERO_SIG, Transfer, sign
from node.wire import WALLET_PROTOCOL
from tests.ledger.chainkit import balance
from tests.node.netkit import run
from tests.wallet.paidkit import paid_swarm
from tests.wallet.client.test_remote import PROMPT, local_tokens, parts  # noqa: F401 (fixtures)
from wallet.client import InferRequest
from wallet.light import TxRefused, light_peer
from wallet.payer import Payer
from wallet.registry import registry_from_view
from wallet.client.remote import ClientConfig, open_remote


def test_a_wallet_without_a_node_reads_submits_and_pays(tmp_path, gguf_reader, parts,
                                                        local_tokens):  # noqa: F811
    async def main():
        async with AsyncExitStack() as stack:
            swarm = await paid_swarm(stack, tmp_path, gguf_reader)
            user, other = swarm.net.users
            addr = swarm.servers[1].host.addrs[0]
            async with light_peer(addr) as peer:
                view = await peer.account(user.public)
                assert view["balance"] == balance(swarm.servers[1].db, user.public) == 100 * COIN
                assert (view["chain_id"], view["next_nonce"]) == (swarm.net.genesis.chain_id, 0)
                registry = registry_from_view(await peer.registry())
                assert registry == swarm.registry()
                tx = sign(Transfer(view["chain_id"], user.public, other.public, COIN, 0,
                                   ZERO_SIG), user)
                txid = await peer.submit(tx)
                assert (await peer.account(user.public))["next_nonce"] == 1  # queued there
                again = sign(Transfer(view["chain_id"], user.public, other.public, 2 * COIN, 0,
                                      ZERO_SIG), user)
                with pytest.raises(TxRefused, match="BadNonce: nonce 0 is replayed"):
                    await peer.submit(again)  # nonce 0 again, with the first one queued
                # Garbage resets the stream and scores this client, which may still ask.
                with pytest.raises(Exception):
                    await peer.host.request(peer.peer_id, WALLET_PROTOCOL, b"\x07garbage",
                                            timeout=5)
                await trio.sleep(0.2)
                assert swarm.servers[1].host.misbehaving.get(peer.host.peer_id, 0) >= 1
                # Paid from the peer's view of the account (no chain here).
                view = await peer.account(user.public)
                payer = Payer(user, view["chain_id"], view["next_nonce"], view["height"], 10,
                              balance=view["balance"])
            async with open_remote([addr], parts, registered=registry, payer=payer,
                                   config=ClientConfig(spot_check_rate=0.0)) as client:
                result = await client.generate(InferRequest(PROMPT, max_tokens=4))
            assert result.token_ids == local_tokens(4) and len(result.payments) == 3
            assert payer.tabs[0].tab.nonce == 1  # after the transfer
            await swarm.settled("the transfer in a block", lambda: balance(
                swarm.db, other.public) == 101 * COIN)
            assert txid is not None
    run(main, deadline=120)

