"""Routing only through servers registered on the chain (issue 15): the directory's filter.

No network: announcements are signed here and put in the directory's view
directly (as in tests/wallet/client/test_directory.py). The same over real hosts
and the real model: tests/wallet/client/test_remote_registry.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import trio

from node.clock import now_ms
from node.wire.serve import sign_announce
from tests.node.netkit import ident
from tests.wallet.client.test_directory import MODEL, announce, in_trio, peer
from wallet.client.directory import SwarmDirectory
from wallet.errors import NoRoute, WalletError
from wallet.registry import RegisteredNode, RegistryError, registry_from_view
from wallet.client.route import Hop

UNREGISTERED = ("layer {} is served only by servers not registered on the chain; "
                "pass --allow-unregistered for a private swarm")


def fast(n: int, start: int, end: int, tokens_per_s: float = 1e6):
    """An announcement of ``n`` claiming a huge throughput (the cheapest route by far)."""
    a = replace(announce(n, start, end), throughput_milli=int(tokens_per_s * 1000),
                signature=bytes(64))
    return sign_announce(a, ident(n).key_pair.private_key.sign)


def registry(*ns: int) -> dict[str, RegisteredNode]:
    return {peer(n): RegisteredNode(peer(n), bytes([n]) * 32, bytes([n]) * 32, 10, (0, 30))
            for n in ns}


def directory_of(*announces, trusted=None, registered=None) -> SwarmDirectory:
    directory = SwarmDirectory(None, MODEL, trusted=trusted, registered=registered)
    for a in announces:
        assert directory.view.add(a, trio.current_time(), now_ms())
    return directory


@in_trio
def test_an_unregistered_server_is_never_routed_through_however_fast_it_claims_to_be():
    directory = directory_of(announce(1, 0, 30), fast(2, 0, 30))
    assert directory.plan(0, 30) == [Hop(peer(2), 0, 30)]  # unfiltered: the stranger wins
    directory = directory_of(announce(1, 0, 30), fast(2, 0, 30), registered=registry(1))
    assert [s.peer_id for s in directory.servers()] == [peer(1)]
    assert {s.peer_id for s in directory.announced()} == {peer(1), peer(2)}
    assert directory.plan(0, 30) == [Hop(peer(1), 0, 30)]
    assert directory.throughput(peer(2)) == 1.0  # not a server of this client's: unknown


@in_trio
def test_a_layer_held_only_by_unregistered_servers_says_so():
    directory = directory_of(announce(1, 0, 10), fast(2, 10, 30), registered=registry(1))
    with pytest.raises(NoRoute, match=UNREGISTERED.format(10)) as refused:
        directory.plan(0, 30)
    assert refused.value.unregistered and (refused.value.first, refused.value.last) == (10, 29)
    # An empty registry (a chain with no bonded node): layer 0 already.
    with pytest.raises(NoRoute, match=UNREGISTERED.format(0)):
        directory_of(announce(1, 0, 30), registered={}).plan(0, 30)


@in_trio
def test_an_uncovered_layer_or_a_failed_registered_server_keeps_the_plain_message():
    directory = directory_of(announce(1, 0, 10), registered=registry(1))
    with pytest.raises(NoRoute, match="no usable server covers layer 10") as refused:
        directory.plan(0, 30)  # nobody holds 10..29: registering nothing would help
    assert not refused.value.unregistered
    directory = directory_of(announce(1, 0, 30), fast(2, 0, 30), registered=registry(1))
    directory.exclude(peer(1))  # the registered one failed: not a registration problem
    with pytest.raises(NoRoute, match="no usable server covers layer 0"):
        directory.plan(0, 30)


@in_trio
def test_trusted_peers_and_the_registry_both_apply():
    servers = announce(1, 0, 30), fast(2, 0, 30), announce(3, 0, 30)
    directory = directory_of(*servers, trusted={peer(1), peer(2)}, registered=registry(1, 3))
    assert directory.plan(0, 30) == [Hop(peer(1), 0, 30)]  # 2 unregistered, 3 untrusted
    directory = directory_of(*servers, trusted={peer(1), peer(2)}, registered=registry(3))
    with pytest.raises(NoRoute, match=UNREGISTERED.format(0) + "; only trusted peers"):
        directory.plan(0, 30)  # the trusted ones are not registered; 3 is not trusted


@in_trio
def test_without_a_registry_every_server_is_used():
    directory = directory_of(announce(1, 0, 15), fast(2, 15, 30))
    assert directory.registered is None
    assert directory.plan(0, 30) == [Hop(peer(1), 0, 15), Hop(peer(2), 15, 30)]


# -- the registry answer ----------------------------------------------------------------------


def test_registry_from_view_reads_the_registry_op_answer():
    view = {"chain_id": "c", "height": 3, "min_bond": 10, "nodes": [
        {"peer_id": peer(1), "node_key": "01" * 32, "account": "02" * 32, "bond": 12,
         "layers": [0, 30]}]}
    assert registry_from_view(view) == {
        peer(1): RegisteredNode(peer(1), b"\1" * 32, b"\2" * 32, 12, (0, 30))}
    assert registry_from_view({"nodes": []}) == {}


@pytest.mark.parametrize("view", [
    {}, {"nodes": None}, {"nodes": [{}]},
    {"nodes": [{"peer_id": "x", "node_key": "zz", "account": "", "bond": 1, "layers": [0, 1]}]},
    {"nodes": [{"peer_id": "x", "node_key": "", "account": "", "bond": 1, "layers": 5}]},
])
def test_a_malformed_registry_answer_is_a_wallet_error(view):
    with pytest.raises(RegistryError) as refused:
        registry_from_view(view)
    assert isinstance(refused.value, WalletError)
