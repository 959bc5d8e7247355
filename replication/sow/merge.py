"""delta_publish: merging the fields a publisher changed into the current record (spec: SOW, delta_publish).

JSON: the delta's fields replace the record's, matched by name at each level
of nested objects; fields the delta does not name stay; new fields are added;
an array or a scalar is replaced whole (a delta cannot remove a field). FIX
and NVFIX: tag by tag, a tag the record has takes the delta's value in place,
a new tag is appended. The merged message is what is stored, replicated and
kept in the SOW; with no record yet, the delta is stored as it is.
"""

from __future__ import annotations

from typing import Any

import orjson

from replication.messages import TAG_VALUE_TYPES, tag_value_body, tag_value_fields


def mergeable(message_type: str, delta: Any) -> str | None:
    """Why a parsed delta_publish body cannot be merged, or None when it can."""
    if message_type in TAG_VALUE_TYPES or isinstance(delta, dict):
        return None
    kind = "an array" if isinstance(delta, list) else f"a {type(delta).__name__}" if delta is not None else "null"
    return f"delta_publish body is {kind}, not a JSON object: only an object's fields can be merged into a record"


def merge(message_type: str, current: Any, delta: Any) -> Any:
    """The record after the delta (both parsed as :func:`replication.sow.keys.parse_body` parses them)."""
    if message_type in TAG_VALUE_TYPES:
        return _merge_fields(current, delta)
    return _merge_json(current, delta) if isinstance(current, dict) else delta


def merged_body(message_type: str, record: bytes, delta: Any) -> bytes:
    """The body a delta_publish stores: ``delta`` (parsed) merged into the record's body, as :func:`merge`
    and :func:`serialize` give it. JSON, the common case, merges into the record as parsed here (ours to
    change: no copy of each level)."""
    if message_type in TAG_VALUE_TYPES:
        return tag_value_body(_merge_fields(tag_value_fields(record), delta))
    current = orjson.loads(record)
    if type(current) is not dict:
        return _dumped(delta)
    _merge_into(current, delta)
    return _dumped(current)


def serialize(message_type: str, doc: Any) -> bytes:
    if message_type in TAG_VALUE_TYPES:
        return tag_value_body(doc)
    return _dumped(doc)


def _dumped(doc: Any) -> bytes:
    """``orjson.dumps(doc)`` in a bytes object of its own size. orjson writes into a larger block and shrinks
    it; kept by the thousand (a batch's merged records), such blocks leave the C heap so fragmented that
    every later allocation slows: the next JSON parse went from ~0.5 to ~2.9 us. The copy costs ~0.05 us."""
    return memoryview(orjson.dumps(doc)).tobytes()


def _merge_json(current: dict, delta: dict) -> dict:
    out = dict(current)
    for name, value in delta.items():
        old = out.get(name)
        out[name] = _merge_json(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return out


def _merge_into(current: dict, delta: dict) -> None:
    for name, value in delta.items():
        if type(value) is dict:
            old = current.get(name)
            if type(old) is dict:
                _merge_into(old, value)  # (a delta's own objects are only read)
                continue
        current[name] = value


def _merge_fields(current: list[tuple[str, str]], delta: list[tuple[str, str]]) -> list[tuple[str, str]]:
    out = list(current)
    where: dict[str, int] = {}
    for i, (tag, _) in enumerate(out):
        where.setdefault(tag, i)  # a repeated tag: its first occurrence is the one a delta updates
    for tag, value in delta:
        if tag in where:
            out[where[tag]] = (tag, value)
        else:
            where[tag] = len(out)
            out.append((tag, value))
    return out
