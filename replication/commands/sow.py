"""``replication sow CONFIG --topic TOPIC``: the current records of a SOW topic, on stdout.

Reads the topic's SOW table and the txlog rows after it with deltalake and
Arrow (no Spark), so the answer is the exact current state, even between two
compactions. ``--key`` (repeatable, as shown in ``sow_key``) reads only the
keys' partitions; ``--filter`` is an AMPS content filter on the records'
bodies. ``jsonl`` (default): one JSON object per record with ``sow_key``,
``topic``, ``seq``, ``bookmark``, ``publisher``, ``publisher_seq``,
``persist_time`` and ``data`` (a JSON body parsed; others as text, or base64
when not UTF-8). Nothing but records goes to stdout.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone

import orjson

from replication import config
from replication.commands.output import body_value, json_lines
from replication.errors import ConfigError, InputError
from replication.expressions import Filter, FilterSyntaxError
from replication.sow.table import read_current

#: Columns of the table format, with their widths.
TABLE_COLUMNS = (("sow_key", 20), ("seq", 10), ("publisher", 16), ("publisher_seq", 13), ("persist_time", 26))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", help="the instance's config XML file")
    parser.add_argument("--topic", required=True, help="the SOW topic, e.g. /orders")
    parser.add_argument("--filter", help="AMPS content filter on the records, e.g. \"/qty > 100\"")
    parser.add_argument("--key", action="append", dest="keys", metavar="KEY",
                        help="only this record (as shown in sow_key); repeatable")
    parser.add_argument("--format", choices=("jsonl", "table"), default="jsonl", help="output format (default jsonl)")
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="at most N records")


def run(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 0:
        raise ConfigError(f"--limit {args.limit}: give a number of records, 0 or more")
    cfg = config.load(args.config)
    try:
        flt = Filter(args.filter) if args.filter is not None else None
    except FilterSyntaxError as exc:
        raise ConfigError(f"--filter: {str(exc).splitlines()[0]}") from None
    try:
        records = read_current(cfg, args.topic, keys=args.keys, filter=flt)
    except InputError as exc:
        raise ConfigError(f"--topic: {exc}") from None
    if args.limit is not None:
        records = records.slice(0, args.limit)
    out = sys.stdout.buffer
    if args.format == "table":
        _table(records.to_pylist(), out)
    else:
        for start in range(0, records.num_rows, OUTPUT_CHUNK):  # the first records out at once
            out.write(json_lines(records.slice(start, OUTPUT_CHUNK), FIELDS))
    out.flush()
    return 0


#: Records converted and written at a time.
OUTPUT_CHUNK = 20_000
#: Each record's fields in JSON lines.
FIELDS = ("sow_key", "topic", "seq", "bookmark", "publisher", "publisher_seq", "persist_time", "data")


def _iso(value: datetime | None) -> str | None:
    """The same form as :data:`replication.commands.output.TIME_FORMAT`: ISO 8601, UTC, with microseconds."""
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ") if value is not None else None


def _table(rows: list[dict], out) -> None:
    header = " ".join(f"{name:<{width}}" for name, width in TABLE_COLUMNS) + " data"
    lines = [header, "-" * len(header)]
    for row in rows:
        cells = {**row, "persist_time": _iso(row["persist_time"])}
        line = " ".join(f"{str(cells[name])[:width]:<{width}}" for name, width in TABLE_COLUMNS)
        body = body_value(row["message_type"], row["data"])
        text = body if isinstance(body, str) else orjson.dumps(body).decode()
        lines.append(f"{line} {text[:120]}")
    out.write(("\n".join(lines) + "\n").encode())
