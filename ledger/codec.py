"""The one canonical encoding of every wire and ledger object.

An object is a msgpack array ``[type_tag, version, field1, field2, ...]`` in
declared field order. Nested objects are nested arrays of the same shape;
tuples are arrays; bytes are msgpack bin; text is msgpack str. There are no
maps and no floats. Hashes and signatures cover ``encode(obj)`` and nothing
else, so the encoding must be a function of the object alone:

- ``encode`` emits msgpack's shortest form for every value;
- ``decode`` rejects anything that would not re-encode to the same bytes
  (non-shortest ints, trailing bytes, unknown tags or versions, wrong arity,
  wrong types, out-of-range ints, oversize input or fields, deep nesting).

Schemas come from type annotations: declare a frozen, slotted dataclass, give
its fields the aliases below (``U64``, ``Hash32`` ...) and decorate it with
``@wire(tag)``. Decoding arbitrary bytes raises only ``DecodeError``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Annotated, Any, Callable, Union

import msgpack

from ledger.errors import DecodeError, EncodeError

#: Largest input ``decode`` accepts. Blocks of a few thousand txs fit easily.
MAX_ENCODED_SIZE = 32 * 1024 * 1024
#: Longest bytes / str / tuple field unless the field says otherwise.
DEFAULT_MAX_LEN = 1 << 20


@dataclasses.dataclass(frozen=True, slots=True)
class Size:
    """Annotation: a bytes field of exactly ``n`` bytes."""

    n: int


@dataclasses.dataclass(frozen=True, slots=True)
class MaxLen:
    """Annotation: a bytes or tuple field of at most ``n`` items; str: UTF-8 bytes."""

    n: int


@dataclasses.dataclass(frozen=True, slots=True)
class Range:
    """Annotation: an int field in ``[lo, hi]``."""

    lo: int
    hi: int


U8 = Annotated[int, Range(0, 0xFF)]
U32 = Annotated[int, Range(0, 0xFFFF_FFFF)]
U64 = Annotated[int, Range(0, 0xFFFF_FFFF_FFFF_FFFF)]
Hash32 = Annotated[bytes, Size(32)]
Key32 = Annotated[bytes, Size(32)]
Sig64 = Annotated[bytes, Size(64)]
Proof80 = Annotated[bytes, Size(80)]  # an ECVRF proof (ledger/vrf.py)
ChainId = Annotated[str, MaxLen(64)]

_Check = Callable[[Any, str], Any]  # (value, where) -> value to keep

_BY_TAG: dict[int, type] = {}
_SCHEMAS: dict[type, tuple[tuple[str, _Check], ...]] = {}


def wire(tag: int, version: int = 1) -> Callable[[type], type]:
    """Register a frozen dataclass as a codec type.

    Args:
        tag: the type tag, unique across the codebase.
        version: the schema version; decode rejects any other.

    Raises:
        TypeError: the class is not a frozen dataclass or the tag is taken.
    """

    def register(cls: type) -> type:
        params = getattr(cls, "__dataclass_params__", None)
        if params is None or not params.frozen:
            raise TypeError(f"{cls.__name__} must be a frozen dataclass")
        if tag in _BY_TAG:
            raise TypeError(f"tag {tag} used by {_BY_TAG[tag].__name__} and {cls.__name__}")
        cls.TAG = tag
        cls.VERSION = version
        _BY_TAG[tag] = cls
        return cls

    return register


def encode(obj: Any) -> bytes:
    """Encode a registered object canonically.

    Raises:
        EncodeError: a field holds a value its schema does not allow.
    """
    return msgpack.packb(_to_plain(obj), use_bin_type=True)


def concat_array(encoded_items: list[bytes]) -> bytes:
    """A msgpack array of already-encoded items: header plus the items."""
    n = len(encoded_items)
    if n < 16:
        head = bytes([0x90 | n])
    elif n < 1 << 16:
        head = b"\xdc" + n.to_bytes(2, "big")
    else:
        head = b"\xdd" + n.to_bytes(4, "big")
    return head + b"".join(encoded_items)


def encode_from_parts(cls: type, encoded_fields: list[bytes]) -> bytes:
    """``encode(cls(*fields))`` from fields that are already encoded.

    For big objects whose parts the caller has encoded anyway (a block's
    transactions); the result is byte-identical to ``encode``.
    """
    head = [msgpack.packb(cls.TAG), msgpack.packb(cls.VERSION)]
    return concat_array(head + encoded_fields)


def encode_unsigned(obj: Any, encoded: bytes | None = None) -> bytes:
    """Encode ``obj`` without its trailing ``signature`` field.

    This is what a signature covers: the object minus the signature itself,
    i.e. the same array with one element fewer.

    Args:
        obj: a registered object whose last field is ``signature``.
        encoded: ``encode(obj)`` if the caller already has it (saves work).
    """
    if dataclasses.fields(obj)[-1].name != "signature":
        raise EncodeError(f"{type(obj).__name__} has no trailing signature field")
    full = encode(obj) if encoded is None else encoded
    # A signed object is a fixarray (at most 15 elements) ending in a 64-byte
    # bin8: header 0x90|n ... 0xc4 0x40 <64 bytes>. Drop the last element.
    if 0x92 < full[0] <= 0x9F and full[-66:-64] == b"\xc4\x40":
        return bytes([full[0] - 1]) + full[1:-66]
    plain = _to_plain(obj)
    return msgpack.packb(plain[:-1], use_bin_type=True)


def decode(data: bytes, expected: type | tuple[type, ...] | None = None, *,
           max_size: int = MAX_ENCODED_SIZE) -> Any:
    """Decode canonical bytes into an object.

    Args:
        data: the bytes to decode.
        expected: the class (or classes) the caller accepts; None for any.
        max_size: the most bytes accepted (a protocol with larger frames,
            such as training pushes, gives its own frame limit).

    Returns:
        The decoded frozen dataclass.

    Raises:
        DecodeError: for any input that is not the canonical encoding of an
            object of the expected type. Nothing else is raised.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > max_size:
        raise DecodeError(f"input of {len(data)} bytes exceeds {max_size}")
    try:
        plain = msgpack.unpackb(
            data, raw=False, use_list=False, strict_map_key=True,
            max_map_len=0, max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises many types; all mean "bad bytes"
        raise DecodeError(f"not msgpack: {exc}") from None
    allowed = expected if isinstance(expected, tuple) else (expected,) if expected else None
    obj = _from_plain(plain, allowed, "$")
    if encode(obj) != data:
        raise DecodeError("not the canonical encoding (non-shortest form or extra data)")
    return obj


# -- encoding -----------------------------------------------------------------


def _to_plain(obj: Any) -> tuple:
    schema = _schema(type(obj))
    out = [obj.TAG, obj.VERSION]
    for name, check in schema:
        value = getattr(obj, name)
        try:
            check(value, name)
        except DecodeError as exc:
            raise EncodeError(f"{type(obj).__name__}.{exc}") from None
        out.append(_plain_value(value))
    return tuple(out)


def _plain_value(value: Any) -> Any:
    if hasattr(value, "TAG"):
        return _to_plain(value)
    if isinstance(value, tuple):
        return tuple(_plain_value(v) for v in value)
    return value


# -- decoding -----------------------------------------------------------------


def _from_plain(plain: Any, allowed: tuple[type, ...] | None, where: str) -> Any:
    if not isinstance(plain, tuple) or len(plain) < 2:
        raise DecodeError(f"{where}: expected [tag, version, ...], got {type(plain).__name__}")
    tag, version = plain[0], plain[1]
    cls = _BY_TAG.get(tag) if type(tag) is int else None
    if cls is None:
        raise DecodeError(f"{where}: unknown type tag {tag!r}")
    if allowed is not None and cls not in allowed:
        names = ", ".join(c.__name__ for c in allowed)
        raise DecodeError(f"{where}: expected {names}, got {cls.__name__}")
    if version != cls.VERSION or type(version) is not int:
        raise DecodeError(f"{where}: {cls.__name__} version {version!r}, expected {cls.VERSION}")
    schema = _schema(cls)
    if len(plain) != len(schema) + 2:
        raise DecodeError(
            f"{where}: {cls.__name__} needs {len(schema)} fields, got {len(plain) - 2}"
        )
    values = [check(v, f"{where}.{name}") for (name, check), v in zip(schema, plain[2:])]
    return cls(*values)


# -- schemas ------------------------------------------------------------------


def _schema(cls: type) -> tuple[tuple[str, _Check], ...]:
    schema = _SCHEMAS.get(cls)
    if schema is None:
        if not hasattr(cls, "TAG"):
            raise EncodeError(f"{cls.__name__} is not a registered wire type")
        hints = typing.get_type_hints(cls, include_extras=True)
        schema = tuple((f.name, _checker(hints[f.name])) for f in dataclasses.fields(cls))
        _SCHEMAS[cls] = schema
    return schema


def _checker(annotation: Any) -> _Check:
    """Build a function that checks (and, for nested objects, decodes) a value."""
    base, limits = annotation, ()
    if typing.get_origin(annotation) is Annotated:
        base, *limits = typing.get_args(annotation)
    if base is bool:
        return _check_bool
    if base is int:
        rng = next((x for x in limits if isinstance(x, Range)), Range(0, 2**64 - 1))
        return _int_checker(rng)
    if base in (bytes, str):
        return _sized_checker(base, limits)
    origin = typing.get_origin(base)
    if origin is tuple:
        return _tuple_checker(base, limits)
    if origin in (Union, types.UnionType):
        return _object_checker(typing.get_args(base))
    if hasattr(base, "TAG"):
        return _object_checker((base,))
    raise TypeError(f"unsupported field type {annotation!r}")


def _check_bool(value: Any, where: str) -> bool:
    if type(value) is not bool:
        raise DecodeError(f"{where}: expected bool, got {type(value).__name__}")
    return value


def _int_checker(rng: Range) -> _Check:
    def check(value: Any, where: str) -> int:
        if type(value) is not int:
            raise DecodeError(f"{where}: expected int, got {type(value).__name__}")
        if not rng.lo <= value <= rng.hi:
            raise DecodeError(f"{where}: {value} outside [{rng.lo}, {rng.hi}]")
        return value

    return check


def _sized_checker(kind: type, limits: list) -> _Check:
    exact = next((x.n for x in limits if isinstance(x, Size)), None)
    most = next((x.n for x in limits if isinstance(x, MaxLen)), DEFAULT_MAX_LEN)

    def check(value: Any, where: str) -> Any:
        if type(value) is not kind:
            raise DecodeError(f"{where}: expected {kind.__name__}, got {type(value).__name__}")
        size = len(value)
        if kind is str:  # limits count UTF-8 bytes, as on the wire
            try:
                size = len(value.encode("utf-8"))
            except UnicodeEncodeError:
                raise DecodeError(f"{where}: text is not valid UTF-8") from None
        if exact is not None and size != exact:
            raise DecodeError(f"{where}: expected {exact} bytes, got {size}")
        if size > most:
            raise DecodeError(f"{where}: length {size} exceeds {most}")
        return value

    return check


def _tuple_checker(annotation: Any, limits: list) -> _Check:
    args = typing.get_args(annotation)
    if len(args) != 2 or args[1] is not Ellipsis:
        raise TypeError(f"only tuple[T, ...] fields are supported, got {annotation!r}")
    item = _checker(args[0])
    most = next((x.n for x in limits if isinstance(x, MaxLen)), DEFAULT_MAX_LEN)

    def check(value: Any, where: str) -> tuple:
        if type(value) is not tuple:
            raise DecodeError(f"{where}: expected array, got {type(value).__name__}")
        if len(value) > most:
            raise DecodeError(f"{where}: {len(value)} items exceed {most}")
        return tuple(item(v, f"{where}[{i}]") for i, v in enumerate(value))

    return check


def _object_checker(classes: tuple[type, ...]) -> _Check:
    def check(value: Any, where: str) -> Any:
        if isinstance(value, classes):  # encoding side: already an object
            return value
        return _from_plain(value, classes, where)

    return check


# -- JSON form (genesis files, CLI output) --------------------------------------


def to_json(obj: Any) -> Any:
    """A JSON-ready form of a registered object: bytes as hex, objects as dicts."""
    if hasattr(obj, "TAG"):
        out: dict[str, Any] = {"type": type(obj).__name__}
        for name, _ in _schema(type(obj)):
            out[name] = to_json(getattr(obj, name))
        return out
    if isinstance(obj, tuple):
        return [to_json(v) for v in obj]
    if isinstance(obj, bytes):
        return obj.hex()
    return obj


def from_json(doc: Any, expected: type | tuple[type, ...]) -> Any:
    """Inverse of ``to_json``.

    Raises:
        DecodeError: the document does not describe an object of that type.
    """
    classes = expected if isinstance(expected, tuple) else (expected,)
    if not isinstance(doc, dict):
        raise DecodeError(f"expected an object, got {type(doc).__name__}")
    cls = next((c for c in classes if c.__name__ == doc.get("type")), None)
    if cls is None:
        raise DecodeError(f"expected type {[c.__name__ for c in classes]}, got {doc.get('type')!r}")
    hints = typing.get_type_hints(cls, include_extras=True)
    names = {f.name for f in dataclasses.fields(cls)}
    extra = set(doc) - names - {"type"}
    if extra:
        raise DecodeError(f"{cls.__name__}: unexpected fields {sorted(extra)}")
    values = []
    for name in (f.name for f in dataclasses.fields(cls)):
        if name not in doc:
            raise DecodeError(f"{cls.__name__}: missing field {name!r}")
        values.append(_json_value(doc[name], hints[name], f"{cls.__name__}.{name}"))
    obj = cls(*values)
    for name, check in _schema(cls):
        check(getattr(obj, name), f"{cls.__name__}.{name}")
    return obj


def _json_value(value: Any, annotation: Any, where: str) -> Any:
    base = annotation
    if typing.get_origin(annotation) is Annotated:
        base = typing.get_args(annotation)[0]
    if base is bytes:
        if not isinstance(value, str):
            raise DecodeError(f"{where}: expected hex string")
        try:
            return bytes.fromhex(value)
        except ValueError:
            raise DecodeError(f"{where}: not hex") from None
    if typing.get_origin(base) is tuple:
        if not isinstance(value, list):
            raise DecodeError(f"{where}: expected a list")
        item = typing.get_args(base)[0]
        return tuple(_json_value(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if typing.get_origin(base) in (Union, types.UnionType):
        return from_json(value, typing.get_args(base))
    if hasattr(base, "TAG"):
        return from_json(value, base)
    return value
