"""Batch backfill: every row of some files becomes a message published at an instance by one client.

The instance's inbox is its batch entrance, so the txlog keeps its single
writer and a backfill works whether the instance runs (its ingest takes the
rows as they are committed) or not (it takes them at its next start).
Backfilled rows are publishes of this instance by client ``--client``: the
ingest dedupes, stores, acknowledges (persisted acks on ``<instance>.acks``),
replicates and applies them to the SOW exactly as Kafka publishes.

Deterministic numbering: the inputs' rows, in input order (files as given, a
directory's files sorted by name, rows in file order), are the client's
sequence numbers 1, 2, ...; running the same backfill again stores nothing
twice (the instance drops what it has), and a backfill interrupted by kill -9
completes on a re-run with no duplicate.

Order of effects:

1. plan: count each file's rows and check the columns the options name (from
   Parquet footers, read by the driver; JSON lines and CSV by a Spark job, one
   task per file); a file that cannot be read or lacks a column stops the run
   before anything is written, naming the file;
2. Spark tasks (one job each, as many at a time as Spark has cores) read their
   files in bounded batches, check each row (topic recorded here, body of its
   message type) and write each part (``PART_ROWS`` rows or ``PART_BYTES`` of
   input, whichever comes first; a part never spans two files) as a txlog file,
   the rows as the instance stores them but for their ``seq``, in the inbox's
   staging directory (:mod:`replication.ingest.staged_parts`; and a Parquet
   file of its rejected rows, with file and row in the reason); only file
   metadata goes to the driver, announced part by part as it is written;
3. the driver commits the parts to the inbox (a descriptor of each staged file,
   no rows) and ``rejected/``, in sequence order, one commit per part, as soon
   as a part and those before it are written, each an idempotent app
   transaction ``backfill-seq:<client>`` whose version is the part's last
   sequence number: a re-run writes the rows after the last one committed,
   and the ingest never sees a later part first. The ingest stores a part by
   moving its file into the txlog and writing its seqs in, without reading or
   writing its rows again (or, when it cannot take the part as it is,
   classifies its rows like any others). One run of a client at a time (a
   lock, let go when its process ends).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.transaction import AddAction

from replication import failpoints
from replication.config.model import InstanceConfig
from replication.connectors import files, row_json
from replication.inbox.schema import INBOX_SCHEMA, STAGED_PART_KEY, create_inbox
from replication.connectors.delta.tables import DISTINCT_PER_ROW, open_or_create
from replication.destination.resync import stored_per_publisher
from replication.errors import InputError, ReplicationError
from replication.inbox import staged_parts
from replication.ingest.classify import TopicRecorder
from replication.messages import MAX_MESSAGE_BYTES, body_errors
from replication.storage.control import read_json, write_json_atomic
from replication.storage.layout import StorageLayout
from replication.txlog.schema import REJECTED_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: Rows per part at most (one inbox commit, one staged file that becomes one txlog file, the rows a task holds at
#: once): the ingest takes at least one commit per micro-batch, so this also bounds a batch that classifies them.
PART_ROWS = 250_000
#: Input bytes per part at most (as Arrow holds them): wide rows make smaller parts.
PART_BYTES = 64 * 1024 * 1024
#: The app transaction of a client's parts, in the inbox and ``rejected/``: its version is the last sequence
#: number committed.
APP_ID = "backfill-seq:{client}"
#: The app transaction of a client's parts committed before parts ended at their last sequence: its version is
#: a part number, each part ``LEGACY_PART_ROWS`` rows of a file.
LEGACY_APP_ID = "backfill:{client}"
LEGACY_PART_ROWS = 100_000
#: Input rows per Spark task: consecutive small files share one (a job's scheduling is paid once for them);
#: a larger file is a task of its own.
TASK_ROWS = 2 * PART_ROWS
#: How often the driver looks for the next part a running task has announced.
ANNOUNCE_POLL_S = 0.01

#: ``(rows done, rows in all)`` after each committed part.
Progress = Callable[[int, int], None]


class BackfillInputError(InputError):
    """An input that cannot be backfilled (unreadable, a column missing, bad options); nothing was written."""


class BackfillBusyError(ReplicationError):
    """Another backfill by the same client into the same instance is running."""


class BackfillTaskError(ReplicationError):
    """A Spark task of the backfill failed (an input that changed or broke after the plan read it, a full
    disk); the parts before it are committed, and a re-run of the same backfill continues from them."""


@dataclass(frozen=True)
class Options:
    """What one backfill reads and how rows become messages."""

    client: str
    fmt: str
    topic: str | None = None
    """Every row's AMPS topic (or ``topic_column``)."""
    topic_column: str | None = None
    data_column: str | None = None
    """The column holding each message's body; None: the row itself, as a JSON object (a JSON line as written)."""
    message_type: str = "json"


