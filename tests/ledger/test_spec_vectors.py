"""The test vectors printed in specs/ledger.md, Appendix A, recomputed from the code.

If this fails, the spec and the code disagree: fix one of them.
"""

from __future__ import annotations

import re
from pathlib import Path

from ledger import merkle
from ledger.codec import encode, encode_unsigned
from ledger.crypto import SigningKey, is_weak_public_key
from ledger.state import state_root
from ledger.types import ZERO_SIG, Transfer, UnitTemplate, sign, tx_hash, unit_id
from ledger.schedule import tiebreak
from tests.ledger.chainkit import make_net, new_db

SPEC = (Path(__file__).resolve().parents[2] / "specs" / "ledger.md").read_text()
APPENDIX = SPEC[SPEC.index("## Appendix A"):]


def key(i: int) -> SigningKey:
    return SigningKey(i.to_bytes(4, "big") * 8)


def spec_value(label: str) -> str:
    """The first 32-byte hex value after ``label`` in the appendix."""
    match = re.search(re.escape(label) + r".*?(?<![0-9a-f])([0-9a-f]{64})(?![0-9a-f])",
                      APPENDIX, re.S)
    assert match, f"no vector for {label!r} in the spec"
    return match.group(1)


def test_transfer_vector():
    tx = sign(Transfer("pnode-test", key(300).public, key(301).public, 7_000_000, 0, ZERO_SIG),
              key(300))
    assert spec_value("tx_hash") == tx_hash(tx).hex()
    assert spec_value("txs_root([tx])") == merkle.merkle_root([encode(tx)]).hex()
    assert tx.signature.hex()[:64] == spec_value("signature")
    unsigned = "".join(APPENDIX.split("encode_unsigned = ")[1].split("signature")[0].split())
    assert encode_unsigned(tx).hex() == unsigned


def test_unit_tiebreak_and_merkle_vectors():
    uid = unit_id(bytes(32), 0, UnitTemplate(0, 0, 30, 0, 0)).hex()
    assert re.search(r"`unit_id\(32 zero bytes, 0, UnitTemplate\(0, 0, 30, 0, 0\)\)`.*?id\s+`"
                     + uid + "`", APPENDIX, re.S)
    assert spec_value("tiebreak(32 zero bytes, key(300).public) =") == \
        tiebreak(bytes(32), key(300).public).hex()
    assert spec_value("MTH([00, 01, 02])") == merkle.merkle_root([b"\0", b"\1", b"\2"]).hex()


def test_genesis_vector():
    db = new_db(make_net(with_job=True))
    assert spec_value("state root") == state_root(db.state).hex()
    assert spec_value("block 0 hash") == db.tip_hash.hex()


def test_weak_key_vectors():
    block = APPENDIX.split("the eight small-order points")[1].split("```")[1]
    points = re.findall(r"^([0-9a-f]{64})", block, re.M)
    assert len(points) == 8
    assert all(is_weak_public_key(bytes.fromhex(p)) for p in points)
    mixed = spec_value("the order-8 point `c717…037a` =")
    assert not is_weak_public_key(bytes.fromhex(mixed))
