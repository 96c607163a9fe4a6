"""The canonical codec: round trips, and strict rejection of everything else."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from ledger import codec
from ledger.codec import decode, encode, from_json, to_json
from ledger.errors import DecodeError, EncodeError
from ledger.tab import Claim, Lane, OpenTab, TabRecord, Voucher
from ledger.types import COIN, ZERO_SIG, Block, Header, Job, Register, Transfer, UnitTemplate

b32 = st.binary(min_size=32, max_size=32)
b64 = st.binary(min_size=64, max_size=64)
u64 = st.integers(0, 2**64 - 1)
u32 = st.integers(0, 2**32 - 1)
chain = st.text(max_size=64).filter(lambda s: len(s.encode("utf-8")) <= 64)

transfers = st.builds(Transfer, chain, b32, b32, u64, u64, b64)
templates = st.builds(UnitTemplate, st.integers(0, 255), u32, u32, u32, u32)
jobs = st.builds(Job, chain, b32, b32, b32, b32, st.binary(max_size=300), u64,
                 st.lists(templates, max_size=5).map(tuple), u64, u64, b64)
lanes = st.lists(st.builds(Lane, b32, u64), max_size=4).map(tuple)
tabs = st.builds(OpenTab, chain, b32, b32, lanes, u64, u64, b64)
vouchers = st.builds(Voucher, chain, b32, st.lists(u64, max_size=4).map(tuple), b64)
claims = st.builds(Claim, chain, b32, vouchers, st.booleans(), b64)
registers = st.builds(Register, chain, b32, b32, st.binary(max_size=64), u32, u32, u64, u64, b64, b64,
                      b64)
txs = st.one_of(transfers, jobs, tabs, claims, registers)
b80 = st.binary(min_size=80, max_size=80)
headers = st.builds(Header, chain, u64, b32, u64, b32, b80, b32, b32, u64, b32, b64)
blocks = st.builds(Block, headers, st.lists(txs, max_size=4).map(tuple))


@given(st.builds(TabRecord, b32, b32, u64, lanes, st.lists(b32, max_size=4).map(tuple),
                 st.lists(u64, max_size=4).map(tuple),
                 st.lists(st.booleans(), max_size=4).map(tuple)))
def test_tab_records_round_trip(record):
    assert decode(encode(record), TabRecord) == record


@given(blocks)
def test_round_trip(block):
    data = encode(block)
    assert decode(data, Block) == block
    assert decode(data) == block


@given(blocks)
def test_json_round_trip(block):
    assert from_json(to_json(block), Block) == block


@settings(max_examples=500)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_raise_only_decode_error(data):
    try:
        decode(data)
    except DecodeError:
        pass


@given(blocks, st.data())
def test_truncated_or_extended_encodings_are_rejected(block, data):
    raw = encode(block)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(DecodeError):
        decode(raw[:cut])
    with pytest.raises(DecodeError):
        decode(raw + data.draw(st.binary(min_size=1, max_size=8)))


@given(transfers, st.data())
def test_single_byte_corruption_never_escapes_decode_error(tx, data):
    raw = bytearray(encode(tx))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    try:
        decoded = decode(bytes(raw))
    except DecodeError:
        return
    assert encode(decoded) == bytes(raw)  # anything accepted is canonical


def _transfer() -> Transfer:
    return Transfer("c", b"\x01" * 32, b"\x02" * 32, 5 * COIN, 3, ZERO_SIG)


def _raw(plain) -> bytes:
    return msgpack.packb(plain, use_bin_type=True)


def _plain() -> list:
    return list(msgpack.unpackb(encode(_transfer()), use_list=True))


@pytest.mark.parametrize("mutate, reason", [
    (lambda p: p.__setitem__(0, 999), "unknown type tag"),
    (lambda p: p.__setitem__(1, 2), "version"),
    (lambda p: p.append(b""), "fields"),
    (lambda p: p.pop(), "fields"),
    (lambda p: p.__setitem__(2, b"c"), "expected str"),
    (lambda p: p.__setitem__(3, b"\x01" * 31), "expected 32 bytes"),
    (lambda p: p.__setitem__(5, 1.5), "expected int"),
    (lambda p: p.__setitem__(5, -1), "outside"),
    (lambda p: p.__setitem__(5, True), "expected int"),
    (lambda p: p.__setitem__(6, None), "expected int"),
])
def test_malformed_fields_are_named(mutate, reason):
    plain = _plain()
    mutate(plain)
    with pytest.raises(DecodeError, match=reason):
        decode(_raw(plain))


def test_non_shortest_int_is_rejected():
    plain = _plain()  # [tag, version, chain_id, sender, recipient, amount, nonce, signature]
    nonce_as_uint64 = b"\xcf" + plain[6].to_bytes(8, "big")
    raw = bytes([0x90 | len(plain)]) + b"".join(_raw(v) for v in plain[:6]) \
        + nonce_as_uint64 + _raw(plain[7])
    assert msgpack.unpackb(raw, use_list=True) == plain  # same values, longer bytes
    with pytest.raises(DecodeError, match="canonical"):
        decode(raw)


def test_maps_ext_and_floats_are_rejected():
    for value in ({1: 2}, msgpack.ExtType(1, b"x"), 1.0):
        plain = _plain()
        plain[4] = value
        with pytest.raises(DecodeError):
            decode(_raw(plain))


def test_nested_bomb_is_rejected_quickly():
    with pytest.raises(DecodeError):
        decode(b"\x91" * 200_000 + b"\xc0")


def test_oversize_input_is_rejected():
    with pytest.raises(DecodeError, match="exceeds"):
        decode(b"\x00" * (codec.MAX_ENCODED_SIZE + 1))


def test_expected_type_is_enforced():
    with pytest.raises(DecodeError, match="expected Header"):
        decode(encode(_transfer()), Header)


def test_union_field_rejects_other_types():
    header = Header("c", 1, bytes(32), 0, bytes(32), bytes(80), bytes(32), bytes(32), 0, bytes(32),
                    ZERO_SIG)
    plain = list(msgpack.unpackb(encode(Block(header, (_transfer(),))), use_list=True))
    plain[3] = [list(msgpack.unpackb(encode(header), use_list=True))]  # a header among the txs
    with pytest.raises(DecodeError, match="expected Transfer"):
        decode(_raw(plain))


def test_non_bytes_input_is_a_decode_error():
    with pytest.raises(DecodeError):
        decode("not bytes")  # type: ignore[arg-type]


def test_encode_rejects_bad_field_values():
    with pytest.raises(EncodeError, match="32 bytes"):
        encode(Transfer("c", b"short", b"\x02" * 32, 1, 0, ZERO_SIG))
    with pytest.raises(EncodeError, match="outside"):
        encode(Transfer("c", b"\x01" * 32, b"\x02" * 32, 2**64, 0, ZERO_SIG))


def test_from_json_rejects_unknown_and_missing_fields():
    doc = to_json(_transfer())
    with pytest.raises(DecodeError, match="unexpected"):
        from_json({**doc, "extra": 1}, Transfer)
    del doc["nonce"]
    with pytest.raises(DecodeError, match="missing"):
        from_json(doc, Transfer)


@given(blocks)
def test_block_from_encoded_parts_is_byte_identical(block):
    from ledger.types import encode_block
    assert encode_block(block.header, [encode(t) for t in block.txs]) == encode(block)


@given(txs)
def test_unsigned_encoding_drops_exactly_the_signature(tx):
    unsigned = codec.encode_unsigned(tx)
    assert msgpack.unpackb(unsigned, use_list=False) == msgpack.unpackb(encode(tx), use_list=False)[:-1]
    assert codec.encode_unsigned(tx, encode(tx)) == unsigned


def test_text_limits_count_utf8_bytes():
    with pytest.raises(EncodeError, match="exceeds 64"):
        encode(Transfer("é" * 40, b"\x01" * 32, b"\x02" * 32, 1, 0, ZERO_SIG))  # 80 bytes
    with pytest.raises(EncodeError, match="UTF-8"):
        encode(Transfer("\ud800", b"\x01" * 32, b"\x02" * 32, 1, 0, ZERO_SIG))