@dataclass(frozen=True)
class Part:
    """Consecutive rows of one file, as a Spark task wrote them: the files to commit, and what it found."""

    first_seq: int
    rows: int
    staged: str | None
    """The descriptor of its staged file (None: every row rejected)."""
    rejected: dict | None
    bad: list[str]
    """The first few rejected rows, as ``file row N: reason``."""
    rejected_rows: int
    last_good_seq: int
    """The highest sequence of a row handed to the instance (0: none)."""

    @property
    def last_seq(self) -> int:
        """Its last row's sequence: the version of its app transaction."""
        return self.first_seq + self.rows - 1


@dataclass
class Result:
    rows: int = 0
    stored: int = 0
    """Rows handed to the instance (messages it will store, unless it has them already)."""
    rejected: int = 0
    """Rows of this run's parts rejected."""
    rejected_earlier: int = 0
    """Rows of parts an earlier run committed that were rejected then: their sequence numbers are taken, so
    only a backfill under another client brings them in."""
    parts: int = 0
    """Parts this run wrote and committed (a re-run of a finished backfill: 0)."""
    last_seq: int = 0
    """The client's highest sequence (the inputs' row count)."""
    last_stored_seq: int = 0
    """The highest sequence handed to the instance, by this run or an earlier one: the instance has stored
    everything once it holds this."""
    bad: list[str] | None = None


def run(spark: SparkSession, cfg: InstanceConfig, inputs: list[str], options: Options,
        progress: Progress | None = None) -> Result:
    """Backfill ``inputs`` into ``cfg``'s instance (see the module docstring)."""
    check(cfg, options)
    layout = StorageLayout.of(cfg.storage)
    inbox = create_inbox(layout.inbox)
    rejected = open_or_create(layout.rejected, REJECTED_SCHEMA, name=f"{cfg.name} rejected")
    work: list[_Work] = []
    seq = 1
    try:  # (a Delta table's files and what they do not hold themselves: from one snapshot)
        deltas = files.delta_files(inputs) if options.fmt == "delta" else {}
    except InputError as exc:
        raise BackfillInputError(str(exc)) from None
    paths = list(deltas) if options.fmt == "delta" else files.expand(inputs, options.fmt)
    for item in _plan(spark, paths, options, deltas):
        work.append(_Work(item.path, item.rows, seq, deltas.get(item.path)))
        seq += item.rows
    result = Result(last_seq=seq - 1, bad=[])
    with _only_run(layout, cfg, options.client):
        return _run(spark, cfg, layout, inbox, rejected, work, options, result, progress)


