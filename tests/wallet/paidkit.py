"""A paid swarm on loopback: real chains, real hosts, real SmolLM2 layers, real tabs.

Three registered servers (layers 0:10, 10:20, 20:30), each a node in all
but the CLI: a LevelDB chain of its own, `ChainService` (sync and block
gossip), `TxGossip`, a `Producer` sealing blocks with its node key, an
`Announcer`, the `WalletDesk` (light clients), and a `LayerServer` whose
`Cashier` admits tabs and claims through that chain. Users (chainkit's ``net.users``) hold 100 coins each.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from types import SimpleNamespace

import trio

from ledger.chaindb import ChainDB
from ledger.store import LevelDBStore
from node.chain import ChainService, ChainTabs, Producer, TxGossip, WalletDesk, registry_view
from node.clock import now_ms
from node.net import PeerIdentity
from node.net.host import open_host
from node.serve import Announcer, Cashier, LayerServer, ServeConfig, SessionConfig
from node.wire.sync import BLOCKS_TOPIC, TXS_TOPIC
from tests.ledger.chainkit import balance, make_net, new_db, peer_key
from tests.node.netkit import eventually
from wallet.payer import Payer
from wallet.registry import registry_from_view

SPANS = ((0, 10), (10, 20), (20, 30))


@dataclass
class PaidSwarm:
    net: object
    servers: list = field(default_factory=list)  # SimpleNamespace per server

    @property
    def db(self) -> ChainDB:
        return self.servers[0].db

    def registry(self) -> dict:
        return registry_from_view(registry_view(self.db))

    def payer(self, user, max_price: int, blocks: int = 120) -> Payer:
        """A payer of ``user`` that dates each tab by the entry server's chain, as
        `pwallet infer` does by its node's."""
        return Payer(user, self.net.genesis.chain_id, self._nonce(user.public), self.db.height,
                     max_price, blocks=blocks, balance=balance(self.db, user.public),
                     height_now=lambda: self.db.height)

    def _nonce(self, account: bytes) -> int:
        from ledger.state import ACCOUNT
        record = self.db.state.get(ACCOUNT + account)
        return 0 if record is None else record.nonce

    def entry(self) -> list[str]:
        return [self.servers[0].host.addrs[0]]

    async def settled(self, what: str, predicate, limit: float = 30.0) -> None:
        await eventually(predicate, what, limit)


async def paid_swarm(stack: AsyncExitStack, tmp_path, reader, prices=(5, 6, 7), *,
                     sessions: SessionConfig = SessionConfig(), spans=SPANS,
                     interval_ms: int = 300, idle_timeout: float | None = None,
                     users: int = 2) -> PaidSwarm:
    """Start the servers of ``spans`` at ``prices``, each on its own chain, all meshed."""
    net = make_net(n_nodes=len(spans), n_users=users, layers=list(spans))
    swarm = PaidSwarm(net)
    if idle_timeout is not None:
        from dataclasses import replace
        sessions = replace(sessions, idle_timeout=idle_timeout)
    for i, (span, price) in enumerate(zip(spans, prices)):
        node = net.nodes[i]
        identity = PeerIdentity.from_seed(peer_key(node).seed())
        db = new_db(net, LevelDBStore(tmp_path / f"chain{i}"))
        stack.callback(db.close)
        host = await stack.enter_async_context(
            open_host(identity, gossip_topics=[BLOCKS_TOPIC, TXS_TOPIC]))
        nursery = await stack.enter_async_context(trio.open_nursery())
        stack.callback(nursery.cancel_scope.cancel)
        service = await nursery.start(ChainService(db, host, now_ms).run)
        txs = await nursery.start(TxGossip(service).run)
        WalletDesk(service, txs).install()
        for other in swarm.servers:
            await host.connect(other.host.addrs[0])
        cashier = Cashier(ChainTabs(service, txs), node, price, tmp_path / f"tabs{i}",
                          poll_s=0.2)
        await nursery.start(cashier.run)
        announcer = Announcer(host, now_ms, interval=0.3)
        server = LayerServer(host, identity, announcer, now_ms,
                             ServeConfig(layers=span, price=price, sessions=sessions),
                             reader=reader, cashier=cashier, node_key=node.public)
        announcer.make_announce = server.announce
        await nursery.start(announcer.run)
        await nursery.start(server.run)
        producer = Producer(service, node, now_ms, interval_ms=interval_ms)
        await nursery.start(producer.run)
        swarm.servers.append(SimpleNamespace(host=host, db=db, service=service, txs=txs,
                                             cashier=cashier, server=server, node=node,
                                             producer=producer,
                                             wallet=net.wallets[i], price=price, span=span,
                                             nursery=nursery, announcer=announcer))
    # The entry server knows every announcement (a client asks it for its view).
    await eventually(lambda: len(swarm.servers[0].announcer.fresh()) == len(spans),
                     "the announcements to spread", limit=20)
    return swarm


def payer_with(tab_class: type) -> type[Payer]:
    """A `Payer` whose tabs are ``tab_class`` (a `wallet.payer.ClientTab` that cheats)."""
    class CheatingPayer(Payer):
        def open_tab(self, hops, servers, positions):
            tab = Payer.open_tab(self, hops, servers, positions)
            if tab is not None:
                self.tabs[-1] = tab = tab_class(tab.tab, tab.key, tab.lane_of, tab.bids,
                                                tab.amounts)
            return tab
    return CheatingPayer

