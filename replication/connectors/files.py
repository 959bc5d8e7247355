"""Reading input files in bounded batches, in file order: Parquet, JSON lines, CSV and Delta tables.

Used by backfill, inside Spark tasks: a file is read batch by batch (memory
does not grow with its size), rows in the order the file holds them. A JSON
lines row keeps its raw line (``_line``) next to its fields, so a backfill can
store the line exactly as written.

A path is a local one or an object-store address (``s3://bucket/key``, read
with the credentials, region and endpoint of the standard AWS settings of the
process reading it: the driver lists and counts, the Spark tasks read).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson
import pyarrow as pa

from replication.connectors.s3.access import (
    S3Address,
    StorageAccessError,
    arrow_location,
    check_reachable,
    environment_access,
)
from replication.errors import InputError

FORMATS = ("parquet", "jsonl", "csv", "delta")
#: Formats whose files say their row count and columns in their footer (:func:`describe` reads no row).
COUNTED_IN_FOOTER = ("parquet", "delta")
#: Rows per batch read.
BATCH_ROWS = 20_000
#: The raw line of a JSON lines row.
LINE = "_line"
#: Its number in the file (blank lines count): where a reason points.
LINE_NUMBER = "_line_number"
#: The columns a JSON lines batch adds to its fields.
_RAW = (LINE, LINE_NUMBER)
_SUFFIXES = {"parquet": (".parquet", ".parq"), "jsonl": (".jsonl", ".json", ".ndjson"), "csv": (".csv",)}


@dataclass(frozen=True)
class InputFile:
    path: str
    rows: int
    columns: tuple[str, ...]
    schema: pa.Schema | None = None
    """The columns' types, where the file says them (Parquet); JSON lines fields and CSV cells are text."""


@dataclass(frozen=True)
class DeltaFile:
    """What a Delta table's data file does not hold itself: its partition values, the table's columns."""

    partition: tuple[tuple[str, object], ...]
    schema: pa.Schema
    """The table's columns, in order (a file written before a column was added lacks it: null)."""


def _open_binary(path: str) -> IO[bytes]:
    """The file read front to back (JSON lines, CSV)."""
    key, filesystem = arrow_location(path)
    if filesystem is None:
        return open(path, "rb")  # noqa: SIM115 (the caller's with-block closes it)
    return io.BufferedReader(filesystem.open_input_stream(key), 1 << 20)


def _parquet_file(path: str) -> Any:
    """A ``pyarrow.parquet.ParquetFile`` of the path (its footer read; rows read on demand)."""
    import pyarrow.parquet as pq

    key, filesystem = arrow_location(path)
    return pq.ParquetFile(filesystem.open_input_file(key) if filesystem is not None else path)


def _s3_files(raw: str, address: S3Address, fmt: str) -> list[str]:
    """The object ``raw`` names, or the objects of format ``fmt`` under it as a folder, sorted by key."""
    from pyarrow import fs

    try:
        check_reachable(address, environment_access(), what="input")
    except StorageAccessError as exc:
        raise InputError(str(exc)) from None
    key, filesystem = arrow_location(address.uri)
    info = filesystem.get_file_info(key)
    if info.type == fs.FileType.File:
        return [address.uri]
    if info.type != fs.FileType.Directory:
        raise InputError(f"{raw}: no such object or prefix in bucket {address.bucket!r}")
    found = sorted(
        f"s3://{entry.path}" for entry in filesystem.get_file_info(fs.FileSelector(key, recursive=True))
        if entry.type == fs.FileType.File and Path(entry.path).suffix.lower() in _SUFFIXES[fmt]
        and not any(part.startswith(("_", ".")) for part in Path(entry.path).relative_to(key).parts))
    if not found:
        raise InputError(f"{raw}: the prefix holds no {fmt} object ({', '.join(_SUFFIXES[fmt])})")
    return found