def _run(spark: SparkSession, cfg: InstanceConfig, layout: StorageLayout, inbox: DeltaTable, rejected: DeltaTable,
         work: list[_Work], options: Options, result: Result, progress: Progress | None) -> Result:
    """The rest of :func:`run`, as the client's only backfill into the instance."""
    app_id = APP_ID.format(client=options.client)
    done = _done(inbox, options.client, work, layout)
    _check_same_input(cfg, layout, options.client, work, done)
    todo = [w for w in work if w.last_seq > done]
    # the rows an earlier run committed: their rejects still stand (their sequence numbers are taken)
    result.rejected_earlier, first_reasons, result.last_stored_seq = _earlier_rejects(layout, options.client, done)
    result.bad.extend(first_reasons)
    for part in _written_parts(spark, cfg, layout, todo, options, done):
        committed = False
        if part.rejected is not None:
            committed |= _commit(rejected, REJECTED_SCHEMA, app_id, part.last_seq, add=part.rejected,
                                 written=layout.rejected / part.rejected["path"])
        # the inbox's app transaction is the run's position, so a part of rejected rows only commits it too
        committed |= _commit_staged(layout, inbox, part.staged, app_id, part.last_seq)
        failpoints.hit("backfill.after_part")
        result.parts += committed
        result.stored += part.rows - part.rejected_rows
        result.rejected += part.rejected_rows
        result.last_stored_seq = max(result.last_stored_seq, part.last_good_seq)
        result.bad.extend(part.bad[: max(0, 20 - len(result.bad))])
        if progress is not None:
            progress(part.last_seq, result.last_seq)
    result.rows = result.last_seq
    if progress is not None:
        progress(result.rows, result.last_seq)
    return result


def _done(inbox: DeltaTable, client: str, work: list[_Work], layout: StorageLayout) -> int:
    """The client's last sequence committed to the inbox (0: none): its app transaction's version, or, for a
    client whose parts were committed before parts ended at their last sequence (the earlier app id, whose
    version is a part number), the last sequence of that part."""
    version = inbox.transaction_version(APP_ID.format(client=client))
    if version is not None:
        return version
    legacy = inbox.transaction_version(LEGACY_APP_ID.format(client=client))
    if legacy is None:
        return 0
    # the files as that run numbered them: its record's, else this run's (the same input, or it is refused)
    previous = read_json(layout.backfill_input(client), {}).get("files") or [[w.path, w.rows] for w in work]
    return _legacy_done([rows for _name, rows, *_ in previous], legacy)


