"""The ingest query's ``foreachBatch``: the txlog's only writer (DESIGN §2).

Its order of effects, and what a crash between two of them leaves, is written on :class:`IngestWriter`.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from replication import failpoints
from replication.config.environment import rows_from_environment
from replication.config.model import InstanceConfig
from replication.connectors.delta.tables import commit_metadata_since
from replication.ingest.classify import Classified, QueueAcks, TopicRecorder, classify, logons_in
from replication.ingest.inputs import spark_candidates
from replication.ingest.sessions import Clash, ClientSessions
from replication.sow.state import SowState
from replication.sow.table import fold_tail
from replication.txlog.files import TxlogFiles
from replication.txlog.publishers import PublisherState

if TYPE_CHECKING:
    from replication.connectors.delta.tables import IdempotentAppender
    from replication.inbox.staged_parts import StagedParts
    from replication.queues.wire import QueueRequest

log = logging.getLogger(__name__)

#: The app transaction of the ingest's commits to the txlog and ``rejected/``, before ``:<checkpoint id>``.
INGEST_APP = "ingest"

#: Batches of at least this many rows are committed behind Spark, unless ``REPLICATION_COMMIT_BEHIND_ROWS`` says.
COMMIT_BEHIND_ROWS = 10_000


def commit_behind_rows() -> int:
    """The size from which a batch is committed on a thread while Spark reads the next one:
    ``REPLICATION_COMMIT_BEHIND_ROWS`` (0: every batch), else :data:`COMMIT_BEHIND_ROWS`."""
    return rows_from_environment("REPLICATION_COMMIT_BEHIND_ROWS", COMMIT_BEHIND_ROWS, minimum=0,
                                 example="10000 (0: every batch)")


class IngestWriter:
    """``foreachBatch`` of the ingest query.

    The call for batch ``b`` takes its rows (read in the driver for a small batch,
    ``driver_read``, no Spark job; else collected from Spark's DataFrame: the same
    rows either way) and waits for batch ``b-1``'s commit (raising its failure). A
    batch of :func:`commit_behind_rows` or more (a backlog) is then committed
    behind: the call returns, leaving steps 0-6 to a thread of their own, and Spark
    writes its commit of ``b`` and plans and reads ``b+1`` while ``b`` is
    classified and committed. A smaller batch runs steps 0-6 before the call
    returns. Spark's checkpoint is thus at most one batch ahead of the txlog; a query
    started after a crash or a failed commit in between first undoes Spark's
    commit of the batch the txlog lacks (:mod:`replication.connectors.spark.commit_behind`),
    so Spark runs it again.

    Order of effects for batch ``b`` (each step safe to crash after):

    0. staged backfill parts that can be stored as they are are moved into the
       txlog's directory and given the batch's first seqs (``staged``: an
       uncommitted file, written again the same by a replay), the others' rows
       join the batch;
    1. classify the rows against the in-memory publisher state (and SOW state:
       delta_publishes merged, sow_deletes resolved, in seq order);
    2. append rejects to ``rejected/`` (app transaction ``ingest``, version ``b``);
    3. append accepted rows, and the staged parts' files, to ``txlog/`` (app
       transaction ``ingest``, version ``b``), with the batch's publisher and link
       positions in the commit metadata;
    4. fold the batch into the in-memory publisher state (``publishers.json``
       is written from it by the instance's heartbeat, :meth:`IngestWriter.snapshot_state`,
       off the batch's path); hand the txlog rows to the SOW compactor (the SOW
       tables follow on its schedule, from these rows rather than read back);
       hand the rows and the batch's subscribes to the queue dispatcher;
    5. hand the commit to the durability tracker (persisted acks, logon replies);
    6. fold the batch's SOW changes into the SOW state, on a thread while
       Spark reads the next batch (whose fold waits for it).

    A batch replayed after a crash finds version ``b`` in the txlog and skips
    2–4; the states already hold it (recovered at start: publishers from the
    commit metadata, the SOW from its tables and the txlog rows after them),
    and step 5 answers its logons again.
    """

    def __init__(
        self,
        cfg: InstanceConfig,
        *,
        txlog: IdempotentAppender,
        rejected: IdempotentAppender,
        state: PublisherState,
        save_state: Callable[[PublisherState], None],
        on_commit: Callable[[int, Classified], None],
        expand: Callable[[pa.Table], pa.Table] | None = None,
        driver_read: Callable[[int], pa.Table | None] | None = None,
        sow: SowState | None = None,
        txlog_files: TxlogFiles | None = None,
        sow_committed: Callable[[pa.Table, int, int], None] | None = None,
        staged: StagedParts | None = None,
        on_clash: Callable[[Clash], None] | None = None,
        queues: QueueAcks | None = None,
        queue_committed: Callable[[pa.Table, list[QueueRequest], int, int], None] | None = None,
        txlog_committed: Callable[[pa.Table], None] | None = None,
        checkpoint_id: Callable[[], str | None] | None = None,
    ) -> None:
        """``checkpoint_id``: the ingest query's checkpoint identity (read at the first batch, when Spark has
        written it); batches commit as the app transaction ``ingest:<it>``, so a checkpoint lost and begun
        again (batch ids from 0) does not take its batches for ones already committed."""
        self.cfg = cfg
        self._checkpoint_id = checkpoint_id
        self.txlog = txlog
        self.rejected = rejected
        self.state = state
        self.save_state = save_state
        self._state_lock = threading.Lock()
        """Held while the state changes and while it is copied for a snapshot."""
        self._snapshot_lock = threading.Lock()
        """Held while a snapshot is written: one at a time, never an older one after a newer."""
        self._snapshot_version = -2
        """The txlog version of the last snapshot written (-2: none yet)."""
        self.on_commit = on_commit
        self.expand = expand
        """Turns the batch's inbox version rows into the rows those versions hold (see
        :class:`replication.ingest.inputs.InboxRows`)."""
        self.driver_read = driver_read
        """Reads a small batch in the driver, without a Spark job (see
        :class:`replication.ingest.inputs.DriverRead`); None: collect the DataFrame."""
        self.sow = sow
        """The SOW state (None: no SOW topics); folded from ``txlog_files`` by :meth:`catch_up`."""
        self.txlog_files = txlog_files
        self.sow_committed = sow_committed
        """Told each committed batch's txlog rows and seqs (the SOW compactor keeps them for its next compaction)."""
        self.recorded = TopicRecorder(cfg)
        self.staged = staged
        """Takes the batch's staged backfill parts (None: no inbox)."""
        self.sessions = ClientSessions()
        """The publishers' sessions per client name: two at once is a clash (:mod:`replication.ingest.sessions`)."""
        self.on_clash = on_clash
        self.queues = queues
        """The instance's queues: which sow_deletes are acknowledgements, and may they be stored."""
        self.queue_committed = queue_committed
        """Told each committed batch's txlog rows and queue requests (the queue dispatcher)."""
        self.txlog_committed = txlog_committed
        """Told each batch's txlog rows once this writer committed them (the replicators read them from there)."""
        self.stats = {"batches": 0, "accepted": 0, "rejected": 0, "duplicates": 0, "last_batch_ms": 0.0,
                      "input_rows_per_second": 0.0}
        self._last_batch_at: float | None = None
        self.step: tuple[int, str, float] | None = None
        """(batch id, what the batch is doing, since when: monotonic), while in a batch; for slow-batch reports."""
        self.idle_since = time.monotonic()
        """When the last batch ended (or the writer was made): how long Spark has been planning the next."""
        self.commit_behind_rows = commit_behind_rows()
        """Batches of at least this many rows are committed on a thread while Spark reads the next."""
        self._committing: threading.Thread | None = None
        """Commits the last batch Spark handed over (:meth:`_commit_behind`)."""
        self._failure: tuple[int, BaseException, float] | None = None
        """The batch whose commit failed and why, until :meth:`wait_for_commit` or :meth:`drain` takes it."""

    def snapshot_state(self) -> None:
        """Write ``publishers.json`` if the state moved since the last one written (the instance's heartbeat
        calls this every second, and its stop once more). A crash can leave it behind the txlog: recovery
        folds the commits after it (:func:`replication.txlog.publishers.recover_state`), and a resync reading
        it starts earlier, sending rows the destination drops as duplicates."""
        with self._snapshot_lock:
            with self._state_lock:
                if self.state.txlog_version <= self._snapshot_version:
                    return
                copy = PublisherState.from_snapshot(self.state.snapshot())
            self.save_state(copy)
            self._snapshot_version = copy.txlog_version

    def _enter(self, batch_id: int, what: str) -> None:
        self.step = (batch_id, what, time.monotonic())

    def catch_up(self) -> None:
        """Fold in txlog commits this writer did not see (a batch that failed after its commit)."""
        before = dict(self.state.publishers)
        before_links = dict(self.state.links)
        records = commit_metadata_since(self.txlog.table, self.state.txlog_version) or []
        with self._state_lock:
            for version, record in records:
                self.state.apply(version, record)
        self.txlog.refresh()
        if self.sow is not None:
            self.sow.settle()  # (a batch still being applied would leave applied_seq behind)
            if self.txlog_files is not None and self.state.max_seq > self.sow.applied_seq:
                fold_tail(self.sow, self.txlog_files, [self.sow.applied_seq] * len(self.sow.records),
                          self.state.max_seq)
        if records:
            self.snapshot_state()
            missed = Classified.empty([])
            missed.publishers = {c: s for c, s in self.state.publishers.items() if s > before.get(c, 0)}
            # and the upstreams whose rows they hold: their acknowledgement waits for those rows too
            missed.links = {u: s for u, s in self.state.links.items() if s > before_links.get(u, 0)}
            self.on_commit(self.state.max_seq, missed)

    def __call__(self, df, batch_id: int) -> None:
        try:
            batch = None
            if self.driver_read is not None:
                self._enter(batch_id, "reading its rows in the driver")
                batch = self.driver_read(batch_id)
            if batch is None:
                self._enter(batch_id, "reading its rows with a Spark job")
                batch = spark_candidates(df.toArrow())
            self.wait_for_commit()
        except BaseException:
            self.step, self.idle_since = None, time.monotonic()
            raise
        if batch.num_rows < self.commit_behind_rows:
            # A live stream's small batch is committed before the call returns. Committed behind, it gained
            # nothing at 2k msg/s on 2 cores (bench/replicate.py, latency): the commit and Spark's work on the
            # next batch compete for the same cores and the GIL, and the batches get smaller and more numerous.
            self._commit(batch, batch_id)
            return
        # not a daemon: a process that exits normally does so once the batch is in the txlog
        self._committing = threading.Thread(target=self._commit_behind, args=(batch, batch_id),
                                            name=f"{self.cfg.name}-ingest-commit")
        self._committing.start()
        failpoints.hit("ingest.handed_over")

    def _commit(self, batch: pa.Table, batch_id: int) -> None:
        try:
            failpoints.hit("ingest.commit_begins")
            self.write_arrow(batch, batch_id)
        finally:
            if self.step is not None and self.step[0] == batch_id:  # (not the next batch's read, begun since)
                self.step = None
            self.idle_since = time.monotonic()

    def _commit_behind(self, batch: pa.Table, batch_id: int) -> None:
        try:
            self._commit(batch, batch_id)
        except BaseException as exc:  # the next call raises it in Spark's query; the instance restarts that
            log.error("%s: ingest batch %d was not committed: %s", self.cfg.name, batch_id, exc)
            self._failure = (batch_id, exc, time.monotonic())

    def wait_for_commit(self) -> None:
        """Wait for the last batch's commit; raise its failure (once)."""
        if self._committing is not None:
            self._committing.join()
            self._committing = None
        failure, self._failure = self._failure, None
        if failure is not None:
            batch_id, exc, _when = failure
            raise IngestCommitError(f"ingest batch {batch_id} was not committed: {exc}") from exc

    def commit_failure(self, older_than: float = 0.0) -> str | None:
        """Why the last batch's commit failed, if it did at least ``older_than`` seconds ago (None: it did not,
        not that long ago, or it is still under way)."""
        failure = self._failure
        if failure is None or time.monotonic() - failure[2] < older_than:
            return None
        return f"ingest batch {failure[0]} was not committed: {failure[1]}"

    def drain(self) -> str | None:
        """Wait for the last batch's commit (a query stopped or failed); why it failed, if it did."""
        try:
            self.wait_for_commit()
        except IngestCommitError as exc:
            return str(exc)
        return None

    def _without_stored_inbox_versions(self, batch: pa.Table) -> pa.Table:
        """The batch without inbox versions the txlog has folded in already. Only a new checkpoint (one lost
        and begun again) reads them: its inbox stream starts at the first version, whose files inbox cleanup
        may have removed, and whose rows are stored."""
        stored = _stored_versions(batch, self.state.inbox_version)
        if stored is None:
            return batch
        log.info("%s: %d inbox versions already stored (through %d) are not read again", self.cfg.name,
                 pc.sum(stored).as_py(), self.state.inbox_version)
        return batch.filter(pc.invert(stored))

    def write_arrow(self, batch: pa.Table, batch_id: int) -> None:
        started = time.perf_counter()
        if self._checkpoint_id is not None:
            checkpoint = self._checkpoint_id()
            if checkpoint:  # (Spark writes it before the first batch; until it is read, asked again)
                self._checkpoint_id = None
                for appender in (self.txlog, self.rejected):
                    appender.rebind(f"{INGEST_APP}:{checkpoint}")
            else:
                log.warning("%s: the ingest checkpoint's query id is not readable yet; batch %d commits as %r",
                            self.cfg.name, batch_id, self.txlog.app_id)
        if self.txlog.is_committed(batch_id):
            log.info("%s: ingest batch %d already committed; replay skipped", self.cfg.name, batch_id)
            self.on_commit(self.state.max_seq, Classified.empty(logons_in(batch)))
            return
        batch = self._without_stored_inbox_versions(batch)
        inbox_version = _newest_inbox_version(batch)
        if self.expand is not None:
            batch = self.expand(batch)
        for clash in self.sessions.observe(batch, batch_id):
            log.error("%s: %s (the later session %s is told so)", self.cfg.name, clash.reason, clash.later)
            if self.on_clash is not None:
                try:
                    self.on_clash(clash)
                except Exception as exc:  # telling the publisher must not fail the batch
                    log.error("%s: the failure ack for the clash on %r could not be sent: %s", self.cfg.name,
                              clash.client, exc)
        # Spark's own inputRowsPerSecond counts only rows its jobs read; batches read in the driver are not among them.
        if self._last_batch_at is not None and started > self._last_batch_at:
            self.stats["input_rows_per_second"] = batch.num_rows / (started - self._last_batch_at)
        self._last_batch_at = started
        now = datetime.now(timezone.utc)
        taken = None
        if self.staged is not None:
            self._enter(batch_id, "taking its staged backfill parts")
            taken = self.staged.take(batch, self.state.publishers, self.state.max_seq, now)
            batch = taken.candidates
        self._enter(batch_id, "classifying its rows")
        # (the staged parts stored as they are hold the batch's first seqs)
        after_parts = (dataclasses.replace(self.state, max_seq=self.state.max_seq + taken.rows) if taken is not None
                       else self.state)
        with _no_cyclic_gc():
            result = classify(batch, after_parts, instance=self.cfg.name, recorded=self.recorded, sow=self.sow,
                              queues=self.queues, now=now)
        if taken is not None:
            _add_parts(result, taken)
        if result.rejected_rows.num_rows:
            self._enter(batch_id, "writing rejected rows")
            self.rejected.append(result.rejected_rows, batch_id)
        failpoints.hit("ingest.before_txlog_commit")
        last_seq = after_parts.max_seq + result.txlog_rows.num_rows
        metadata = {
            "batch": batch_id,
            "first_seq": self.state.max_seq + 1,
            "last_seq": last_seq,
            "publishers": result.publishers,
            "links": result.links,
        }
        if inbox_version is not None:  # (inbox cleanup removes what is stored: versions through this one)
            metadata["inbox_version"] = inbox_version
        self._enter(batch_id, "committing to the txlog")
        files = None
        if taken is not None and taken.stored:
            txlog_dir = self.txlog.path
            assert isinstance(txlog_dir, Path), "staged parts are stored as they are on a local disk only"
            files = taken.actions(txlog_dir, now)
        appended = self.txlog.append(result.txlog_rows, batch_id, metadata, files)
        failpoints.hit("ingest.after_txlog_commit")
        if taken is not None:
            taken.clean_up()
        with self._state_lock:
            self.state.apply(self.txlog.version, metadata)
        if appended and self.txlog_committed is not None:  # replicators take them without reading them back
            self.txlog_committed(result.txlog_rows)
        if appended and self.sow_committed is not None:  # the compactor folds these rows without reading them back
            self.sow_committed(result.txlog_rows, metadata["first_seq"], last_seq)
        if self.queue_committed is not None:
            self.queue_committed(result.txlog_rows, result.queue_requests, metadata["first_seq"], last_seq)
        failpoints.hit("ingest.before_ack")
        self._enter(batch_id, "acknowledging")
        self.on_commit(last_seq, result)
        self.stats["batches"] += 1
        self.stats["accepted"] += result.txlog_rows.num_rows + (taken.rows if taken is not None else 0)
        self.stats["rejected"] += result.rejected_rows.num_rows
        self.stats["duplicates"] += result.duplicates
        self.stats["last_batch_ms"] = (time.perf_counter() - started) * 1000
        if self.sow is not None:  # last: its thread would slow the acknowledgements (both hold the GIL)
            self.sow.apply_in_background(result.sow, self.state.max_seq)


