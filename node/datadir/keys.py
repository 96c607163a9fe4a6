"""Every key file of a data dir: hex seed files (node key, peer key) and encrypted wallet keys.

Seed files hold a 32-byte Ed25519 seed in hex, mode 0600, written atomically
(`write_private`). This module also owns the "pnode-keystore-1" format: an Ed25519 private seed
encrypted with ChaCha20-Poly1305 under a key stretched from a passphrase by
scrypt, stored as JSON beside the public key. It never prompts and never reads
the environment; where the passphrase comes from is the CLI's business.

Passphrases are NFC-normalised before UTF-8 encoding, so the same text typed
on systems that compose accents differently opens the same file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from ledger.crypto import SigningKey
from node.errors import DataDirError, KeyFileError, WrongPassphraseError

VERSION, KDF_NAME, CIPHER_NAME = "pnode-keystore-1", "scrypt", "chacha20-poly1305"
DEFAULT_N, R, P = 2**15, 8, 1
SEED_LEN = KEY_LEN = PUBLIC_KEY_LEN = 32
SALT_LEN, NONCE_LEN, TAG_LEN, CHECKSUM_LEN = 16, 12, 16, 32
# A file names its own cost, so it could ask for gigabytes: cap what we obey.
MAX_N, MAX_R, MAX_P = 2**20, 32, 16
# n * r * p bounds both time and memory (128 * n * r bytes, 1 GiB here);
# the default 2**15 * 8 * 1 is 2**18.
MAX_SCRYPT_WORK = 2**23
MAX_FILE_SIZE = 64 * 1024  # a key file is under 1 KiB

StrPath = str | os.PathLike[str]
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})*")


@dataclass(frozen=True, slots=True)
class _Envelope:
    """A parsed, validated key file; nothing in it has been decrypted."""

    public_key: bytes
    n: int
    r: int
    p: int
    salt: bytes
    nonce: bytes
    ciphertext: bytes

    def to_doc(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "public_key": self.public_key.hex(),
            "kdf": {
                "name": KDF_NAME, "n": self.n, "r": self.r, "p": self.p, "salt": self.salt.hex()
            },
            "cipher": {"name": CIPHER_NAME, "nonce": self.nonce.hex()},
            "ciphertext": self.ciphertext.hex(),
            "checksum": self.checksum().hex(),
        }

    def checksum(self) -> bytes:
        """SHA-256 of every other field: tells a damaged file from a wrong passphrase.

        It keeps nothing secret (all of it is public in the file) and proves
        nothing against a forger, who can recompute it; the AEAD tag does that.
        """
        h = hashlib.sha256(VERSION.encode("ascii"))
        for part in (self.public_key, self.salt, self.nonce, self.ciphertext):
            h.update(len(part).to_bytes(2, "big") + part)
        h.update(b"".join(v.to_bytes(4, "big") for v in (self.n, self.r, self.p)))
        return h.digest()


def _check_kdf(n: object, r: object, p: object) -> str | None:
    """Return what is wrong with scrypt parameters, or None when sane."""
    for name, value, top in (("n", n, MAX_N), ("r", r, MAX_R), ("p", p, MAX_P)):
        # bool is an int subclass, and `true` is no cost parameter.
        if type(value) is not int or not 1 <= value <= top:
            return f"kdf.{name} must be an integer in 1..{top}, not {value!r}"
    if n < 2 or n & (n - 1):
        return f"kdf.n must be a power of two >= 2, not {n}"
    if n * r * p > MAX_SCRYPT_WORK:
        return f"kdf n*r*p = {n * r * p} is above the limit of {MAX_SCRYPT_WORK}"
    return None


def _public_key(seed: bytes) -> bytes:
    return Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw()


def _derive(passphrase: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    if not isinstance(passphrase, str):
        raise TypeError(f"passphrase must be str, not {type(passphrase).__name__}")
    try:
        secret = unicodedata.normalize("NFC", passphrase).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("passphrase is not valid Unicode (lone surrogate)") from None
    return Scrypt(salt=salt, length=KEY_LEN, n=n, r=r, p=p).derive(secret)


def _aad(public_key: bytes) -> bytes:
    # Binding the public key means a swapped public_key fails the tag check.
    return VERSION.encode("ascii") + public_key


def encrypt_seed(seed: bytes, passphrase: str, *, n: int = DEFAULT_N) -> dict[str, Any]:
    """Encrypt an Ed25519 seed into a key-file document.

    Args:
        seed: the 32-byte raw Ed25519 private key.
        passphrase: any str, including empty (policy is the caller's).
        n: scrypt cost, a power of two up to 2**20; tests use 2**10.

    Returns:
        The JSON-ready document (fresh random salt and nonce every call).

    Raises:
        TypeError: seed is not bytes or passphrase is not str.
        ValueError: seed is not 32 bytes, n is not an acceptable cost, or
            passphrase holds a lone surrogate.
    """
    if not isinstance(seed, bytes):
        raise TypeError(f"seed must be bytes, not {type(seed).__name__}")
    if len(seed) != SEED_LEN:
        raise ValueError(f"seed must be {SEED_LEN} bytes, not {len(seed)}")
    problem = _check_kdf(n, R, P)
    if problem:
        raise ValueError(problem)
    salt, nonce = os.urandom(SALT_LEN), os.urandom(NONCE_LEN)
    public_key = _public_key(seed)
    key = _derive(passphrase, salt, n, R, P)
    ciphertext = ChaCha20Poly1305(key).encrypt(nonce, seed, _aad(public_key))
    return _Envelope(public_key, n, R, P, salt, nonce, ciphertext).to_doc()


def _field(obj: object, name: str, where: str = "") -> object:
    if not isinstance(obj, dict):
        raise KeyFileError(f"{where or 'key file'} must be a JSON object")
    if name not in obj:
        raise KeyFileError(f"missing field {where + '.' if where else ''}{name}")
    return obj[name]


def _hex_field(obj: object, name: str, length: int, where: str = "") -> bytes:
    label = f"{where + '.' if where else ''}{name}"
    value = _field(obj, name, where)
    if not isinstance(value, str) or not _HEX.fullmatch(value):
        raise KeyFileError(f"{label} must be a hex string")
    raw = bytes.fromhex(value)
    if len(raw) != length:
        raise KeyFileError(f"{label} must be {length} bytes, not {len(raw)}")
    return raw


def _parse(doc: object) -> _Envelope:
    """Validate a document's shape without touching the passphrase.

    Raises:
        KeyFileError: naming the first field that is missing or wrong.
    """
    if _field(doc, "version") != VERSION:
        raise KeyFileError(f"version must be {VERSION!r}, not {doc['version']!r}")
    public_key = _hex_field(doc, "public_key", PUBLIC_KEY_LEN)
    kdf, cipher = _field(doc, "kdf"), _field(doc, "cipher")
    if _field(kdf, "name", "kdf") != KDF_NAME:
        raise KeyFileError(f"kdf.name must be {KDF_NAME!r}")
    n, r, p = (_field(kdf, k, "kdf") for k in ("n", "r", "p"))
    problem = _check_kdf(n, r, p)
    if problem:
        raise KeyFileError(problem)
    salt = _hex_field(kdf, "salt", SALT_LEN, "kdf")
    if _field(cipher, "name", "cipher") != CIPHER_NAME:
        raise KeyFileError(f"cipher.name must be {CIPHER_NAME!r}")
    nonce = _hex_field(cipher, "nonce", NONCE_LEN, "cipher")
    ciphertext = _hex_field(doc, "ciphertext", SEED_LEN + TAG_LEN)
    env = _Envelope(public_key, n, r, p, salt, nonce, ciphertext)
    # Files written before checksums have none: a damaged one of them can
    # only read as a wrong passphrase.
    if "checksum" in doc and _hex_field(doc, "checksum", CHECKSUM_LEN) != env.checksum():
        raise KeyFileError("key file is damaged: its checksum does not match its contents "
                           "(a byte changed on disk); restore it from a backup")
    return env


def decrypt_seed(doc: dict[str, Any], passphrase: str) -> bytes:
    """Recover the seed from a key-file document.

    A wrong passphrase and a changed public_key, salt, nonce or ciphertext
    look the same to the AEAD; the file's checksum (of every other field)
    tells them apart, so a damaged file raises KeyFileError and only a
    wrong passphrase (or a forger's edit with the checksum redone) raises
    WrongPassphraseError. Fields that are missing, mistyped or the wrong
    length raise KeyFileError first.

    Args:
        doc: the parsed JSON document.
        passphrase: the passphrase it was written with.

    Returns:
        The 32-byte seed.

    Raises:
        KeyFileError: a malformed or damaged document, naming the bad field.
        WrongPassphraseError: the passphrase is wrong.
        TypeError: passphrase is not str.
        ValueError: passphrase holds a lone surrogate.
    """
    env = _parse(doc)
    key = _derive(passphrase, env.salt, env.n, env.r, env.p)
    try:
        seed = ChaCha20Poly1305(key).decrypt(env.nonce, env.ciphertext, _aad(env.public_key))
    except InvalidTag:
        raise WrongPassphraseError("wrong passphrase for key file") from None
    # Only reachable by someone who sealed a different seed under this
    # public key with the passphrase: a forged file, not a typo.
    if _public_key(seed) != env.public_key:
        raise KeyFileError("public_key does not match the encrypted seed")
    return seed


def write_key_file(path: StrPath, seed: bytes, passphrase: str, *, n: int = DEFAULT_N) -> None:
    """Encrypt `seed` and write it to a new file with mode 0600.

    Args:
        path: where the key file goes; it must not exist yet.
        seed: the 32-byte Ed25519 seed.
        passphrase: the passphrase to seal it with.
        n: scrypt cost (see encrypt_seed).

    Raises:
        KeyFileError: the file exists or cannot be written.
        TypeError, ValueError: as encrypt_seed.
    """
    path = os.fspath(path)
    if os.path.lexists(path):
        raise KeyFileError(f"{path}: key file already exists; not overwriting")
    data = json.dumps(encrypt_seed(seed, passphrase, n=n), indent=2).encode() + b"\n"
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".keystore-", suffix=".tmp")
    except OSError as e:
        raise KeyFileError(f"{path}: cannot write key file: {e}") from e
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _publish(tmp, path)
    except OSError as e:
        raise KeyFileError(f"{path}: cannot write key file: {e}") from e
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    _fsync_dir(directory)


def _publish(tmp: str, path: str) -> None:
    """Move the finished temp file to `path` without clobbering anything."""
    try:
        # link() fails if path exists, closing the race a check leaves open.
        os.link(tmp, path)
    except FileExistsError:
        raise KeyFileError(f"{path}: key file already exists; not overwriting") from None
    except OSError:
        # Filesystems without hard links: best effort, check then replace.
        if os.path.lexists(path):
            raise KeyFileError(f"{path}: key file already exists; not overwriting") from None
        os.replace(tmp, path)


def _fsync_dir(directory: str) -> None:
    """Make the new directory entry durable, as far as the filesystem lets us."""
    try:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass  # some filesystems refuse it; the file is written either way


def _load(path: StrPath) -> dict[str, Any]:
    """Read and JSON-decode a key file, or raise KeyFileError naming it."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_SIZE + 1)
    except FileNotFoundError:
        raise KeyFileError(f"{path}: no such key file") from None
    except OSError as e:
        raise KeyFileError(f"{path}: cannot read key file: {e}") from e
    if len(raw) > MAX_FILE_SIZE:
        raise KeyFileError(f"{path}: too large to be a key file")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise KeyFileError(f"{path}: not a JSON key file: {e}") from None
    if not isinstance(doc, dict):
        raise KeyFileError(f"{path}: key file must be a JSON object")
    return doc


def read_key_file(path: StrPath, passphrase: str) -> bytes:
    """Read a key file and decrypt its seed.

    Args:
        path: the key file.
        passphrase: the passphrase it was written with.

    Returns:
        The 32-byte seed.

    Raises:
        KeyFileError: missing, unreadable, not JSON, or malformed (path named).
        WrongPassphraseError: as decrypt_seed.
    """
    doc = _load(path)
    try:
        return decrypt_seed(doc, passphrase)
    except KeyFileError as e:
        raise KeyFileError(f"{os.fspath(path)}: {e}") from e


def read_public_key(path: StrPath) -> bytes:
    """Return the 32-byte public key of a key file, without a passphrase.

    The whole document is validated, but nothing proves the public key
    matches the sealed seed until the file is decrypted.

    Raises:
        KeyFileError: missing, unreadable, not JSON, or malformed (path named).
    """
    doc = _load(path)
    try:
        return _parse(doc).public_key
    except KeyFileError as e:
        raise KeyFileError(f"{os.fspath(path)}: {e}") from e


# -- seed files (node.key, peer.key) and other private files --------------------------


def write_seed_file(path: Path, key: SigningKey) -> None:
    write_private(path, key.seed().hex() + "\n")


def read_seed_file(path: Path) -> SigningKey:
    """Load a hex-encoded 32-byte key seed.

    Raises:
        DataDirError: missing or malformed.
    """
    try:
        return SigningKey(bytes.fromhex(Path(path).read_text().strip()))
    except FileNotFoundError:
        raise DataDirError(f"key file {path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise DataDirError(f"key file {path} is not a 32-byte hex seed: {exc}") from None


def write_private(path: Path, text: str, mode: int = 0o600, *, overwrite: bool = False) -> None:
    """Write a file atomically (temp file + os.replace) with ``mode``.

    Raises:
        DataDirError: the file exists and ``overwrite`` is False.
    """
    if path.exists() and not overwrite:
        raise DataDirError(f"{path} already exists; refusing to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
