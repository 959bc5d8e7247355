"""``replication replay CONFIG --topic REGEX ...``: print a txlog's messages from a bookmark, without Spark.

Reads the txlog with deltalake and Arrow, window by window in ``seq`` order,
and selects rows with the Python filter evaluator (the same selection
:func:`replication.replay.txlog` compiles for Spark), so the first message
prints as soon as its file is read. stdout carries only messages (``jsonl``:
one JSON object per message; ``table``: aligned columns); errors, logs and the
progress bar (big replays, when stderr is a terminal) go to stderr.
``--follow`` keeps printing as new commits arrive. Passing the last printed
``bookmark`` back with ``--bookmark`` resumes exactly after it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import IO

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from replication.commands.output import TIME_FORMAT, body_value, json_lines
from replication.commands.progress import ProgressBar
from replication.errors import InputError
from replication.expressions import FilterSyntaxError
from replication.messages import BOOKMARK_FORMS
from replication.replay import Selection, open_txlog
from replication.txlog.reader import TxlogReader

#: The jsonl fields, in order (``data`` last).
FIELDS = ("bookmark", "seq", "topic", "message_type", "publisher", "publisher_seq", "command", "sow_keys",
          "publish_time", "persist_time", "origin", "path", "data")
#: Columns of ``--format table``: (name, width).
TABLE = (("seq", 9), ("persist_time", 27), ("publisher", 14), ("topic", 18), ("bookmark", 30), ("data", 0))
#: ``--format table`` shows this many characters of a body.
TABLE_DATA_CHARS = 80
#: Rows formatted and written at a time.
PRINT_ROWS = 2_000
#: A replay of more rows than this shows a progress bar (when stderr is a terminal).
PROGRESS_MIN_ROWS = 200_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", help="the instance's config file (or its storage root)")
    parser.add_argument("--topic", required=True, metavar="REGEX",
                        help="topic regex; a name without regex characters matches exactly ('.*': every topic)")
    parser.add_argument("--filter", metavar="EXPR", help="AMPS content filter, e.g. \"/qty > 100 AND /side = 'buy'\"")
    parser.add_argument("--bookmark", default="0", metavar="B",
                        help="where to start (default 0, the beginning): " + BOOKMARK_FORMS)
    parser.add_argument("--until", metavar="B", help="where to stop, inclusive (a bookmark, a time or a list)")
    parser.add_argument("--fully-durable", action="store_true",
                        help="only messages every sync destination has acknowledged (with --follow: wait for them)")
    parser.add_argument("--follow", action="store_true", help="keep printing messages as they are committed")
    parser.add_argument("--format", choices=("jsonl", "table"), default="jsonl", help="output (default jsonl)")
    parser.add_argument("--limit", type=_positive_int, metavar="N", help="stop after N messages")
    parser.add_argument("--poll", type=float, default=0.2, metavar="SECONDS",
                        help="--follow: how often to look for new commits (default 0.2)")
    # one line, no usage block (replaced on this parser alone: argparse has no option for it)
    parser.error = lambda message: parser.exit(2, f"{parser.prog}: {message}\n")  # type: ignore[method-assign]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer (e.g. --limit 100)")
    return value


def run(args: argparse.Namespace) -> int:
    try:
        selection = Selection.of(args.topic, args.filter)
    except FilterSyntaxError as exc:  # its message draws a caret under the fault: keep the one line naming it
        raise InputError(f"--filter {args.filter!r}: {str(exc).splitlines()[0]}") from None
    log = open_txlog(args.config)
    if not args.follow and not log.exists():
        raise InputError(f"{log.name} has no txlog yet ({log.path}): start the instance first, "
                         "or add --follow to wait for its messages")
    start, end = log.range(args.bookmark, args.until)
    if args.follow:  # the moment from which new messages count (NOW), for the user and for scripts
        print(f"replication replay: following {log.name} after seq {start}", file=sys.stderr, flush=True)
    printer = Printer(sys.stdout.buffer, args.format)
    try:
        replay(log, selection, start, end, printer, args)
    except BrokenPipeError:  # the reader (head, jq) is gone: not an error; nothing more to flush there
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def replay(log: TxlogReader, selection: Selection, start: int, end: int | None, printer: Printer,
           args: argparse.Namespace) -> None:
    """Print the selected rows after ``start`` (through ``end``), then with ``--follow`` new ones as they commit."""
    position, printed = start, 0
    total = (log.committed_seq() if end is None else end) - start
    # a big replay shows its progress (on a terminal: the output may be piped on while stderr is watched)
    progress = ProgressBar("replay", "rows") if total > PROGRESS_MIN_ROWS and sys.stderr.isatty() else None
    while True:
        through = log.committed_seq() if end is None else min(end, log.committed_seq())
        if args.fully_durable:
            through = min(through, log.durable_seq())
        for rows in log.read(position, through):
            chosen = rows.filter(selection.mask(rows))
            if args.limit is not None:
                chosen = chosen.slice(0, args.limit - printed)
            printer.write(chosen)
            printed += chosen.num_rows
            position = int(rows.column("seq")[-1].as_py())
            if progress is not None:
                progress.update(position - start, total)
            if args.limit is not None and printed >= args.limit:
                break
        if progress is not None:
            progress.close()
            progress = None
        if args.limit is not None and printed >= args.limit:
            return
        if not args.follow or (end is not None and position >= end):
            return
        time.sleep(args.poll)


class Printer:
    """Writes messages to ``out`` (bytes) as jsonl or as a table, flushed after each batch."""

    def __init__(self, out: IO[bytes], fmt: str) -> None:
        self.out = out
        self.fmt = fmt
        self._header = fmt == "table"

    def write(self, rows: pa.Table) -> None:
        for start in range(0, rows.num_rows, PRINT_ROWS):  # slices: the first lines go out before the rest is made
            if self.fmt == "jsonl":
                self.out.write(json_lines(rows.slice(start, PRINT_ROWS), FIELDS))
            else:
                self.out.write(b"\n".join(self._table_lines(_records(rows.slice(start, PRINT_ROWS)))) + b"\n")
            self.out.flush()

    def _table_lines(self, records: list[dict]) -> list[bytes]:
        lines = []
        if self._header:
            lines.append(_table_line({name: name for name, _ in TABLE}))
            self._header = False
        for record in records:
            data = record["data"]
            text = data if isinstance(data, str) else orjson.dumps(data).decode()
            shown = text if len(text) <= TABLE_DATA_CHARS else text[: TABLE_DATA_CHARS - 3] + "..."
            lines.append(_table_line({**record, "data": shown.replace("\n", " ").replace("\x01", "|")}))
        return lines


def _table_line(values: dict) -> bytes:
    cells = [str(values[name]).ljust(width) if width else str(values[name]) for name, width in TABLE]
    return " ".join(cells).encode()


def _records(rows: pa.Table) -> list[dict]:
    """One dict per row with :data:`FIELDS`: times as ISO-8601 UTC, ``data`` parsed for json, text or base64."""
    columns = {name: rows.column(name).to_pylist() for name in FIELDS if "time" not in name and name != "data"}
    for name in ("publish_time", "persist_time"):
        columns[name] = pc.strftime(rows.column(name), format=TIME_FORMAT).to_pylist()
    columns["data"] = [body_value(t, b) for t, b in zip(rows.column("message_type").to_pylist(),
                                                  rows.column("data").to_pylist(), strict=True)]
    return [dict(zip(FIELDS, values, strict=True)) for values in zip(*(columns[name] for name in FIELDS), strict=True)]