def _legacy_done(rows_per_file: list[int], done: int) -> int:
    """The last sequence of part ``done`` as parts were numbered under :data:`LEGACY_APP_ID`: from 1, across
    the files (of ``rows_per_file`` rows), each file's rows in parts of ``LEGACY_PART_ROWS`` (at least one)."""
    seq, number, last = 1, 1, 0
    for rows in rows_per_file:
        if number > done:
            break
        last = seq + min(rows, (done - number + 1) * LEGACY_PART_ROWS) - 1
        seq, number = seq + rows, number + max(1, -(-rows // LEGACY_PART_ROWS))
    return last


def _earlier_rejects(layout: StorageLayout, client: str, through: int) -> tuple[int, list[str], int]:
    """The client's backfilled rows ``<= through`` in ``rejected/``: how many, the first ``20`` reasons (in
    sequence order), and the highest sequence ``<= through`` not rejected (0: none). Only their sequence
    numbers are read whole: an earlier run may have rejected millions."""
    if through <= 0:
        return 0, [], 0
    dataset = DeltaTable(str(layout.rejected)).to_pyarrow_dataset()
    mine = (pc.field("source") == "backfill") & (pc.field("publisher") == client)
    seqs = pc.cast(dataset.to_table(columns=["publisher_seq"], filter=mine)["publisher_seq"], pa.int64()).to_numpy()
    seqs = np.unique(seqs[seqs <= through])  # (sorted)
    reasons: list[str] = []
    if seqs.size:
        first = [str(s) for s in seqs[:20].tolist()]
        found = dataset.to_table(columns=["publisher_seq", "reason"],
                                 filter=mine & pc.field("publisher_seq").isin(first))
        by_seq = dict(zip(found["publisher_seq"].to_pylist(), found["reason"].to_pylist()))
        reasons = [by_seq[s] for s in first if s in by_seq]
    # below the run of rejected sequences that ends at ``through`` (if one does): its length is where the
    # sequences, from the top, first leave through, through - 1, ...
    gaps = np.flatnonzero(seqs[::-1] != through - np.arange(seqs.size))
    run = int(gaps[0]) if gaps.size else seqs.size
    return int(seqs.size), reasons, through - run


def _check_same_input(cfg: InstanceConfig, layout: StorageLayout, client: str, work: list[_Work], done: int) -> None:
    """Refuse inputs that differ from those whose rows (through sequence ``done``) a previous backfill by
    ``client`` committed, then record this run's (before it commits anything).

    A client's sequence numbers are its rows' positions in the input, and a re-run skips the rows already
    committed: other files in their place would have their rows taken for those already stored, silently.
    Files are compared by name and row count (a file may be given by another path); more may follow.
    """
    path = layout.backfill_input(client)
    previous = read_json(path, {}).get("files", [])
    files_now = [[Path(w.path).name, w.rows, w.first_seq] for w in work]
    first_seq = 1
    for k, (name, rows, *_) in enumerate(previous):  # (each file's first sequence: the rows before it, plus 1)
        if first_seq > done:
            break  # (nothing of this file or those after it is committed)
        first_seq += rows
        now = files_now[k] if k < len(files_now) else None
        if now is None or now[:2] != [name, rows]:
            given = f"{now[0]} ({now[1]:,} rows)" if now else "no file"
            raise BackfillInputError(
                f"client {client} has backfilled other input into {cfg.name}: its file {k + 1} was {name} "
                f"({rows:,} rows), this run's is {given}. Its sequence numbers are the rows' positions, so a "
                "re-run must give the same files first (more may follow). Fix: give the same input to finish or "
                "extend that backfill, or a new --client for other data")
    write_json_atomic(path, {"client": client, "files": files_now})


@contextlib.contextmanager
def _only_run(layout: StorageLayout, cfg: InstanceConfig, client: str) -> Iterator[None]:
    """Hold the client's backfill lock (a ``flock``, let go when the process ends, even by kill -9): two runs of
    one client at once would each take the other's parts for its own."""
    path = layout.backfill_input(client).with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise BackfillBusyError(
                f"another backfill by client {client} into {cfg.name} is running (it holds {path}). Fix: wait for "
                "it to end, then run this one: it stores nothing the other stored") from None
        yield


def check(cfg: InstanceConfig, options: Options) -> None:
    """Raise :class:`BackfillInputError` for a backfill that could store nothing: an instance without an
    inbox, an empty client, a ``--topic`` not recorded, bodies that cannot be of ``--type``. Needs no input
    and no Spark, so a command says it first."""
    if cfg.replication_transport is None:
        raise BackfillInputError(
            f"{cfg.name} has no incoming amps-replication transport: backfilled rows enter through the inbox. "
            "Fix: add <Transport><Name>amps-replication</Name><Type>amps-replication</Type></Transport>")
    if not options.client.strip():
        raise BackfillInputError("--client is empty: every message names its publisher. Fix: give the client "
                                 "name the messages carry, e.g. --client history-2024")
    if options.topic is not None and not options.topic:
        raise BackfillInputError("--topic is empty. Fix: give the AMPS topic of the messages, or --topic-column")
    if options.topic is not None and not TopicRecorder(cfg)(options.topic, options.message_type):
        raise BackfillInputError(
            f"topic {options.topic!r} ({options.message_type}) is not recorded in {cfg.name}'s TransactionLog: "
            "every row would be rejected. Fix: add a matching <TransactionLog><Topic>, or give a recorded --topic")
    if options.data_column is None and options.message_type in ("fix", "nvfix", "xml"):
        raise BackfillInputError(
            f"--type {options.message_type} needs --data-column: without it each body is the row as JSON (a JSON "
            f"line as written), which is not a {options.message_type} message. Fix: name the column holding the "
            "bodies")


@dataclass(frozen=True)
class _Work:
    """One input file: its rows and the sequence of its first row."""

    path: str
    rows: int
    first_seq: int
    delta: files.DeltaFile | None = None
    """A Delta table's file: what it does not hold itself (partition values)."""

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.rows - 1


# -- 1. the plan ------------------------------------------------------------------------------


def _plan(spark: SparkSession, paths: list[str], options: Options,
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
    wanted = [c for c in (options.topic_column, options.data_column) if c]
    for item in described:
        missing = [c for c in wanted if c not in item.columns]
        if missing and item.rows:
            raise BackfillInputError(
                f"{item.path}: no column {', '.join(repr(c) for c in missing)} (its columns: "
                f"{', '.join(item.columns) or 'none'}). Fix: name an existing column with --topic-column / "
                "--data-column")
        problem = _body_column_problem(item, options)
        if problem and item.rows:
            raise BackfillInputError(problem)
    return described


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
    try:
        return files.describe(path, fmt)
    except InputError as exc:
        return str(exc)


# -- 2. the Spark tasks ---------------------------------------------------------------------


def _written_parts(spark: SparkSession, cfg: InstanceConfig, layout: StorageLayout, todo: list[_Work],
                   options: Options, done: int) -> Iterator[Part]:
    """The parts of ``todo``'s rows after sequence ``done``, written by Spark tasks, in sequence order, each as
    soon as it and every part before it are written.

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
    _remove_left_behind(staging, done, stored_per_publisher(layout).get(options.client, 0))
    staging.mkdir(parents=True, exist_ok=True)
    scratch = layout.backfill_parts(options.client)
    shutil.rmtree(scratch, ignore_errors=True)  # a killed run's announcements
    announced = scratch / uuid.uuid4().hex
    announced.mkdir(parents=True)
    where = str(announced)
    sc = spark.sparkContext
    job_group = f"backfill {options.client} {announced.name}"
    stopping = threading.Event()

    def job(works: list[_Work]) -> list[Part]:
        def task(group: list[_Work]) -> list[Part]:
            return [p for w in group for p in _file_parts(cfg, w, options, (inbox, str(staging)), rejected, done,
                                                          where)]

        if stopping.is_set():  # the run ends early: no new job
            return []
        sc.setJobGroup(job_group, f"backfill {works[0].path} ...", interruptOnCancel=True)
        return sc.parallelize([works], 1).map(task).collect()[0]

    cores = max(1, sc.defaultParallelism)
    pool = ThreadPoolExecutor(cores, thread_name_prefix="backfill-job")
    jobs: list[tuple[list[_Work], Future]] = []
    try:
        jobs = [(group, pool.submit(job, group)) for group in _task_groups(todo, cores)]  # run in this order
        for group, future in jobs:
            following = max(group[0].first_seq, done + 1)  # the first row of the group's next part
            while following <= group[-1].last_seq:
                part = _announcement(announced, following)
                while part is None and not future.done():
                    wait([future], timeout=ANNOUNCE_POLL_S)
                    part = _announcement(announced, following)
                if part is None:
                    break
                following = part.last_seq + 1
                yield part
            try:
                parts = future.result()
            except Exception as exc:  # a task failed: the parts before it are committed (or being committed)
                raise BackfillTaskError(
                    f"{group[0].path}{' (and the files after it in its task)' if len(group) > 1 else ''}: a Spark "
                    f"task failed: {_cause(exc)}. The parts written before it are committed; fix the cause and run "
                    "the same backfill again to finish (nothing is stored twice)") from exc
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
        shutil.rmtree(announced, ignore_errors=True)
        with contextlib.suppress(OSError):  # (the client's scratch directory, when no other run uses it)
            scratch.rmdir()
            scratch.parent.rmdir()


def _task_groups(todo: list[_Work], cores: int) -> list[list[_Work]]:
    """Consecutive files, one group per task: up to ``TASK_ROWS`` rows, and fewer when that would leave cores
    without a task; a larger file alone."""
    most = min(TASK_ROWS, -(-sum(w.rows for w in todo) // cores))
    groups: list[list[_Work]] = []
    rows = 0  # of the last group
    for work in todo:
        if groups and rows + work.rows <= most:
            groups[-1].append(work)
            rows += work.rows
        else:
            groups.append([work])
            rows = work.rows
    return groups


def _cause(exc: Exception) -> str:
    """The last line naming an exception in a failed job's message (the task's own error), else its last line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    named = [line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b.*:", line)]
    return (named or lines)[-1][:500]


def _announce(where: str, part: Part) -> None:
    """(In a Spark task.) Tell the driver ``part`` is written: its fields, in a file renamed into place. Only an
    early notice (the task's result has the part too): a failure to write it does not fail the task."""
    path = Path(where) / f"{part.first_seq}.json"
    temporary = path.with_name(f".{part.first_seq}.{uuid.uuid4().hex}.tmp")  # (an attempt of its own)
    try:
        temporary.write_bytes(orjson.dumps(dataclasses.asdict(part)))
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)


def _announcement(where: Path, first_seq: int) -> Part | None:
    """The part from ``first_seq`` a task announced; None: none yet (or one that cannot be read: the result has
    it)."""
    try:
        return Part(**orjson.loads((where / f"{first_seq}.json").read_bytes()))
    except (OSError, ValueError, TypeError):
        return None


def _file_parts(cfg: InstanceConfig, work: _Work, options: Options, staging: tuple[str, str], rejected: str,
                done: int, announce: str | None = None) -> list[Part]:
    """(In a Spark task.) One file's rows after sequence ``done`` (those before: committed by an earlier run,
    read past) as staged parts of ``PART_ROWS`` rows or ``PART_BYTES`` of input (``staging``: the inbox's
    directory and the client's staging directory in it). Each part written is announced in the directory
    ``announce`` (when given)."""
    recorded = TopicRecorder(cfg)
    now = datetime.now(timezone.utc)
    parts: list[Part] = []
    buffer: list[pa.Table] = []
    buffered, size = 0, 0.0
    skip = max(0, done - work.first_seq + 1)  # (committed rows: the file's first)
    position, read = skip, 0  # the file's rows before the buffer; rows read

    def flush() -> None:
        nonlocal buffer, buffered, size, position
        # (JSON lines batches hold the fields their lines have: by name, absent ones null)
        rows = pa.concat_tables(buffer, promote_options="default")
        parts.append(_part(cfg, work, position, rows, options, recorded, now, staging, rejected))
        if announce is not None:
            _announce(announce, parts[-1])
        failpoints.hit("backfill.part_written")
        position += buffered
        buffer, buffered, size = [], 0, 0.0

    for batch in files.batches(work.path, options.fmt, work.delta):
        if read + batch.num_rows > work.rows:
            raise _changed(work)
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
    if read != work.rows:
        raise _changed(work)
    return parts


def _changed(work: _Work) -> BackfillInputError:
    """(In a Spark task.) Its rows are numbered from the plan's count: a file that changed since would number
    rows of the next file's too."""
    return BackfillInputError(f"{work.path}: its row count is not the {work.rows:,} the plan counted; the file "
                              "changed during the backfill. Fix: leave the inputs unchanged while it runs")


def _part(cfg: InstanceConfig, work: _Work, position: int, rows: pa.Table, options: Options,
          recorded: TopicRecorder, now: datetime, staging: tuple[str, str], rejected: str) -> Part:
    """Rows ``position ...`` of the file: checked, written as a staged part and a rejected file.

    Columns stay Arrow arrays from the input to the file written; only a rejected row is spelled out.
    """
    n = rows.num_rows
    first_seq = work.first_seq + position
    topics = (pa.repeat(pa.scalar(options.topic, pa.string()), n) if options.topic is not None else
              rows[options.topic_column].cast(pa.string()).combine_chunks())
    bodies, generated = _bodies(rows, options)
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
        bad = [(i, f"{work.path} line {lines[i]}: {reasons[i]}") for i in sorted(reasons)]
    else:
        bad = [(i, f"{work.path} row {position + i + 1}: {reasons[i]}") for i in sorted(reasons)]
    kept = pa.table({"topic": topics, "data": bodies, "publisher_seq": seqs})
    if bad:
        good = np.ones(n, dtype=bool)
        good[[i for i, _ in bad]] = False
        kept = kept.filter(pa.array(good))
    staged = None
    if kept.num_rows:
        inbox, directory = (Path(p) for p in staging)
        txlog_rows = staged_parts.part_rows(cfg.name, options.client, options.message_type,
                                            kept["topic"].combine_chunks(), kept["data"].combine_chunks(),
                                            kept["publisher_seq"].combine_chunks(), now)
        name = staged_parts.staged_name(first_seq)
        staged = staged_parts.write_part(directory, inbox, txlog_rows, name=name).to_json()
    rejected_add = _write(rejected, _rejected_rows(options, bad, topics, bodies, first_seq, now)) if bad else None
    return Part(first_seq, n, staged, rejected_add, [why for _, why in bad[:20]], len(bad),
                kept["publisher_seq"][-1].as_py() if kept.num_rows else 0)


def _bodies(rows: pa.Table, options: Options) -> tuple[pa.Array, bool]:
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


def _rejected_rows(options: Options, bad: list[tuple[int, str]], topics: pa.Array, bodies: pa.Array,
                   first_seq: int, now: datetime) -> pa.Table:
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


def _write(table_dir: str, rows: pa.Table) -> dict:
    """Write rejected rows as one Parquet data file of ``rejected/``; its add action's fields (not yet
    committed)."""
    name = f"backfill-{uuid.uuid4().hex}.parquet"
    path = Path(table_dir) / name
    # Dictionaries only where values repeat, statistics only on the sequence numbers, snappy
    pq.write_table(rows, path, compression="snappy",
                   use_dictionary=[c for c in rows.column_names if c not in _DISTINCT_PER_ROW],
                   write_statistics=["publisher_seq"])
    return {"path": name, "size": path.stat().st_size, "modification_time": int(time.time() * 1000),
            "stats": json.dumps({"numRecords": rows.num_rows})}


# -- 3. the commits ---------------------------------------------------------------------------


def _commit_staged(layout: StorageLayout, inbox: DeltaTable, descriptor: str | None, app_id: str,
                   number: int) -> bool:
    """Hand the instance one staged part (None: none, the position alone): an inbox commit of its descriptor,
    app transaction ``app_id`` version ``number``; False when that version is in already (this run's staged
    file is then removed)."""
    if descriptor is None:
        return _commit(inbox, INBOX_SCHEMA, app_id, number)
    return _commit(inbox, INBOX_SCHEMA, app_id, number, metadata={STAGED_PART_KEY: descriptor},
                   written=layout.inbox / staged_parts.StagedPart.from_json(descriptor).file)


def _remove_left_behind(staging: Path, done: int, stored: int) -> None:
    """Staged files no one will take: a killed run's parts never handed over (their rows after sequence
    ``done``), and parts the instance has stored (through ``stored``) whose file stayed (it crashed between
    its commit and their removal)."""
    if not staging.is_dir():
        return
    for path in staging.glob("*.parquet"):
        first = path.name.split("-", 1)[0]
        if not first.isdigit():
            continue
        try:
            taken = int(first) <= done and _last_publisher_seq(path) <= stored
        except (OSError, pa.ArrowException, TypeError):
            taken = False  # (unreadable: the instance says so when it comes to it)
        if int(first) > done or taken:
            path.unlink(missing_ok=True)


def _last_publisher_seq(path: Path) -> int:
    """The highest ``publisher_seq`` of a staged file, from its footer's statistics."""
    metadata = pq.ParquetFile(path).metadata
    column = metadata.schema.names.index("publisher_seq")
    return max(metadata.row_group(g).column(column).statistics.max for g in range(metadata.num_row_groups))


def _commit(table: DeltaTable, schema: pa.Schema, app_id: str, number: int, *, add: dict | None = None,
            written: Path | None = None, metadata: dict | None = None) -> bool:
    """One commit of app transaction ``app_id`` version ``number``: the data file ``add`` (None: none, the
    version alone) and ``metadata``; False when that version is in already (``written``, this run's copy of
    what it hands over, is then removed: never in a log, its name is this run's own)."""
    table.update_incremental()
    if (table.transaction_version(app_id) or 0) >= number:
        if written is not None:
            written.unlink(missing_ok=True)
        return False
    table.create_write_transaction(
        [AddAction(add["path"], add["size"], {}, add["modification_time"], True, add["stats"])] if add else [],
        mode="append", schema=schema,
        commit_properties=CommitProperties(app_transactions=[Transaction(app_id, number)],
                                           custom_metadata={"replication.backfill": app_id, **(metadata or {})}),
    )
    return True
