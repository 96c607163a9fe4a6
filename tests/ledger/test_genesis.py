"""The genesis builders: parameter presets, node registrations, new_genesis."""

from __future__ import annotations

import pytest

from ledger import errors as E
from ledger.chaindb import ChainDB
from ledger.codec import decode, encode
from ledger.crypto import SigningKey, libp2p_peer_id
from ledger.genesis import (
    DEFAULT_PARAMS, DEVNET_PARAMS, TEST_PARAMS, chain_params, new_genesis, node_registration,
)
from ledger.state import ACCOUNT, KEY_PARAMS, NODE
from ledger.store import MemoryStore
from ledger.transition import genesis_block
from ledger.types import COIN, Genesis, Params, binding_ok, peer_binding_ok, signature_ok

CHAIN = "pnode-genesis-test"


def key(i: int) -> SigningKey:
    return SigningKey(bytes([i]) * 32)


def one_node_genesis(preset=DEFAULT_PARAMS, chain_id=CHAIN, **overrides) -> Genesis:
    wallet, node, peer = key(1), key(2), key(3)
    reg = node_registration(chain_id, wallet, node, peer, (0, 30),
                            {**preset, **overrides}["min_bond"])
    return new_genesis(chain_id, 1_000, chain_params(preset, wallet.public, **overrides),
                       [(wallet.public, 100 * COIN)], [reg])


@pytest.mark.parametrize("preset", [DEFAULT_PARAMS, DEVNET_PARAMS, TEST_PARAMS])
def test_presets_are_params_that_start_a_chain(preset):
    params = chain_params(preset, key(1).public)
    assert decode(encode(params), Params) == params
    applied = genesis_block(one_node_genesis(preset))  # raises BadGenesis if params are invalid
    assert applied.writes[KEY_PARAMS] == params


def test_chain_params_overrides_replace_preset_fields():
    params = chain_params(DEVNET_PARAMS, key(1).public, slot_ms=7, job_authority=key(9).public)
    assert params.slot_ms == 7 and params.job_authority == key(9).public
    assert params.challenge_window == DEVNET_PARAMS["challenge_window"]
    with pytest.raises(TypeError):
        chain_params(DEFAULT_PARAMS, key(1).public, no_such_field=1)


def test_presets_cannot_be_changed_in_place():
    with pytest.raises(TypeError):
        DEFAULT_PARAMS["slot_ms"] = 1  # type: ignore[index]


def test_node_registration_is_signed_and_bound():
    peer_id = libp2p_peer_id(key(3).public)
    reg = node_registration(CHAIN, key(1), key(2), key(3), (4, 8), 12 * COIN, nonce=5)
    assert (reg.account, reg.node_key, reg.peer_id) == (key(1).public, key(2).public, peer_id)
    assert (reg.layer_start, reg.layer_end, reg.bond, reg.nonce) == (4, 8, 12 * COIN, 5)
    assert signature_ok(reg) and binding_ok(reg) and peer_binding_ok(reg)


def test_new_genesis_is_deterministic():
    assert encode(one_node_genesis()) == encode(one_node_genesis())


def test_genesis_state_holds_the_registered_nodes():
    wallets, nodes = [key(10), key(11)], [key(20), key(21)]
    regs = [node_registration(CHAIN, w, n, n, span, 10 * COIN)
            for w, n, span in zip(wallets, nodes, [(0, 15), (15, 30)])]
    genesis = new_genesis(CHAIN, 1_000, chain_params(TEST_PARAMS, wallets[0].public),
                          [(w.public, 25 * COIN) for w in wallets], regs)
    with ChainDB.create(MemoryStore(), genesis) as db:
        assert db.height == 0 and db.chain_id == CHAIN
        for w, n, (start, end) in zip(wallets, nodes, [(0, 15), (15, 30)]):
            record = db.state.get(NODE + n.public)
            assert (record.account, record.layer_start, record.layer_end) == (w.public, start, end)
            assert record.peer_id == libp2p_peer_id(n.public)
            account = db.state.get(ACCOUNT + w.public)
            assert (account.balance, account.bond) == (15 * COIN, 10 * COIN)


def test_an_account_allocated_twice_is_refused():
    wallet = key(1)
    with pytest.raises(E.BadGenesis, match="allocated twice"):
        new_genesis(CHAIN, 0, chain_params(DEFAULT_PARAMS, wallet.public),
                    [(wallet.public, COIN), (wallet.public, COIN)])


def test_a_registration_for_another_chain_is_refused():
    wallet, node = key(1), key(2)
    reg = node_registration("other-chain", wallet, node, node, (0, 30), 10 * COIN)
    with pytest.raises(E.BadGenesis, match="other-chain"):
        new_genesis(CHAIN, 0, chain_params(DEFAULT_PARAMS, wallet.public),
                    [(wallet.public, 100 * COIN)], [reg])


def test_a_bond_under_the_minimum_cannot_start_a_chain():
    wallet, node = key(1), key(2)
    reg = node_registration(CHAIN, wallet, node, node, (0, 30), COIN)  # min_bond is 10
    genesis = new_genesis(CHAIN, 0, chain_params(DEFAULT_PARAMS, wallet.public),
                          [(wallet.public, 100 * COIN)], [reg])
    with pytest.raises(E.BadGenesis):
        ChainDB.create(MemoryStore(), genesis)
