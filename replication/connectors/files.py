"""Reading input files in bounded batches, in file order: Parquet, JSON lines, CSV and Delta tables.

Used by backfill, inside Spark tasks: a file is read batch by batch (memory
does not grow with its size), rows in the order the file holds them. A JSON
lines row keeps its raw line (``_line``) next to its fields, so a backfill can
store the line exactly as written.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pyarrow as pa

from replication.errors import InputError

FORMATS = ("parquet", "jsonl", "csv", "delta")
#: Formats whose files say their row count and columns in their footer (:func:`describe` reads no row).
COUNTED_IN_FOOTER = ("parquet", "delta")
#: Rows per batch read.
BATCH_ROWS = 20_000
#: The raw line of a JSON lines row.
LINE = "_line"
_SUFFIXES = {"parquet": (".parquet", ".parq"), "jsonl": (".jsonl", ".json", ".ndjson"), "csv": (".csv",)}


@dataclass(frozen=True)
class InputFile:
    path: str
    rows: int
    columns: tuple[str, ...]


def expand(paths: list[str], fmt: str) -> list[str]:
    """The input files, in input order: each path as given; a directory's files sorted by name (a Delta
    table's data files in its snapshot's order)."""
    out: list[str] = []
    for raw in paths:
        path = Path(raw)
        if fmt == "delta":
            from deltalake import DeltaTable

            try:
                out.extend(uri.removeprefix("file://") for uri in DeltaTable(str(path)).file_uris())
            except Exception as exc:  # deltalake's own error types
                raise InputError(f"{raw}: not a readable Delta table ({exc})") from None
        elif path.is_dir():
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
            import pyarrow.parquet as pq

            meta = pq.ParquetFile(path)
            return InputFile(path, meta.metadata.num_rows, tuple(meta.schema_arrow.names))
        rows, columns = 0, {}
        for batch in batches(path, fmt):
            columns.update(dict.fromkeys(n for n in batch.schema.names if n != LINE))
            rows += batch.num_rows
        return InputFile(path, rows, tuple(columns))
    except InputError:
        raise
    except Exception as exc:  # whatever the reader says of a bad file
        raise InputError(f"{path}: cannot be read as {fmt} ({exc})") from None


def batches(path: str, fmt: str) -> Iterator[pa.Table]:
    """The file's rows, ``BATCH_ROWS`` at a time, in file order."""
    if fmt in ("parquet", "delta"):
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS):
            yield pa.Table.from_batches([batch])
    elif fmt == "csv":
        import pyarrow.csv as csv

        reader = csv.open_csv(path)
        for batch in reader:
            yield pa.Table.from_batches([batch])
    elif fmt == "jsonl":
        yield from _json_lines(path)
    else:
        raise InputError(f"{path}: unknown format {fmt!r}; formats: {', '.join(FORMATS)}")


def _json_lines(path: str) -> Iterator[pa.Table]:
    lines: list[bytes] = []
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, start=1):
            line = line.strip()
            if not line:
                continue
            lines.append(line)
            if len(lines) == BATCH_ROWS:
                yield _json_table(lines, path, number)
                lines = []
    if lines:
        yield _json_table(lines, path, -1)


def _json_table(lines: list[bytes], path: str, at: int) -> pa.Table:
    rows = []
    for line in lines:
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            value = None  # the backfill rejects the row with its reason; its line is kept
        rows.append(value if isinstance(value, dict) else {})
    names = list(dict.fromkeys(name for row in rows for name in row))
    columns = {name: pa.array([_json_text(row.get(name)) for row in rows], pa.string()) for name in names}
    columns[LINE] = pa.array(lines, pa.binary())
    return pa.table(columns)


def _json_text(value: object) -> str | None:
    """A JSON field as text: strings as they are, anything else as JSON."""
    if value is None or isinstance(value, str):
        return value
    return orjson.dumps(value).decode()
