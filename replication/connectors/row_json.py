"""Input rows as JSON objects: a backfill's message bodies when no column holds them.

Built column by column: each column becomes the JSON text of its values (in
Arrow where the type allows, one ``orjson`` dump per value otherwise), and the
columns are joined into one object per row, members in column order, as
``orjson.dumps`` writes a dict. What each type becomes:

- integers, floats, booleans: JSON numbers and booleans (NaN and infinities:
  null; a decimal: its digits, a number; a map's keys that collide as text:
  the last one's value);
- strings: strings; binary: base64 strings;
- dates, times, timestamps: ISO 8601 strings, nanoseconds kept;
- durations: ISO 8601 durations in seconds (``PT5.5S``, ``-PT0.000000001S``);
- structs and maps: objects (a map's keys as text); lists: arrays;
- CSV cells, read as text: a cell that is a JSON number (``-1.5e3``, an
  integer of up to 15 digits; a longer one, an id a double would round, stays
  text), ``true`` or ``false`` is that value, an empty cell null (a quoted one
  ``""``), any other a string (so ``02134``, ``TRUE`` and ``1,5`` are kept as
  written).
"""

from __future__ import annotations

import base64
import datetime
import decimal
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from replication.connectors.arrow_json import (
    json_member,
    json_objects,
    needs_json_escape,
)

#: CSV cells written as JSON as they are: an integer of up to 15 digits (any a double holds exactly: a longer
#: one, an id, stays text), true, false.
_JSON_INTEGER_OR_BOOLEAN = r"^(-?(0|[1-9][0-9]{0,14})|true|false)$"
#: ... and a JSON number with a fraction or an exponent, when finite as a double.
_JSON_FRACTION = r"^-?(0|[1-9][0-9]*)(\.[0-9]+([eE][+-]?[0-9]+)?|[eE][+-]?[0-9]+)$"


def rows_as_json(rows: pa.Table, *, csv: bool = False) -> pa.Array:
    """Each row as a JSON object (binary); ``csv``: its string columns are CSV cells (see the module doc)."""
    if rows.num_columns == 0:
        return pa.array([b"{}"] * rows.num_rows, pa.binary())
    members = [(name, *_member(column.combine_chunks(), csv)) for name, column in zip(rows.column_names,
                                                                                       rows.columns)]
    return json_objects(members).cast(pa.binary())


def _member(column: pa.Array, csv: bool) -> tuple[pa.Array, bool]:
    """The column as a member of :func:`json_objects`: JSON texts, or strings to quote."""
    kind = column.type
    if csv and (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        return _csv_cells(column), False
    member = json_member(column)
    if member is not None:
        return member
    if pa.types.is_float32(kind) or pa.types.is_float16(kind):  # (as a double it would gain digits: 1.1 -> 1.10000002)
        text = pc.if_else(pc.is_finite(column), pc.cast(column, pa.string()), pa.scalar(None, pa.string()))
        return pc.fill_null(text, "null"), False
    if pa.types.is_time(kind):  # (as Python's time: nanoseconds lost)
        return pc.fill_null(pc.binary_join_element_wise('"', pc.cast(column, pa.string()), '"', ""), "null"), False
    plain = _needs_plain(kind)
    dumps = orjson.dumps
    return pa.array([dumps(_plain(value, kind) if plain else value, default=_json_default).decode()
                     for value in column.to_pylist()], pa.string()), False


def _csv_cells(column: pa.Array) -> pa.Array:
    """JSON text of CSV cells: a JSON number or boolean as it is, an empty cell null, any other a string."""
    column = column.cast(pa.string())
    fraction = pc.fill_null(pc.match_substring_regex(column, _JSON_FRACTION), False)
    finite = pc.is_finite(pc.cast(pc.if_else(fraction, column, "0"), pa.float64()))
    literal = pc.or_(pc.fill_null(pc.match_substring_regex(column, _JSON_INTEGER_OR_BOOLEAN), False),
                     pc.and_(fraction, finite))
    if needs_json_escape(column):
        quoted = pa.array([None if v is None else orjson.dumps(v).decode() for v in column.to_pylist()],
                          pa.string())
    else:
        quoted = pc.binary_join_element_wise('"', column, '"', "")
    return pc.fill_null(pc.if_else(literal, column, quoted), "null")  # (an empty cell: read as null)


def _json_default(value: Any) -> Any:
    """What orjson does not write itself: bytes, decimals, durations, pandas' nanosecond timestamps."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, decimal.Decimal):
        return orjson.Fragment(str(value)) if value.is_finite() else None
    if isinstance(value, datetime.timedelta):
        return _iso_duration(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):  # (a subclass: pandas.Timestamp)
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} has no JSON form")


def _iso_duration(value: datetime.timedelta) -> str:
    """ISO 8601, in seconds: ``PT5S``, ``PT0.5S``, ``-PT90000S``; nanoseconds kept (pandas.Timedelta)."""
    nanos = getattr(value, "value", None)  # (pandas.Timedelta: exact nanoseconds)
    if not isinstance(nanos, int):
        nanos = ((value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds) * 1_000
    sign, nanos = ("-" if nanos < 0 else ""), abs(nanos)
    seconds, fraction = divmod(nanos, 1_000_000_000)
    return f"{sign}PT{seconds}{f'.{fraction:09d}'.rstrip('0') if fraction else ''}S"


def _needs_plain(kind: pa.DataType) -> bool:
    """Whether Python values of ``kind`` need :func:`_plain` (a map, anywhere in it: pairs, not a dict)."""
    if pa.types.is_map(kind):
        return True
    if pa.types.is_struct(kind):
        return any(_needs_plain(kind.field(i).type) for i in range(kind.num_fields))
    if _is_list(kind):
        return _needs_plain(kind.value_type)
    return False


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def _plain(value: Any, kind: pa.DataType) -> Any:
    """A Python value of ``kind`` with its maps as dicts (keys as text)."""
    if value is None:
        return None
    if pa.types.is_map(kind):
        return {k if isinstance(k, str) else orjson.dumps(k, default=_json_default).decode().strip('"'):
                _plain(v, kind.item_type) for k, v in value}
    if pa.types.is_struct(kind):
        return {kind.field(i).name: _plain(value.get(kind.field(i).name), kind.field(i).type)
                for i in range(kind.num_fields)}
    if _is_list(kind):
        return [_plain(v, kind.value_type) for v in value]
    return value
