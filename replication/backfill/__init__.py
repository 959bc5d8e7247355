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
   classifies its rows like any others: always so in a bucket). One run of a
   client at a time (a lock, let go when its process ends; on S3 a leased
   object, :mod:`replication.storage.lease`).

On S3 every piece is an object under the instance's prefix: the staged parts,
the tasks' announcements, the rejected files, the lock.

Each stage is a module: ``plan``, ``tasks`` (what runs in Spark's tasks, and the
driver's side of them) and ``commit``; this one holds what callers use and runs
the stages in turn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from deltalake import DeltaTable

from replication import failpoints
from replication.config.model import InstanceConfig
from replication.connectors.delta.tables import open_or_create
from replication.destination.resync import stored_per_publisher
from replication.errors import InputError, ReplicationError
from replication.inbox.schema import create_inbox
from replication.ingest.classify import TopicRecorder
from replication.storage.layout import StorageLayout
from replication.txlog.schema import REJECTED_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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
    """What a run did, and how far the client's backfill is."""

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
    bad: list[str] = field(default_factory=list)


# The stages build on the types above (a task returns Parts, each stage raises these errors): imported once
# they are defined, so a Spark worker that imports a stage first finds them too.
from replication.backfill import commit, plan, tasks  # noqa: E402


def run(spark: SparkSession, cfg: InstanceConfig, inputs: list[str], options: Options,
        progress: Progress | None = None) -> Result:
    """Backfill ``inputs`` into ``cfg``'s instance (see the module docstring)."""
    check(cfg, options)
    layout = StorageLayout.of(cfg.storage).check_reachable(f"{cfg.name}'s <Storage>")
    inbox = create_inbox(layout.inbox)
    rejected = open_or_create(layout.rejected, REJECTED_SCHEMA, name=f"{cfg.name} rejected")
    numbered = plan.numbered_files(spark, inputs, options)
    result = Result(last_seq=sum(f.rows for f in numbered), bad=[])
    with commit.client_lock(layout, cfg, options.client) as still_held:
        return _run_holding_lock(spark, cfg, layout, inbox, rejected, numbered, options, result, progress,
                                 still_held)


def _run_holding_lock(spark: SparkSession, cfg: InstanceConfig, layout: StorageLayout, inbox: DeltaTable,
                      rejected: DeltaTable, numbered: list[plan.NumberedFile], options: Options, result: Result,
                      progress: Progress | None, still_held: Callable[[], None]) -> Result:
    """The rest of :func:`run`, as the client's only backfill into the instance."""
    app_id = commit.APP_ID.format(client=options.client)
    done = commit.committed_through(inbox, options.client, numbered, layout)
    commit.check_and_record_input(cfg, layout, options.client, numbered, done)
    todo = [f for f in numbered if f.last_seq > done]
    # the rows an earlier run committed: their rejects still stand (their sequence numbers are taken)
    result.rejected_earlier, first_reasons, result.last_stored_seq = commit.earlier_rejects(layout, options.client,
                                                                                            done)
    result.bad.extend(first_reasons)
    if todo:  # (before this run's tasks stage their parts beside what is left there)
        commit.remove_unclaimed_staged_files(layout.backfill_staging(options.client), done,
                                             stored_per_publisher(layout).get(options.client, 0))
    for part in tasks.written_parts(spark, cfg, layout, todo, options, done):
        still_held()  # (a lease on S3 taken over: another run commits now, and this one must not)
        committed = False
        if part.rejected is not None:
            committed |= commit.commit_rejected_file(layout, rejected, part.rejected, app_id, part.last_seq)
        # the inbox's app transaction is the run's position, so a part of rejected rows only commits it too
        committed |= commit.commit_staged_part(layout, inbox, part.staged, app_id, part.last_seq)
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


def check(cfg: InstanceConfig, options: Options) -> None:
    """Raise :class:`BackfillInputError` for a backfill that could store nothing: an instance without an
    inbox, an empty client, a ``--topic`` not recorded, bodies that cannot be of ``--type``. Needs no input
    and no Spark, so a command says it first."""
    if cfg.replication_transport is None:
        raise BackfillInputError(
            f"{cfg.name} has no incoming amps-replication transport: backfilled rows enter through the inbox. "
            "Fix: add <Transport><Name>amps-replication</Name><Type>amps-replication</Type></Transport>")
    if cfg.replication_transport.upstream_keys is not None:
        raise BackfillInputError(
            f"backfill into {cfg.name} is not supported yet while its incoming transport verifies signed commits "
            "(<Authentication> replication-hmac-authentication): backfill's commits are not signed yet, so the "
            "instance would refuse every row. Fix: backfill before enabling <Authentication>, or into an instance "
            "without it, then replicate")
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
