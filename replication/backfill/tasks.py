"""Stage 2 of a backfill, the Spark tasks: each writes its files' rows as staged parts and rejected files."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from replication import failpoints
from replication.backfill import BackfillInputError, BackfillTaskError, Options, Part
from replication.backfill.plan import NumberedFile
from replication.config.model import InstanceConfig
from replication.connectors import files, row_json
from replication.connectors.delta.log_files import DISTINCT_PER_ROW
from replication.connectors.s3.access import arrow_location
from replication.connectors.s3.objects import ObjectPath
from replication.errors import StorageError
from replication.inbox import staged_parts
from replication.ingest.classify import TopicRecorder
from replication.messages import MAX_MESSAGE_BYTES, body_errors
from replication.storage.layout import StorageLayout, StoragePath, remove_tree, storage_path
from replication.txlog.schema import REJECTED_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: Rows per part at most (one inbox commit, one staged file that becomes one txlog file, the rows a task holds at
#: once): the ingest takes at least one commit per micro-batch, so this also bounds a batch that classifies them.
PART_ROWS = 250_000
#: Input bytes per part at most (as Arrow holds them): wide rows make smaller parts.
PART_BYTES = 64 * 1024 * 1024
#: Input rows per Spark task: consecutive small files share one (a job's scheduling is paid once for them);
#: a larger file is a task of its own.
TASK_ROWS = 2 * PART_ROWS
#: How often the driver looks for the next part a running task has announced (on a disk; in a bucket, where each
#: look is a request, ``ANNOUNCE_POLL_S3_S``).
ANNOUNCE_POLL_S = 0.01
ANNOUNCE_POLL_S3_S = 0.1


def written_parts(spark: SparkSession, cfg: InstanceConfig, layout: StorageLayout, todo: list[NumberedFile],
                  options: Options, done: int) -> Iterator[Part]:
    """The parts of ``todo``'s rows after sequence ``done``, written by Spark tasks, in sequence order, each as
    soon as it and every part before it are written (the client's staging directory: cleared of what no one
    will take by the caller).

    One job per task (``TASK_ROWS`` of consecutive files), as many at a time as Spark has cores, so a core
    that finishes takes the next files at once. A task announces each part it has written (its fields, in a
    file of ``layout.backfill_parts``): the driver commits a task's first parts while it writes the next,
    and the instance ingests them meanwhile. A job's own result stays the authority: a part not announced
    (or an announcement not read) is taken from it.
    """
    if not todo:
        return
    inbox, rejected = str(layout.inbox), str(layout.rejected)
    staging = layout.backfill_staging(options.client)
    staging.mkdir(parents=True, exist_ok=True)
    scratch = layout.backfill_parts(options.client)
    _remove_scratch(scratch)  # a killed run's announcements
    announced = scratch / uuid.uuid4().hex
    announced.mkdir(parents=True)
    where = str(announced)
    poll = ANNOUNCE_POLL_S3_S if isinstance(announced, ObjectPath) else ANNOUNCE_POLL_S
    sc = spark.sparkContext
    job_group = f"backfill {options.client} {announced.name}"
    stopping = threading.Event()

    def job(group_files: list[NumberedFile]) -> list[Part]:
        def task(group: list[NumberedFile]) -> list[Part]:
            return [p for numbered in group
                    for p in write_file_parts(cfg, numbered, options, (inbox, str(staging)), rejected, done, where)]

        if stopping.is_set():  # the run ends early: no new job
            return []
        sc.setJobGroup(job_group, f"backfill {group_files[0].path} ...", interruptOnCancel=True)
        return sc.parallelize([group_files], 1).map(task).collect()[0]

    cores = max(1, sc.defaultParallelism)
    pool = ThreadPoolExecutor(cores, thread_name_prefix="backfill-job")
    jobs: list[tuple[list[NumberedFile], Future]] = []
    try:
        jobs = [(group, pool.submit(job, group)) for group in files_per_task(todo, cores)]  # run in this order
        for group, future in jobs:
            following = max(group[0].first_seq, done + 1)  # the first row of the group's next part
            while following <= group[-1].last_seq:
                part = _announced_part(announced, following)
                while part is None and not future.done():
                    wait([future], timeout=poll)
                    part = _announced_part(announced, following)
                if part is None:
                    break
                following = part.last_seq + 1
                yield part
            try:
                parts = future.result()
            except Exception as exc:  # a task failed: the parts before it are committed (or being committed)
                raise BackfillTaskError(
                    f"{group[0].path}{' (and the files after it in its task)' if len(group) > 1 else ''}: a Spark "
                    f"task failed: {_task_failure_cause(exc)}. The parts written before it are committed; fix the "
                    "cause and run the same backfill again to finish (nothing is stored twice)") from exc
            for part in sorted(parts, key=lambda p: p.first_seq):
                if part.first_seq >= following:
                    following = part.last_seq + 1
                    yield part
    finally:  # (a run that stops early, on a failed task or commit, stops the jobs still running)
        stopping.set()
        pool.shutdown(wait=False, cancel_futures=True)
        running = [future for _, future in jobs if not future.done()]
        while running:  # (again until they end: a thread may submit its job just after a cancel)
            try:
                sc.cancelJobGroup(job_group)
            except Exception:  # (Spark gone: its jobs with it) the error that ended the run is the one to see
                log.warning("backfill: could not cancel the jobs still running", exc_info=True)
                break
            running = list(wait(running, timeout=0.5).not_done)
        pool.shutdown(wait=True)
        _remove_scratch(announced)
        if isinstance(scratch, Path):
            with contextlib.suppress(OSError):  # (the client's scratch directory, when no other run uses it)
                scratch.rmdir()
                scratch.parent.rmdir()


def _remove_scratch(path: StoragePath) -> None:
    """Remove the announcements under ``path``; a bucket that fails to is only logged (the client's next run
    clears what is left)."""
    try:
        remove_tree(path)
    except Exception:
        log.warning("backfill: could not remove %s", path, exc_info=True)


def files_per_task(todo: list[NumberedFile], cores: int) -> list[list[NumberedFile]]:
    """Consecutive files, one group per task: up to ``TASK_ROWS`` rows, and fewer when that would leave cores
    without a task; a larger file alone."""
    most = min(TASK_ROWS, -(-sum(f.rows for f in todo) // cores))
    groups: list[list[NumberedFile]] = []
    rows = 0  # of the last group
    for numbered in todo:
        if groups and rows + numbered.rows <= most:
            groups[-1].append(numbered)
            rows += numbered.rows
        else:
            groups.append([numbered])
            rows = numbered.rows
    return groups


def _task_failure_cause(exc: Exception) -> str:
    """The last line naming an exception in a failed job's message (the task's own error), else its last line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    named = [line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b.*:", line)]
    return (named or lines)[-1][:500]


def _announce_part(where: str, part: Part) -> None:
    """(In a Spark task.) Tell the driver ``part`` is written: its fields, in a file renamed into place (in a
    bucket: an object, put whole). Only an early notice (the task's result has the part too): a failure to
    write it does not fail the task."""
    body = orjson.dumps(dataclasses.asdict(part))
    path = storage_path(where) / f"{part.first_seq}.json"
    if isinstance(path, ObjectPath):
        with contextlib.suppress(StorageError):
            path.write_bytes(body)
        return
    temporary = path.with_name(f".{part.first_seq}.{uuid.uuid4().hex}.tmp")  # (an attempt of its own)
    try:
        temporary.write_bytes(body)
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)


