"""node.wire's tag table: the docstring names every message with the tag the codec knows it by."""

from __future__ import annotations

import inspect
import re

import node.wire as wire


def table() -> dict[str, int]:
    """Message name -> tag, read from the table in node.wire's docstring."""
    found, lines = {}, wire.__doc__.split("Codec tags", 1)[1].splitlines()
    rows, current = [], None
    for line in lines:
        m = re.match(r"\s+(\d+)-(\d+)\s+[\w ()]+:\s*(.*)", line)
        if m:
            current = [int(m[1]), int(m[2]), m[3]]
            rows.append(current)
        elif current and line.strip():
            current[2] += " " + line.strip()
    for first, last, names in rows:
        names = [n.strip() for n in names.split(",") if n.strip()]
        assert len(names) == last - first + 1, (first, last, names)
        found.update({name: first + i for i, name in enumerate(names)})
    return found


def test_the_table_lists_every_message_with_its_codec_tag():
    exported = {name: getattr(wire, name) for name in wire.__all__}  # lazy: load them all
    messages = {name: obj for name, obj in exported.items()
                if inspect.isclass(obj) and hasattr(obj, "TAG")}
    assert messages, "node.wire exports no message"
    assert {name: cls.TAG for name, cls in messages.items()} == table()


def test_wire_tags_lie_above_the_ledger_range():
    """The codec refuses a taken tag at import; the ranges keep room for both sides to grow."""
    import ledger.types as types
    ledger_tags = {obj.TAG for obj in vars(types).values()
                   if inspect.isclass(obj) and hasattr(obj, "TAG")}
    assert ledger_tags and max(ledger_tags) <= 49 < 50 <= min(table().values())