def delta_files(paths: list[str]) -> dict[str, DeltaFile]:
    """Each data file of the Delta tables ``paths``, in order (a table's files in its snapshot's order): its
    path, partition values and the table's columns, all from one snapshot of each table. A table this reader
    could misread is refused: deletion vectors (rows deleted but still in a file) and column mapping (columns
    renamed from the files' names)."""
    from urllib.parse import unquote

    from deltalake import DeltaTable

    out: dict[str, DeltaFile] = {}
    for raw in paths:
        address = S3Address.parse(raw)
        try:
            if address is not None:
                check_reachable(address, environment_access(), what="input")
            table = DeltaTable(raw, storage_options=environment_access().delta_options() if address else None)
        except StorageAccessError as exc:
            raise InputError(str(exc)) from None
        except Exception as exc:  # deltalake's own error types
            raise InputError(f"{raw}: not a readable Delta table ({exc})") from None
        mapping = table.metadata().configuration.get("delta.columnMapping.mode", "none")
        if mapping != "none":
            raise InputError(f"{raw}: a Delta table with column mapping (mode {mapping}) is not supported yet: its "
                             "files' column names are not the table's. Fix: backfill from a copy without it, e.g. "
                             "Parquet written by spark.read.format('delta').load(...).write.parquet(...), "
                             "--format parquet")
        if "deletionVectors" in (table.protocol().reader_features or []):
            # (deltalake says which files have deleted rows to no reader of its files: refused when they may)
            raise InputError(f"{raw}: a Delta table with deletion vectors enabled is not supported yet: its files "
                             "may still hold deleted rows. Fix: backfill from a copy without them, e.g. Parquet "
                             "written by spark.read.format('delta').load(...).write.parquet(...), --format parquet")
        schema = pa.schema(table.schema().to_arrow())
        adds = pa.table(table.get_add_actions(flatten=True))
        columns = table.metadata().partition_columns
        values = {name: adds[f"partition.{name}"].to_pylist() for name in columns}
        # a file by its path in the table (as in the log, escaped once more than on disk): a file name alone
        # may repeat in several partitions
        at = {unquote(path): index for index, path in enumerate(adds["path"].to_pylist())}
        root = table.table_uri.removeprefix("file://").rstrip("/") + "/"
        for uri in table.file_uris():
            path = uri.removeprefix("file://")
            index = at.get(path.removeprefix(root)) if path.startswith(root) else None
            if index is None:
                raise InputError(f"{raw}: its data file {path} is not among the snapshot's files as this reader "
                                 "sees them; not supported yet. Fix: backfill from a Parquet copy, --format parquet")
            out[path] = DeltaFile(tuple((name, values[name][index]) for name in columns), schema)
    return out


def expand(paths: list[str], fmt: str) -> list[str]:
    """The input files, in input order: each path as given; a directory's files sorted by name (a Delta
    table's data files in its snapshot's order: see :func:`delta_files`)."""
    if fmt == "delta":
        return list(delta_files(paths))
    out: list[str] = []
    for raw in paths:
        address = S3Address.parse(raw)
        if address is not None:
            out.extend(_s3_files(raw, address, fmt))
            continue
        path = Path(raw)
        if path.is_dir():
            found = sorted(str(p) for p in path.rglob("*") if p.is_file() and p.suffix.lower() in _SUFFIXES[fmt]
                           and not any(part.startswith(("_", ".")) for part in p.relative_to(path).parts))
            if not found:
                raise InputError(f"{raw}: the directory holds no {fmt} file ({', '.join(_SUFFIXES[fmt])})")
            out.extend(found)
        elif path.is_file():
            out.append(str(path))
        else:
            raise InputError(f"{raw}: no such file or directory")
    return out


