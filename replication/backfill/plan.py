"""Stage 1 of a backfill, the plan: the input files, their rows counted and columns checked, their rows numbered."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import pyarrow as pa

from replication.backfill import BackfillInputError, Options
from replication.connectors import files
from replication.errors import InputError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class NumberedFile:
    """One input file: its rows and the sequence of its first row."""

    path: str
    rows: int
    first_seq: int
    delta: files.DeltaFile | None = None
    """A Delta table's file: what it does not hold itself (partition values)."""

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.rows - 1


def numbered_files(spark: SparkSession, inputs: list[str], options: Options) -> list[NumberedFile]:
    """The files of ``inputs`` (a directory's sorted by name, a Delta table's from one snapshot), counted and
    checked, their rows numbered 1, 2, ... in input order; a bad file stops the run before anything is written."""
    try:  # (a Delta table's files and what they do not hold themselves: from one snapshot)
        deltas = files.delta_files(inputs) if options.fmt == "delta" else {}
    except InputError as exc:
        raise BackfillInputError(str(exc)) from None
    paths = list(deltas) if options.fmt == "delta" else files.expand(inputs, options.fmt)
    numbered: list[NumberedFile] = []
    seq = 1
    for item in _counted_and_checked(spark, paths, options, deltas):
        numbered.append(NumberedFile(item.path, item.rows, seq, deltas.get(item.path)))
        seq += item.rows
    return numbered


def _counted_and_checked(spark: SparkSession, paths: list[str], options: Options,
                         deltas: dict[str, files.DeltaFile]) -> list[files.InputFile]:
    """Each file's rows and columns (a Delta table's file: the table's); a bad file stops the run."""
    fmt = options.fmt
    if fmt in files.COUNTED_IN_FOOTER:  # a few footers read here: no Spark job to schedule
        with ThreadPoolExecutor(min(8, max(1, len(paths)))) as pool:
            described = list(pool.map(lambda path: _describe_or_error(path, fmt), paths))
    else:  # counting reads every row: Spark's tasks do, one per file
        described = spark.sparkContext.parallelize(paths, max(1, len(paths))).map(
            lambda path: _describe_or_error(path, fmt)).collect()
    described = [dataclasses.replace(d, columns=tuple(deltas[d.path].schema.names), schema=deltas[d.path].schema)
                 if not isinstance(d, str) and d.path in deltas else d for d in described]
    errors = [d for d in described if isinstance(d, str)]
    if errors:
        raise BackfillInputError(errors[0] + (f" (and {len(errors) - 1} more file(s))" if len(errors) > 1 else ""))
    checked = cast("list[files.InputFile]", described)  # no error: each is a file's description
    wanted = [c for c in (options.topic_column, options.data_column) if c]
    for item in checked:
        missing = [c for c in wanted if c not in item.columns]
        if missing and item.rows:
            raise BackfillInputError(
                f"{item.path}: no column {', '.join(repr(c) for c in missing)} (its columns: "
                f"{', '.join(item.columns) or 'none'}). Fix: name an existing column with --topic-column / "
                "--data-column")
        problem = _body_column_problem(item, options)
        if problem and item.rows:
            raise BackfillInputError(problem)
    return checked


def _body_column_problem(item: files.InputFile, options: Options) -> str | None:
    """Why ``--data-column`` cannot hold the bodies (its type, where the file says it), else None."""
    if options.data_column is None or item.schema is None or options.data_column not in item.schema.names:
        return None  # (a file without the column: said by the column check, or has no rows to read)
    kind = item.schema.field(options.data_column).type
    if pa.types.is_struct(kind) and options.message_type == "json":
        return None  # (each value a JSON object)
    if not pa.types.is_nested(kind):
        return None
    return (f"{item.path}: column {options.data_column!r} is {kind}, not a column of bodies: a body column holds "
            "text or bytes (with --type json a struct too, each value an object). Fix: name the column holding the "
            "bodies with --data-column, or leave it out to send each row as a JSON object")


def _describe_or_error(path: str, fmt: str) -> files.InputFile | str:
    """(Where the file is counted: the driver, or a Spark task.) Its description, or why it cannot be read."""
    try:
        return files.describe(path, fmt)
    except InputError as exc:
        return str(exc)
