"""How query commands (``replay``, ``sow``) show stored messages in JSON output: bodies, times, whole lines."""

from __future__ import annotations

import base64
from collections.abc import Sequence

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from replication.connectors.arrow_json import json_member, json_objects, value_bytes


def body_value(message_type: str, data: bytes | None) -> object:
    """A body as JSON output shows it: a json body parsed; other text as text; binary (or bytes that are not
    UTF-8) as base64 text."""
    if data is None:
        return None
    if message_type == "json":
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    if message_type != "binary":
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return base64.b64encode(data).decode("ascii")


#: ``pyarrow.compute.strftime`` format of times in JSON output: ISO 8601, UTC, microseconds.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"

def json_lines(rows: pa.Table, fields: Sequence[str]) -> bytes:
    """``rows`` as JSON lines, one object per row with ``fields`` in order: the object ``orjson.dumps`` makes of
    each row with times as :data:`TIME_FORMAT` text and ``data`` as :func:`body_value` shows it.

    Built column by column in Arrow (a per-row dict and dump cost ~10 us a row): a json body on one line is
    spliced in as stored (it was checked where it was published); other bodies, strings that need escapes
    and lists take the per-value path.
    """
    if rows.num_rows == 0:
        return b""
    lines = json_objects([(name, *_json_text(rows, name)) for name in fields], end="}\n")
    return value_bytes(lines).to_pybytes()


def _json_text(rows: pa.Table, name: str) -> tuple[pa.Array, bool]:
    """Each value of column ``name`` as JSON text (``null`` for a null), or as strings to quote (``True``: no
    null, nothing to escape): a member of :func:`json_objects`."""
    column = rows[name].combine_chunks()
    kind = column.type
    if name == "data":
        return _body_text(rows["message_type"].combine_chunks(), column), False
    if pa.types.is_timestamp(kind):
        return pc.fill_null(pc.binary_join_element_wise('"', pc.strftime(column, format=TIME_FORMAT), '"', ""),
                            "null"), False
    member = json_member(column)
    if member is not None:
        return member
    return pa.array([orjson.dumps(value).decode() for value in column.to_pylist()], pa.string()), False


def _body_text(message_types: pa.Array, data: pa.Array) -> pa.Array:
    data = data.cast(pa.binary())
    spliced = pc.fill_null(pc.and_(
        pc.and_(pc.equal(message_types, "json"), pc.greater(pc.binary_length(data), 0)),
        pc.invert(pc.match_substring_regex(data, "[\r\n]"))), False)
    try:
        text = pc.if_else(spliced, data, pa.scalar(b"", pa.binary())).cast(pa.string())
    except pa.ArrowInvalid:  # a json body that is not UTF-8 (so never checked as JSON): each the per-value way
        spliced = pa.array(np.zeros(len(data), dtype=bool))
        text = pa.nulls(len(data), pa.string())
    others = np.flatnonzero(~spliced.to_numpy(zero_copy_only=False))
    if not others.size:
        return text
    per_value = pa.array([orjson.dumps(body_value(t, b)).decode() for t, b in zip(
        message_types.take(others).to_pylist(), data.take(others).to_pylist(), strict=True)], pa.string())
    return pc.replace_with_mask(text, pc.invert(spliced), per_value)