def _announced_part(where: StoragePath, first_seq: int) -> Part | None:
    """The part from ``first_seq`` a task announced; None: none yet (or one that cannot be read: the result has
    it)."""
    try:
        return Part(**orjson.loads((where / f"{first_seq}.json").read_bytes()))
    except (OSError, ValueError, TypeError, StorageError):
        return None


def write_file_parts(cfg: InstanceConfig, numbered: NumberedFile, options: Options, staging: tuple[str, str],
                     rejected: str, done: int, announce: str | None = None) -> list[Part]:
    """(In a Spark task.) One file's rows after sequence ``done`` (those before: committed by an earlier run,
    read past) as staged parts of ``PART_ROWS`` rows or ``PART_BYTES`` of input (``staging``: the inbox's
    directory and the client's staging directory in it). Each part written is announced in the directory
    ``announce`` (when given)."""
    recorded = TopicRecorder(cfg)
    now = datetime.now(timezone.utc)
    parts: list[Part] = []
    buffer: list[pa.Table] = []
    buffered, size = 0, 0.0
    skip = max(0, done - numbered.first_seq + 1)  # (committed rows: the file's first)
    position, read = skip, 0  # the file's rows before the buffer; rows read

    def flush() -> None:
        nonlocal buffer, buffered, size, position
        # (JSON lines batches hold the fields their lines have: by name, absent ones null)
        rows = pa.concat_tables(buffer, promote_options="default")
        parts.append(_check_and_write_part(cfg, numbered, position, rows, options, recorded, now, staging,
                                           rejected))
        if announce is not None:
            _announce_part(announce, parts[-1])
        failpoints.hit("backfill.part_written")
        position += buffered
        buffer, buffered, size = [], 0, 0.0

    for batch in files.batches(numbered.path, options.fmt, numbered.delta):
        if read + batch.num_rows > numbered.rows:
            raise _file_changed_error(numbered)
        offset = min(batch.num_rows, max(0, skip - read))
        read += batch.num_rows
        per_row = batch.nbytes / max(1, batch.num_rows)
        while offset < batch.num_rows:
            room = max(1, int((PART_BYTES - size) / per_row)) if per_row else PART_ROWS
            take = min(batch.num_rows - offset, PART_ROWS - buffered, room)
            buffer.append(batch.slice(offset, take))
            buffered, size, offset = buffered + take, size + take * per_row, offset + take
            if buffered == PART_ROWS or size >= PART_BYTES or take == room:
                flush()
    if buffered:
        flush()
    if read != numbered.rows:
        raise _file_changed_error(numbered)
    return parts


