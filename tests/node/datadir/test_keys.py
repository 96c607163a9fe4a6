"""Tests for node.datadir.keys: round trips, tampering, malformed input, files.

Which error tampering gives: a field that still parses (same-length hex,
valid cost) but was changed — ciphertext, nonce, salt, n, public_key — fails
the AEAD tag and raises WrongPassphraseError, since a wrong passphrase and
altered data are indistinguishable. A field that does not parse raises
KeyFileError naming it. Scrypt runs at n=2**10 except in one test.
"""

from __future__ import annotations

import copy
import json
import os
import stat

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt
from hypothesis import HealthCheck, given, settings, strategies as st

from node.errors import KeyFileError, WrongPassphraseError
from node.datadir.keys import (
    _parse, decrypt_seed, encrypt_seed, read_key_file, read_public_key, write_key_file,
)

FAST = 2**10
FIXTURE_REUSE = HealthCheck.function_scoped_fixture
SEED = bytes(range(32))
PUB = Ed25519PrivateKey.from_private_bytes(SEED).public_key().public_bytes_raw()


@pytest.fixture(scope="module")
def doc():
    return encrypt_seed(SEED, "correct horse", n=FAST)


def flip_hex(h: str, at: int = 0) -> str:
    raw = bytearray(bytes.fromhex(h))
    raw[at] ^= 0x01
    return raw.hex()


# -- round trip -------------------------------------------------------------


def test_round_trip(doc):
    assert decrypt_seed(doc, "correct horse") == SEED


def test_document_shape(doc):
    assert json.loads(json.dumps(doc)) == doc
    assert doc["version"] == "pnode-keystore-1"
    assert bytes.fromhex(doc["public_key"]) == PUB
    assert doc["kdf"] == {"name": "scrypt", "n": FAST, "r": 8, "p": 1, "salt": doc["kdf"]["salt"]}
    assert len(bytes.fromhex(doc["kdf"]["salt"])) == 16
    assert doc["cipher"]["name"] == "chacha20-poly1305"
    assert len(bytes.fromhex(doc["cipher"]["nonce"])) == 12
    assert len(bytes.fromhex(doc["ciphertext"])) == 48
    assert len(bytes.fromhex(doc["checksum"])) == 32
    assert SEED.hex() not in json.dumps(doc)


def test_salt_and_nonce_are_fresh():
    a, b = (encrypt_seed(SEED, "pw", n=FAST) for _ in range(2))
    assert a["kdf"]["salt"] != b["kdf"]["salt"]
    assert a["cipher"]["nonce"] != b["cipher"]["nonce"]


def test_default_cost_file_round_trip(tmp_path):
    path = tmp_path / "key.json"
    write_key_file(path, SEED, "pw")
    assert json.loads(path.read_text())["kdf"]["n"] == 2**15
    assert read_key_file(path, "pw") == SEED


@pytest.mark.parametrize(
    "passphrase",
    ["", "pässwörd", "пароль", "🔑 key 🔑", "a\x00b", "x" * 1000],
    ids=ascii,
)
def test_unicode_passphrases(passphrase):
    d = encrypt_seed(SEED, passphrase, n=FAST)
    assert decrypt_seed(d, passphrase) == SEED
    with pytest.raises(WrongPassphraseError):
        decrypt_seed(d, passphrase + " ")


def test_composed_and_decomposed_accents_are_one_passphrase():
    d = encrypt_seed(SEED, "caf\u00e9", n=FAST)
    assert decrypt_seed(d, "cafe\u0301") == SEED


@settings(max_examples=25, deadline=None)
@given(seed=st.binary(min_size=32, max_size=32), passphrase=st.text(max_size=20))
def test_round_trip_property(seed, passphrase):
    assert decrypt_seed(encrypt_seed(seed, passphrase, n=FAST), passphrase) == seed


# -- wrong passphrase and tampering -----------------------------------------


def test_wrong_passphrase(doc):
    with pytest.raises(WrongPassphraseError, match="^wrong passphrase for key file$"):
        decrypt_seed(doc, "Correct horse")


def _swap_public_key(d):
    other = Ed25519PrivateKey.from_private_bytes(b"\x07" * 32).public_key()
    d["public_key"] = other.public_bytes_raw().hex()


TAMPERS = [
    lambda d: d.update(ciphertext=flip_hex(d["ciphertext"], 5)),
    lambda d: d.update(ciphertext=flip_hex(d["ciphertext"], 40)),  # the tag
    lambda d: d["cipher"].update(nonce=flip_hex(d["cipher"]["nonce"])),
    lambda d: d["kdf"].update(salt=flip_hex(d["kdf"]["salt"])),
    lambda d: d["kdf"].update(n=FAST * 2),
    lambda d: d.update(public_key=flip_hex(d["public_key"])),
    _swap_public_key,
]
TAMPER_IDS = ["ciphertext", "tag", "nonce", "salt", "kdf-n", "public-key-bit", "public-key-swap"]