def describe(path: str, fmt: str) -> InputFile:
    """Row count and columns of one file (JSON lines: the fields any line has); InputError when unreadable."""
    try:
        if fmt in COUNTED_IN_FOOTER:
            meta = _parquet_file(path)
            return InputFile(path, meta.metadata.num_rows, tuple(meta.schema_arrow.names), meta.schema_arrow)
        rows, columns = 0, {}
        for batch in batches(path, fmt):
            columns.update(dict.fromkeys(n for n in batch.schema.names if n not in _RAW))
            rows += batch.num_rows
        return InputFile(path, rows, tuple(columns))
    except InputError:
        raise
    except Exception as exc:  # whatever the reader says of a bad file
        raise InputError(f"{path}: cannot be read as {fmt} ({exc})") from None


def batches(path: str, fmt: str, delta: DeltaFile | None = None) -> Iterator[pa.Table]:
    """The file's rows, ``BATCH_ROWS`` at a time, in file order (a Delta table's file: with its partition
    values, in the table's columns)."""
    if fmt in ("parquet", "delta"):
        for batch in _parquet_file(path).iter_batches(batch_size=BATCH_ROWS):
            table = pa.Table.from_batches([batch])
            yield table if delta is None else _as_table_row(table, delta)
    elif fmt == "csv":
        yield from _csv_cells(path)
    elif fmt == "jsonl":
        yield from _json_lines(path)
    else:
        raise InputError(f"{path}: unknown format {fmt!r}; formats: {', '.join(FORMATS)}")


def _as_table_row(rows: pa.Table, delta: DeltaFile) -> pa.Table:
    """A Delta data file's rows as the table's: its partition values added, a column it lacks null."""
    constants = dict(delta.partition)
    columns = []
    for field in delta.schema:
        if field.name in constants:
            columns.append(pa.repeat(pa.scalar(constants[field.name], field.type), rows.num_rows))
        elif field.name in rows.column_names:
            columns.append(rows[field.name])
        else:
            columns.append(pa.nulls(rows.num_rows, field.type))
    return pa.table(columns, names=delta.schema.names)


def _csv_cells(path: str) -> Iterator[pa.Table]:
    """A CSV file's cells as text: no type is guessed (a guess from the first block loses ``0`` of ``02134`` and
    fails on a later block's text); an empty cell is null, a quoted empty one the empty string."""
    import csv as text_csv

    import pyarrow.csv as csv

    # (a byte order mark is not in the first name)
    with io.TextIOWrapper(_open_binary(path), encoding="utf-8-sig", newline="") as fh:
        header = next(text_csv.reader(fh), [])
    options = csv.ConvertOptions(column_types={name: pa.string() for name in header}, null_values=[""],
                                 strings_can_be_null=True, quoted_strings_can_be_null=False)
    with _open_binary(path) as raw:
        for batch in csv.open_csv(raw, convert_options=options):
            yield pa.Table.from_batches([batch])


def _json_lines(path: str) -> Iterator[pa.Table]:
    lines: list[bytes] = []
    numbers: list[int] = []
    with _open_binary(path) as fh:
        for number, line in enumerate(fh, start=1):
            line = line.strip()
            if not line:
                continue
            lines.append(line)
            numbers.append(number)
            if len(lines) == BATCH_ROWS:
                yield _json_table(lines, numbers)
                lines, numbers = [], []
    if lines:
        yield _json_table(lines, numbers)


def _json_table(lines: list[bytes], numbers: list[int]) -> pa.Table:
    rows = []
    for line in lines:
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            value = None  # the backfill rejects the row with its reason; its line is kept
        rows.append(value if isinstance(value, dict) else {})
    names = list(dict.fromkeys(name for row in rows for name in row if name not in _RAW))
    columns = {name: pa.array([_json_text(row.get(name)) for row in rows], pa.string()) for name in names}
    columns[LINE] = pa.array(lines, pa.binary())
    columns[LINE_NUMBER] = pa.array(numbers, pa.int64())
    return pa.table(columns)


def _json_text(value: object) -> str | None:
    """A JSON field as text: strings as they are, anything else as JSON."""
    if value is None or isinstance(value, str):
        return value
    return orjson.dumps(value).decode()