def _file_changed_error(numbered: NumberedFile) -> BackfillInputError:
    """(In a Spark task.) Its rows are numbered from the plan's count: a file that changed since would number
    rows of the next file's too."""
    return BackfillInputError(f"{numbered.path}: its row count is not the {numbered.rows:,} the plan counted; the "
                              "file changed during the backfill. Fix: leave the inputs unchanged while it runs")


def _check_and_write_part(cfg: InstanceConfig, numbered: NumberedFile, position: int, rows: pa.Table,
                          options: Options, recorded: TopicRecorder, now: datetime, staging: tuple[str, str],
                          rejected: str) -> Part:
    """Rows ``position ...`` of the file: checked, written as a staged part and a rejected file.

    Columns stay Arrow arrays from the input to the file written; only a rejected row is spelled out.
    """
    n = rows.num_rows
    first_seq = numbered.first_seq + position
    topics = (pa.repeat(pa.scalar(options.topic, pa.string()), n) if options.topic is not None else
              rows[options.topic_column].cast(pa.string()).combine_chunks())
    bodies, generated = message_bodies(rows, options)
    reasons: dict[int, str] = {}
    if not generated:  # a body made from the row is valid JSON; one given is checked for its message type
        # (first: a line that is not JSON has no topic field either, and its body is what to fix)
        reasons.update(body_errors(options.message_type, bodies.to_pylist()))
    sizes = pc.fill_null(pc.binary_length(bodies), 0).to_numpy(zero_copy_only=False)
    for i in np.flatnonzero(sizes > MAX_MESSAGE_BYTES).tolist():  # (what the instance refuses of any publish)
        reasons.setdefault(i, f"message is {int(sizes[i])} bytes, over the {MAX_MESSAGE_BYTES}-byte limit")
    for topic in pc.unique(topics).to_pylist():  # few distinct topics: one check each
        why = (f"no topic (column {options.topic_column!r} is empty)" if not topic else
               None if recorded(topic, options.message_type) else
               f"topic {topic!r} ({options.message_type}) is not recorded in {cfg.name}'s TransactionLog: add a "
               "matching <TransactionLog><Topic>")
        if why:
            hits = pc.is_null(topics) if topic is None else pc.fill_null(pc.equal(topics, topic), False)
            for i in np.flatnonzero(hits.to_numpy(zero_copy_only=False)).tolist():
                reasons.setdefault(i, why)
    seqs = pa.array(np.arange(first_seq, first_seq + n, dtype=np.int64))
    if files.LINE_NUMBER in rows.column_names:  # (a text file: its line, blank lines counted)
        lines = rows[files.LINE_NUMBER].to_pylist()
        bad = [(i, f"{numbered.path} line {lines[i]}: {reasons[i]}") for i in sorted(reasons)]
    else:
        bad = [(i, f"{numbered.path} row {position + i + 1}: {reasons[i]}") for i in sorted(reasons)]
    kept = pa.table({"topic": topics, "data": bodies, "publisher_seq": seqs})
    if bad:
        good = np.ones(n, dtype=bool)
        good[[i for i, _ in bad]] = False
        kept = kept.filter(pa.array(good))
    staged = None
    if kept.num_rows:
        inbox, directory = (storage_path(p) for p in staging)
        txlog_rows = staged_parts.part_rows(cfg.name, options.client, options.message_type,
                                            kept["topic"].combine_chunks(), kept["data"].combine_chunks(),
                                            kept["publisher_seq"].combine_chunks(), now)
        name = staged_parts.staged_name(first_seq)
        staged = staged_parts.write_part(directory, inbox, txlog_rows, name=name).to_json()
    rejected_add = (_write_rejected_data_file(rejected, _rejected_table(options, bad, topics, bodies, first_seq, now))
                    if bad else None)
    return Part(first_seq, n, staged, rejected_add, [why for _, why in bad[:20]], len(bad),
                kept["publisher_seq"][-1].as_py() if kept.num_rows else 0)