def redo_checksum(d):
    """What a forger does: recompute the checksum over the edited fields."""
    d.pop("checksum", None)
    d["checksum"] = _parse(d).checksum().hex()


@pytest.mark.parametrize("tamper", TAMPERS, ids=TAMPER_IDS)
def test_a_damaged_file_is_not_a_wrong_passphrase(doc, tamper):
    d = copy.deepcopy(doc)
    tamper(d)
    # Whatever the passphrase: the checksum is checked before the key is derived.
    for passphrase in ("correct horse", "anything"):
        with pytest.raises(KeyFileError, match="key file is damaged"):
            decrypt_seed(d, passphrase)


@pytest.mark.parametrize("tamper", TAMPERS, ids=TAMPER_IDS)
def test_tampering_with_the_checksum_redone_fails_authentication(doc, tamper):
    # A forger can recompute the checksum; the AEAD tag still refuses the file.
    d = copy.deepcopy(doc)
    tamper(d)
    redo_checksum(d)
    with pytest.raises(WrongPassphraseError):
        decrypt_seed(d, "correct horse")


@pytest.mark.parametrize("tamper", TAMPERS, ids=TAMPER_IDS)
def test_a_file_without_checksum_still_opens_and_cannot_tell(doc, tamper):
    # Files written before checksums: still read; damage looks like a wrong passphrase.
    old = copy.deepcopy(doc)
    del old["checksum"]
    assert decrypt_seed(old, "correct horse") == SEED
    tamper(old)
    with pytest.raises(WrongPassphraseError):
        decrypt_seed(old, "correct horse")


def test_a_damaged_checksum_says_damaged(doc):
    d = copy.deepcopy(doc)
    d["checksum"] = flip_hex(d["checksum"], 3)
    with pytest.raises(KeyFileError, match="key file is damaged"):
        decrypt_seed(d, "correct horse")


def test_public_key_not_matching_sealed_seed(doc):
    # A forger who knows the passphrase seals a different seed under PUB.
    d = copy.deepcopy(doc)
    salt, nonce = bytes.fromhex(d["kdf"]["salt"]), bytes.fromhex(d["cipher"]["nonce"])
    key = Scrypt(salt=salt, length=32, n=FAST, r=8, p=1).derive(b"correct horse")
    sealed = ChaCha20Poly1305(key).encrypt(nonce, b"\x09" * 32, b"pnode-keystore-1" + PUB)
    d["ciphertext"] = sealed.hex()
    redo_checksum(d)
    with pytest.raises(KeyFileError, match="public_key"):
        decrypt_seed(d, "correct horse")


# -- malformed documents ----------------------------------------------------


def _set(path: str, value):
    def edit(d):
        *parents, last = path.split(".")
        target = d
        for p in parents:
            target = target[p]
        if value is _DELETE:
            del target[last]
        else:
            target[last] = value

    return edit


_DELETE = object()
_FIELDS = ["version", "public_key", "kdf", "kdf.name", "kdf.n", "kdf.r", "kdf.p", "kdf.salt",
           "cipher", "cipher.name", "cipher.nonce", "ciphertext"]


@pytest.mark.parametrize(
    "edit, field",
    [(_set(f, _DELETE), f) for f in _FIELDS]
    + [
        (_set("version", "pnode-keystore-2"), "version"),
        (_set("public_key", "zz" * 32), "public_key"),
        (_set("public_key", "00" * 31), "public_key"),
        (_set("public_key", " " + "00" * 32), "public_key"),
        (_set("public_key", 5), "public_key"),
        (_set("kdf", []), "kdf"),
        (_set("kdf.name", "argon2id"), "kdf.name"),
        (_set("kdf.n", 1000), "kdf.n"),
        (_set("kdf.n", 1), "kdf.n"),
        (_set("kdf.n", 2**21), "kdf.n"),
        (_set("kdf.n", float(FAST)), "kdf.n"),
        (_set("kdf.n", True), "kdf.n"),
        (_set("kdf.r", 0), "kdf.r"),
        (_set("kdf.p", 10**6), "kdf.p"),
        (_set("kdf.p", 16), "kdf"),  # each bound holds, the product does not...
        (_set("kdf.salt", "00" * 15), "kdf.salt"),
        (_set("cipher", "chacha"), "cipher"),
        (_set("cipher.name", "aes-gcm"), "cipher.name"),
        (_set("cipher.nonce", "00" * 24), "cipher.nonce"),
        (_set("ciphertext", "00" * 32), "ciphertext"),
        (_set("ciphertext", None), "ciphertext"),
    ],
)
def test_malformed_document_names_field(doc, edit, field):
    d = copy.deepcopy(doc)
    if field == "kdf":  # ...so make n big enough for the product to matter
        d["kdf"]["n"] = 2**20
    edit(d)
    with pytest.raises(KeyFileError, match=field.split(".")[-1]):
        decrypt_seed(d, "correct horse")


