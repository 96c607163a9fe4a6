"""`Register` binds a peer id only with the peer key's own signature (issue 15).

Clients route inference only through peer ids bound on the chain, so an
account must not be able to bind a peer id whose key it does not hold.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ledger import crypto
from ledger import errors as E
from ledger.codec import encode
from ledger.crypto import SigningKey, libp2p_peer_id, peer_public_key
from ledger.rules import bonded_nodes, candidates
from ledger.state import NODE, Overlay
from ledger.types import (
    COIN, ZERO_SIG, Binding, binding_signature, peer_binding_ok, peer_binding_signature, sign,
)
from tests.ledger.chainkit import (
    CHAIN, grow, key, make_net, new_db, next_block, peer_key, registration,
)
from tests.ledger.test_transition import check, with_txs


@pytest.fixture
def chain():
    net = make_net()
    return net, new_db(net)


def refused(db, net, reg, error=E.BadRegistration, match="peer signature"):
    with pytest.raises(error, match=match):
        check(db, with_txs(next_block(db, net).block, net, [reg]))


# -- the peer id and its key ------------------------------------------------------------


def test_peer_public_key_inverts_libp2p_peer_id():
    public = key(7).public
    assert peer_public_key(libp2p_peer_id(public)) == public


@pytest.mark.parametrize("peer_id", [
    b"", b"peer-12345678",
    libp2p_peer_id(key(7).public)[:-1],                    # one byte short
    libp2p_peer_id(key(7).public) + b"\0",                 # one byte long
    b"\x12\x20" + bytes(32),                               # a sha2-256 peer id (RSA keys)
    b"\x00\x24\x08\x02\x12\x20" + bytes(32),               # a secp256k1 key type
])
def test_peer_public_key_refuses_a_peer_id_without_an_inlined_ed25519_key(peer_id):
    with pytest.raises(E.PeerIdError, match="inlined Ed25519"):
        peer_public_key(peer_id)
    assert issubclass(E.PeerIdError, E.LedgerError) and issubclass(E.PeerIdError, ValueError)


def test_the_peer_key_signs_under_its_own_domain():
    """A node-key binding signature is no peer signature, even with one key as both."""
    wallet, node = key(300), key(301)
    reg = registration(wallet, node, peer=node)  # node key == peer key
    assert peer_binding_ok(reg)
    assert reg.peer_signature == peer_binding_signature(node, CHAIN, wallet.public, node.public)
    node_sig = binding_signature(node, CHAIN, wallet.public, reg.peer_id)
    assert not peer_binding_ok(replace(reg, peer_signature=node_sig))
    assert crypto.S_BIND_PEER != crypto.S_BIND


# -- the rule ---------------------------------------------------------------------------


def test_a_registration_with_its_peer_signature_is_accepted(chain):
    net, db = chain
    wallet, node = net.users
    peer = SigningKey(bytes(range(32)))
    grow(db, net, 1, [registration(wallet, node, peer=peer)])
    assert db.state.get(NODE + node.public).peer_id == libp2p_peer_id(peer.public)


@pytest.mark.parametrize("how", ["absent", "forged", "another peer key"])
def test_a_registration_without_the_peer_keys_signature_is_refused(chain, how):
    net, db = chain
    wallet, node = net.users
    reg = registration(wallet, node)
    if how == "absent":
        bad = ZERO_SIG
    elif how == "forged":
        bad = bytes(reg.peer_signature[:32]) + bytes(reversed(reg.peer_signature[32:]))
    else:  # a real signature of the same binding, by a key that is not the peer id's
        other = SigningKey(b"\x42" * 32)
        bad = other.sign(crypto.S_BIND_PEER, _binding(reg))
    forged = sign(replace(reg, peer_signature=bad), wallet)  # the wallet re-signs the whole
    refused(db, net, forged)


def test_an_account_cannot_claim_another_nodes_peer_id(chain):
    """The attack: bind node 0's peer id to a rogue account and node key."""
    net, db = chain
    rogue_wallet, rogue_node = net.users
    victim = db.state.get(NODE + net.nodes[0].public).peer_id
    assert victim == libp2p_peer_id(peer_key(net.nodes[0]).public)
    honest = registration(rogue_wallet, rogue_node)
    # Signed with the rogue's own key: not the key inside the victim's peer id.
    claim = replace(honest, peer_id=victim,
                    node_signature=binding_signature(rogue_node, CHAIN, rogue_wallet.public,
                                                     victim),
                    peer_signature=rogue_node.sign(crypto.S_BIND_PEER, _binding(
                        replace(honest, peer_id=victim))))
    refused(db, net, sign(claim, rogue_wallet))
    # Nor can the victim's own binding (from its genesis Register) be replayed:
    # it names the victim's account and node key.
    genesis_reg = next(r for r in net.genesis.registrations
                       if r.node_key == net.nodes[0].public)
    replayed = replace(claim, peer_signature=genesis_reg.peer_signature)
    refused(db, net, sign(replayed, rogue_wallet))


def test_a_peer_id_without_an_ed25519_key_cannot_be_bound(chain):
    net, db = chain
    wallet, node = net.users
    reg = registration(wallet, node)
    odd = b"peer-" + node.public[:8]
    bad = replace(reg, peer_id=odd,
                  node_signature=binding_signature(node, CHAIN, wallet.public, odd))
    refused(db, net, sign(bad, wallet), match="inlined Ed25519")


def test_the_node_signature_is_still_checked_first(chain):
    net, db = chain
    wallet, node = net.users
    reg = registration(wallet, node)
    refused(db, net, sign(replace(reg, node_signature=ZERO_SIG), wallet),
            error=E.BadSignature, match="node key")


# -- the bonded nodes ---------------------------------------------------------------------


def test_bonded_nodes_are_the_schedules_candidates(chain):
    net, db = chain
    grow(db, net, 1, [registration(net.users[0], net.users[1], bond=12 * COIN)])
    nodes = bonded_nodes(Overlay(db.state))
    assert [k for k, _, _ in nodes] == [c.node_key for c in candidates(Overlay(db.state))]
    assert sorted(k for k, _, _ in nodes) == sorted(
        [n.public for n in net.nodes] + [net.users[1].public])
    by_key = {k: (record, account) for k, record, account in nodes}
    record, account = by_key[net.users[1].public]
    assert record.account == net.users[0].public and account.bond == 12 * COIN


def _binding(reg) -> bytes:
    """The bytes both binding signatures of ``reg`` cover."""
    return encode(Binding(reg.chain_id, reg.account, reg.node_key, reg.peer_id))