def message_bodies(rows: pa.Table, options: Options) -> tuple[pa.Array, bool]:
    """Each row's message body (its data column as text or bytes, a struct's value as a JSON object, the JSON
    line as written, or the row as a JSON object), and whether the backfill generated them (JSON objects:
    valid by construction)."""
    if options.data_column is not None:
        column = rows[options.data_column].combine_chunks()
        if pa.types.is_struct(column.type):  # (the plan let only --type json through)
            objects = row_json.rows_as_json(pa.Table.from_struct_array(column))
            if not column.null_count:
                return objects, True
            return pc.if_else(column.is_valid(), objects, pa.scalar(None, pa.binary())), False
        if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
            return column.cast(pa.binary()), False
        return column.cast(pa.string()).cast(pa.binary()), False
    if files.LINE in rows.column_names:
        return rows[files.LINE].combine_chunks().cast(pa.binary()), False
    return row_json.rows_as_json(rows, csv=options.fmt == "csv"), options.message_type == "json"


def _rejected_table(options: Options, bad: list[tuple[int, str]], topics: pa.Array, bodies: pa.Array,
                    first_seq: int, now: datetime) -> pa.Table:
    """The rows ``bad`` names (row index, reason) as ``rejected/`` holds them."""
    n = len(bad)
    at = pa.array([i for i, _ in bad], pa.int64())
    return pa.table({
        "reason": [why for _, why in bad], "source": ["backfill"] * n, "kafka_topic": pa.nulls(n, pa.string()),
        "kafka_partition": pa.nulls(n, pa.int32()), "kafka_offset": pa.nulls(n, pa.int64()),
        "publisher": [options.client] * n, "publisher_seq": [str(first_seq + i) for i, _ in bad],
        "topic": topics.take(at), "message_type": [options.message_type] * n, "command": ["publish"] * n,
        "data": bodies.take(at),
        "rejected_time": pa.repeat(pa.scalar(now, pa.timestamp("us", tz="UTC")), n),
    }).cast(REJECTED_SCHEMA)


#: Columns whose values differ row by row: a dictionary would only be built and dropped.
_DISTINCT_PER_ROW = {*DISTINCT_PER_ROW, "reason"}


def _write_rejected_data_file(table_dir: str, rows: pa.Table) -> dict:
    """Write rejected rows as one Parquet data file of ``rejected/``; its add action's fields (not yet
    committed)."""
    name = f"backfill-{uuid.uuid4().hex}.parquet"
    where, filesystem = arrow_location(f"{table_dir}/{name}")  # (on a disk or in a bucket)
    # Dictionaries only where values repeat, statistics only on the sequence numbers, snappy
    pq.write_table(rows, where, filesystem=filesystem, compression="snappy",
                   use_dictionary=[c for c in rows.column_names if c not in _DISTINCT_PER_ROW],
                   write_statistics=["publisher_seq"])
    size = filesystem.get_file_info(where).size if filesystem is not None else os.stat(where).st_size
    return {"path": name, "size": size, "modification_time": int(time.time() * 1000),
            "stats": json.dumps({"numRecords": rows.num_rows})}