@pytest.mark.parametrize("value", [None, [], "text", 3, [{"version": "pnode-keystore-1"}]])
def test_non_object_document(value):
    with pytest.raises(KeyFileError):
        decrypt_seed(value, "pw")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(value=JSON)
def test_random_json_only_raises_keyfile_error(value):
    with pytest.raises(KeyFileError):
        decrypt_seed(value, "pw")


# `doc` is read-only here, so sharing it between examples is safe.
@settings(max_examples=200, deadline=None, suppress_health_check=[FIXTURE_REUSE])
@given(
    field=st.sampled_from(_FIELDS),
    value=JSON | st.integers(1, 2**16) | st.sampled_from(["00" * 16, "00" * 12]),
)
def test_mutated_document_only_raises_wallet_errors(doc, field, value):
    d = copy.deepcopy(doc)
    _set(field, value)(d)
    if json.dumps(d, sort_keys=True) == json.dumps(doc, sort_keys=True):  # 1.0 != 1 here
        assert decrypt_seed(d, "correct horse") == SEED
        return
    with pytest.raises((KeyFileError, WrongPassphraseError)):
        decrypt_seed(d, "correct horse")


# -- encrypt_seed arguments -------------------------------------------------


@pytest.mark.parametrize(
    "seed, passphrase, n, error",
    [
        (SEED[:31], "pw", FAST, ValueError),
        (SEED + b"\x00", "pw", FAST, ValueError),
        (SEED.hex(), "pw", FAST, TypeError),
        (SEED, b"pw", FAST, TypeError),
        (SEED, "\ud800", FAST, ValueError),
        (SEED, "pw", 1000, ValueError),
        (SEED, "pw", 2**21, ValueError),
    ],
)
def test_encrypt_seed_rejects_bad_arguments(seed, passphrase, n, error):
    with pytest.raises(error):
        encrypt_seed(seed, passphrase, n=n)


# -- files ------------------------------------------------------------------


def test_file_round_trip_and_public_key(tmp_path):
    path = tmp_path / "key.json"
    write_key_file(str(path), SEED, "pw", n=FAST)
    assert read_key_file(path, "pw") == SEED
    assert read_public_key(path) == PUB
    with pytest.raises(WrongPassphraseError):
        read_key_file(path, "wrong")
    assert os.listdir(tmp_path) == ["key.json"]  # no temp file left behind


def test_file_mode_is_0600_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        write_key_file(tmp_path / "key.json", SEED, "pw", n=FAST)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "key.json").st_mode) == 0o600


def test_refuses_to_overwrite(tmp_path):
    path = tmp_path / "key.json"
    path.write_text("precious")
    with pytest.raises(KeyFileError, match="exists"):
        write_key_file(path, SEED, "pw", n=FAST)
    assert path.read_text() == "precious"
    assert os.listdir(tmp_path) == ["key.json"]


def test_without_hard_links_still_writes_and_refuses(tmp_path, monkeypatch):
    def no_link(src, dst):
        raise PermissionError("hard links not supported")

    monkeypatch.setattr(os, "link", no_link)
    path = tmp_path / "key.json"
    write_key_file(path, SEED, "pw", n=FAST)
    assert read_key_file(path, "pw") == SEED
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with pytest.raises(KeyFileError, match="exists"):
        write_key_file(path, SEED, "pw", n=FAST)


def test_unwritable_location(tmp_path):
    with pytest.raises(KeyFileError, match="nowhere"):
        write_key_file(tmp_path / "nowhere" / "key.json", SEED, "pw", n=FAST)


@pytest.mark.parametrize(
    "content",
    [None, b"", b"{not json", b"\xff\xfe", b"[1, 2]", b"[" * 50_000, b" " * (65 * 1024), b"{}"],
    ids=["missing", "empty", "bad-json", "bad-utf8", "array", "deep", "huge", "empty-object"],
)
@pytest.mark.parametrize(
    "reader", [lambda p: read_key_file(p, "pw"), read_public_key], ids=["key", "public"]
)
def test_bad_files_raise_keyfile_error_naming_path(tmp_path, content, reader):
    path = tmp_path / "key.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(KeyFileError, match=str(tmp_path)):
        reader(path)


def test_directory_is_not_a_key_file(tmp_path):
    with pytest.raises(KeyFileError, match=str(tmp_path)):
        read_key_file(tmp_path, "pw")


@settings(max_examples=100, deadline=None, suppress_health_check=[FIXTURE_REUSE])
@given(content=st.binary(max_size=200))
def test_random_file_bytes_only_raise_keyfile_error(tmp_path, content):
    path = tmp_path / "random.json"
    path.write_bytes(content)
    with pytest.raises(KeyFileError):
        read_key_file(path, "pw")