class IngestCommitError(RuntimeError):
    """A batch handed over by Spark was not committed to the txlog (the cause is chained)."""


def _add_parts(result: Classified, taken) -> None:
    """The staged parts stored as they are, and those stored already, in the batch's result (its acks)."""
    for client, seq in taken.publishers().items():
        result.publishers[client] = max(result.publishers.get(client, 0), seq)
    result.publisher_rows.update(taken.publisher_rows())  # (a client of a stored part has no classified row)
    result.duplicates += taken.duplicates
    if taken.rejected is not None:
        result.rejected_rows = pa.concat_tables([result.rejected_rows, taken.rejected])


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """The cyclic collector off while a batch is classified: parsing its bodies allocates ~10 objects a row,
    and each collection that triggers walks every object of the process (a SOW state holds millions).
    The batch makes no reference cycles; reference counting frees its objects as usual."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _stored_versions(batch: pa.Table, stored_through: int) -> pa.Array | None:
    """Which of the batch's rows are inbox versions at or below ``stored_through`` (None: no such row)."""
    if stored_through < 0 or "inbox_version" not in batch.column_names:
        return None
    stored = pc.fill_null(pc.less_equal(batch["inbox_version"], stored_through), False)
    return stored if pc.any(stored).as_py() else None


def _newest_inbox_version(batch: pa.Table) -> int | None:
    """The newest inbox version the batch reads (its versions are all those after the previous batch's)."""
    if "inbox_version" not in batch.column_names:
        return None
    newest = pc.max(batch["inbox_version"]).as_py()
    return int(newest) if newest is not None else None
