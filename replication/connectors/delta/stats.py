"""A data file's Delta statistics (``add.stats``), made from its rows as delta-rs makes them.

Files the engine writes itself and commits with ``create_write_transaction``
(txlog files of backfill parts, :mod:`replication.ingest.staged_parts`) need
the statistics delta-rs would have written for them: readers place a txlog
file by its ``seq`` range, seek a bookmark by ``publisher_seq`` and a time by
``persist_time`` (:mod:`replication.txlog.seek`), and other
Delta readers skip files with them. Same form as delta-rs: ``minValues`` /
``maxValues`` / ``nullCount`` for each column of a scalar type; message
bodies (binary) and lists have none; timestamps in milliseconds, UTC.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc


def file_stats(rows: pa.Table, *, given: dict | None = None) -> dict:
    """``{"numRecords", "minValues", "maxValues", "nullCount"}`` of ``rows``; the columns already in
    ``given`` (a dict of the same form, for columns known without a scan) are taken from it."""
    given = given or {}
    out = {"numRecords": rows.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    for field in rows.schema:
        if _skipped(field.type):
            continue
        if field.name in given.get("nullCount", {}):
            for key in ("minValues", "maxValues", "nullCount"):
                if field.name in given.get(key, {}):
                    out[key][field.name] = given[key][field.name]
            continue
        column = rows.column(field.name)
        out["nullCount"][field.name] = column.null_count
        if column.null_count == len(column):
            continue
        low, high = pc.min_max(column).values()
        out["minValues"][field.name] = stat_value(low.as_py())
        out["maxValues"][field.name] = stat_value(high.as_py())
    return out


def constant_stats(name: str, value, rows: int) -> dict:
    """The statistics of a column that holds ``value`` in each of ``rows`` rows (None: null in each)."""
    if value is None:
        return {"nullCount": {name: rows}}
    return {"minValues": {name: stat_value(value)}, "maxValues": {name: stat_value(value)}, "nullCount": {name: 0}}


def merged(*parts: dict) -> dict:
    """Statistics dicts (or parts of one) merged, later ones winning per column."""
    out: dict = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict):
                out.setdefault(key, {}).update(value)
            else:
                out[key] = value
    return out


def stats_json(stats: dict) -> str:
    return json.dumps(stats, separators=(",", ":"))


def stat_value(value):
    """A value as Delta statistics spell it (timestamps: ISO 8601 in milliseconds, UTC, as delta-rs writes)."""
    if isinstance(value, datetime):
        utc = value.astimezone(timezone.utc) if value.tzinfo else value
        return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"
    return value


def _skipped(kind: pa.DataType) -> bool:
    return (pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_nested(kind)
            or pa.types.is_dictionary(kind))
