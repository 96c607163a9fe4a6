"""wallet.client.directory: the client's swarm view, its exclusions, addresses and routes.

No network: announcements are signed here and put in the directory's view
directly, as `SwarmDirectory.refresh` would after asking a peer.
"""

from __future__ import annotations

import pytest
import trio

from node.clock import now_ms
from node.wire.serve import Announce, sign_announce
from tests.node.netkit import ident
from wallet.client.directory import SwarmDirectory
from wallet.errors import NoRoute
from wallet.client.route import Hop

MODEL = "model"


def announce(n: int, start: int, end: int, *, model: str = MODEL, load: int = 0,
             addrs: tuple[str, ...] | None = None) -> Announce:
    me = ident(n)
    if addrs is None:
        addrs = (f"/ip4/127.0.0.1/tcp/{4000 + n}/p2p/{me.peer_id}",)
    unsigned = Announce(me.public_key, bytes(32), addrs, model, start, end, 10_000, load, 8, 128,
                        2048, 0, now_ms(), bytes(64))
    return sign_announce(unsigned, me.key_pair.private_key.sign)


def directory_of(*announces: Announce, trusted=None) -> SwarmDirectory:
    """A directory (no host: nothing here dials) whose view holds ``announces``."""
    directory = SwarmDirectory(None, MODEL, trusted=trusted)
    for a in announces:
        assert directory.view.add(a, trio.current_time(), now_ms())
    return directory


def peer(n: int) -> str:
    return str(ident(n).peer_id)


def in_trio(test):
    """Run ``test`` (sync) inside trio: the view ages by ``trio.current_time``."""
    def wrapper():
        async def main():
            test()
        trio.run(main)
    wrapper.__name__ = test.__name__
    return wrapper


@in_trio
def test_addresses_are_only_those_naming_the_peer_itself():
    own = f"/ip4/10.0.0.1/tcp/1/p2p/{peer(1)}"
    other = f"/ip4/10.0.0.2/tcp/1/p2p/{peer(2)}"  # would send the client to someone else
    directory = directory_of(announce(1, 0, 30, addrs=(own, other, "/ip4/10.0.0.3/tcp/1")))
    assert directory.addrs(peer(1)) == (own,)
    assert directory.addrs(peer(2)) == ()  # not announced: unknown


@in_trio
def test_servers_are_this_models_only():
    directory = directory_of(announce(1, 0, 10), announce(2, 0, 30, model="other"))
    assert [s.peer_id for s in directory.servers()] == [peer(1)]
    assert directory.throughput(peer(1)) == 10.0
    assert directory.throughput(peer(2)) == 1.0  # unknown here: the slow default


@in_trio
def test_an_excluded_server_is_routed_around_until_exclusions_are_cleared():
    whole, a, b = announce(1, 0, 30), announce(2, 0, 15), announce(3, 15, 30)
    directory = directory_of(whole, a, b)
    assert directory.plan(0, 30) == [Hop(peer(1), 0, 30)]  # one hop beats two
    directory.exclude(peer(1))
    assert directory.plan(0, 30) == [Hop(peer(2), 0, 15), Hop(peer(3), 15, 30)]
    with pytest.raises(NoRoute, match="layer 15"):
        directory.plan(0, 30, also_exclude={peer(3)})
    assert directory.plan(0, 30) == [Hop(peer(2), 0, 15), Hop(peer(3), 15, 30)]  # once only
    directory.clear_exclusions()
    assert directory.plan(0, 30) == [Hop(peer(1), 0, 30)]


@in_trio
def test_only_trusted_peers_are_planned():
    directory = directory_of(announce(1, 0, 30), announce(2, 0, 30), trusted={peer(2)})
    assert directory.plan(0, 30) == [Hop(peer(2), 0, 30)]
    directory.exclude(peer(2))
    with pytest.raises(NoRoute, match="only trusted peers"):
        directory.plan(0, 30)


@in_trio
def test_a_full_server_counts_as_full_only_while_not_excluded():
    full = announce(1, 0, 30, load=8)  # load == max_sessions: it answers busy
    directory = directory_of(full)
    assert directory.announced_full(10, 20)
    assert not directory.announced_full(30, 40)  # outside its span
    directory.exclude(peer(1))
    assert not directory.announced_full(10, 20)
