"""One instance: its tables, its ingest query, its durability tracker and heartbeat.

Several instances may share one SparkSession; they share no state.

Lifecycle: ``start()`` creates missing tables, writes ``_control/instance.json``,
recovers the publisher state, re-announces persisted acks, then starts the
ingest query and the heartbeat. ``stop()`` stops the query (the current batch
finishes), writes a last heartbeat and closes the ack producer.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.dataset as ds
from kafka.errors import KafkaError

from replication import bootstrap
from replication.actions import DowngradeController, apply_manual_downgrades
from replication.config.link_auth import check_link_keys
from replication.config.model import InstanceConfig
from replication.config.security import check_security
from replication.connectors.delta.tables import IdempotentAppender, arrow_dataset, open_table
from replication.connectors.kafka.broker import ensure_topics
from replication.connectors.spark.commit_behind import rewind
from replication.connectors.spark.planned_batch import query_id
from replication.connectors.spark.trigger import trigger_seconds
from replication.destination.link import Link
from replication.destination.manager import DestinationManager
from replication.durability import AckSender, Durability, acks_topic
from replication.errors import ReplicationError
from replication.inbox.staged_parts import StagedParts
from replication.ingest.classify import TopicRecorder
from replication.ingest.inputs import DriverRead, InboxRows, ingest_stream
from replication.ingest.writer import INGEST_APP, IngestWriter
from replication.queues.dispatcher import QueueDispatcher
from replication.queues.wire import DELIVERY_PARTITIONS, deliveries_topic
from replication.sow.compactor import Compactor
from replication.sow.keys import SowTopics
from replication.sow.state import SowState
from replication.sow.table import SowTable, rebuild_state
from replication.storage.control import Heartbeat, write_instance_config
from replication.storage.layout import INGEST_QUERY, StorageLayout, spark_location
from replication.txlog.files import TxlogFiles, read_range
from replication.txlog.publishers import recover_state
from replication.txlog.reader import TxlogReader
from replication.txlog.recent import RecentTxlog
from replication.txlog.retention import Retention, retention_policy
from replication.txlog.schema import REJECTED_SCHEMA, TXLOG_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 1.0
#: A link with rows waiting and no progress for this long is reported stalled (log, heartbeat ``stalled``).
STALL_REPORT_S = 30.0
#: An ingest batch (or the planning of one) taking longer than this is reported, and again each time this passes.
SLOW_BATCH_REPORT_S = 30.0
#: First pause before a bootstrap source whose endpoint could not be reached is tried again; it doubles to the max.
BOOTSTRAP_RETRY_S = 1.0
MAX_BOOTSTRAP_RETRY_S = 30.0
#: The txlog columns that say whose ack a row holds back (see ``Durability``).
TXLOG_KEYS = pa.schema([TXLOG_SCHEMA.field(name) for name in ("seq", "publisher", "publisher_seq", "received_from")])


@dataclass
class _Progress:
    """A destination's positions and since when they have not moved while rows wait for it."""

    positions: tuple
    since: float
    reported: bool = False
    """Its stall was logged (its recovery will be too)."""


class Instance:
    """A running instance. Example::

        inst = Instance(config.load("conf/amps-1.xml"), spark)
        inst.start()
        ...
        inst.stop()
    """

    def __init__(self, cfg: InstanceConfig, spark: SparkSession, *, trigger_interval: str = "0 seconds") -> None:
        self.cfg = cfg
        self.spark = spark
        self.layout = StorageLayout.of(cfg.storage)
        self.trigger_interval = trigger_interval
        self.replicator_interval_s = trigger_seconds(trigger_interval)
        """The least time between two replicator batches (checked here, before anything starts)."""
        self.query: StreamingQuery | None = None
        self.writer: IngestWriter | None = None
        self.inbox_rows: InboxRows | None = None
        self.recent_txlog: RecentTxlog | None = None
        """The ingest's latest committed rows, for the replicators (none without destinations)."""
        self.durability: Durability | None = None
        self.started_at = time.time()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self.links: dict[str, Link] = {}
        self.managers: list[DestinationManager] = []
        self.controller: DowngradeController | None = None
        self.retention: Retention | None = None
        self.sow: SowState | None = None
        """Current records of the SOW topics (None: no SOW topics)."""
        self.compactor: Compactor | None = None
        self.queues: QueueDispatcher | None = None
        """Delivers the queues (None: no queue, or no Kafka transport for consumers to reach)."""
        self.restarts = 0
        self._progress: dict[str, _Progress] = {}
        self._next_restart = 0.0
        self._next_slow_report = 0.0
        self._next_bootstrap_log = 0.0

    @property
    def name(self) -> str:
        return self.cfg.name

    def start(self, stop: threading.Event | None = None) -> Instance:
        """Start serving; ``stop``: set, it ends a wait for a bootstrap source (the instance does not start)."""
        self.layout.root.mkdir(parents=True, exist_ok=True)
        write_instance_config(self.cfg, self.layout.instance_json)
        txlog = IdempotentAppender(self.layout.txlog, TXLOG_SCHEMA, app_id=INGEST_APP, name=f"{self.name} txlog")
        rejected = IdempotentAppender(self.layout.rejected, REJECTED_SCHEMA, app_id=INGEST_APP,
                                      name=f"{self.name} rejected")
        if bootstrap.needed(self.cfg, self.layout):  # before anything is served: no ingest, acks or replication yet
            self._bootstrap(stop or threading.Event())
            txlog.refresh()
        state = recover_state(txlog.table, self.layout.publishers_json)
        log.info("%s: recovered txlog at seq %d, %d publishers", self.name, state.max_seq, len(state.publishers))
        self._recover_sow(state.max_seq)

        sender = None
        for each in self.cfg.kafka_transports:
            check_security(each)
        check_link_keys(self.cfg)
        self._log_link_authentication()
        if self.cfg.kafka_transports:
            transport = self.cfg.kafka_transports[0]
            try:
                deliveries = {deliveries_topic(self.name): DELIVERY_PARTITIONS} if self.cfg.queues else {}
                ensure_topics(",".join(transport.bootstrap_servers), [acks_topic(self.name), *deliveries],
                              partitions=deliveries, security=transport.security)
            except KafkaError as exc:
                raise ReplicationError(
                    f"{self.name}: Kafka at {','.join(transport.bootstrap_servers)} "
                    f"({transport.security.describe()}) could not be reached or refused this client ({exc}). "
                    f"Fix: check the transport's <InetAddr> and <Security> ({transport.source}); the Kafka "
                    "client's log lines above say why") from None
            sender = AckSender(self.name, transport.bootstrap_servers, transport.security)
            if self.cfg.queues:  # before the ingest: its first acknowledgement check knows every message
                self.queues = QueueDispatcher(self.cfg, TxlogReader(self.layout, self.name),
                                              bootstrap=transport.bootstrap_servers, security=transport.security,
                                              refuse=sender.send_refusal,
                                              proxied_file=self.layout.proxied_transfer_json)
                self.queues.recover()
        self.links = {
            d.name: Link(self.layout.link_file(d.name), d.name, d.sync_type) for d in self.cfg.destinations
        }
        apply_manual_downgrades(self.links, self.layout)  # an operator's downgrade outlives a restart
        self.durability = Durability(
            sender,
            layout=self.layout,
            committed_seq=state.max_seq,
            publishers=state.publishers,
            upstreams=state.links,
            destinations=self.links,
            rows_since=self._txlog_keys,
            received_since=self._received_keys,
        )
        self.durability.announce()
        self.recent_txlog = RecentTxlog() if self.cfg.destinations else None
        self.inbox_rows = InboxRows(self.cfg, str(self.layout.inbox)) if self.cfg.replication_transport else None
        self.writer = IngestWriter(
            self.cfg,
            txlog=txlog,
            rejected=rejected,
            state=state,
            save_state=lambda s: s.save(self.layout.publishers_json),
            on_commit=self.durability.on_commit,
            expand=self.inbox_rows,
            driver_read=DriverRead(self.cfg, self.layout, self.inbox_rows),
            sow=self.sow,
            txlog_files=TxlogFiles(str(self.layout.txlog)) if self.sow is not None else None,
            sow_committed=self.compactor.committed if self.compactor is not None else None,
            staged=StagedParts(self.cfg, self.layout, TopicRecorder(self.cfg)) if self.cfg.replication_transport
            else None,
            on_clash=(lambda clash: sender.send_clash(clash.client, clash.later, clash.reason)) if sender else None,
            queues=self.queues,
            queue_committed=self.queues.committed if self.queues is not None else None,
            txlog_committed=self.recent_txlog.committed if self.recent_txlog is not None else None,
            checkpoint_id=lambda: query_id(self.layout.checkpoint(INGEST_QUERY)),
        )
        self._start_ingest()
        if self.queues is not None:
            self.queues.start()
        if self.compactor is not None:
            self.compactor.start()
        self.managers = [
            DestinationManager(
                self.cfg, dest, layout=self.layout, link=self.links[dest.name],
                on_ack=self.durability.release, min_batch_interval_s=self.replicator_interval_s,
                recent=self.recent_txlog,
            ).start()
            for dest in self.cfg.destinations
        ]
        self.controller = DowngradeController.from_config(self.cfg, self.links, self.durability,
                                                          started=self.started_at)
        if self.controller is not None:
            self.controller.start()
        policy = retention_policy(self.cfg)
        if policy is not None:
            self.retention = Retention(self.layout, policy, self._retention_limit, txlog,
                                       self._inbox_stored if self.inbox_rows is not None else None)
            self.retention.start()
        self.status().write(self.layout.heartbeat_json)
        self._heartbeat = threading.Thread(target=self._beat, name=f"{self.name}-heartbeat", daemon=True)
        self._heartbeat.start()
        return self

    def _retention_limit(self) -> tuple[int, str]:
        """The highest seq retention may remove through, and what holds it there: every destination's
        acknowledgement, durability, each SOW table's compaction, each queue's oldest message not yet
        acknowledged (a queue is folded from the txlog at start: its messages must stay in it)."""
        held = [(self.durability.durable_seq if self.durability is not None else 0, "durability")]
        held += [(link.acked_seq, f"destination {name}") for name, link in self.links.items()]
        if self.compactor is not None:
            held += [(table.compacted_through, f"SOW topic {table.sow.name}") for table in self.compactor.tables]
        if self.queues is not None:
            held += [(seq - 1, f"queue {name}") for name, seq in self.queues.oldest().items() if seq is not None]
        return min(held)

    def _inbox_stored(self) -> tuple[int, dict[str, int]]:
        """The inbox version stored through, and what was acknowledged to each upstream (inbox cleanup)."""
        stored = self.writer.state.inbox_version if self.writer is not None else -1
        return stored, dict(self.durability.upstream_acks) if self.durability is not None else {}

    def _bootstrap(self, stop: threading.Event) -> None:
        """Bootstrap, waiting (with a growing pause) while every source's endpoint is unreachable: an object
        store's outage ends by itself, a wrong address or credentials do not (those stop the start at once)."""
        pause = BOOTSTRAP_RETRY_S
        while True:
            try:
                bootstrap.run(self.cfg, self.layout, progress=self._log_bootstrap)
                return
            except bootstrap.BootstrapError as exc:
                if not exc.transient:
                    raise
                log.warning("%s: %s; trying again in %.0f s", self.name, exc, pause)
                if stop.wait(pause):
                    raise bootstrap.BootstrapError(f"{self.name}: stopped while waiting for a bootstrap source "
                                                   "to be reachable") from None
                pause = min(pause * 2, MAX_BOOTSTRAP_RETRY_S)

    def _log_bootstrap(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now >= self._next_bootstrap_log or done >= total:
            self._next_bootstrap_log = now + 5.0
            log.warning("%s: bootstrap: %d of %d source rows read", self.name, done, total)

    def _recover_sow(self, max_seq: int) -> None:
        """The SOW state as of the txlog's end: each SOW table's base plus the txlog rows after it."""
        if not self.cfg.sow_topics:
            return
        topics = SowTopics.of(self.cfg)
        self.sow = state = SowState(topics)
        tables = [SowTable(self.layout, sow, start_seq=max_seq) for sow in self.cfg.sow_topics]
        txlog_files = TxlogFiles(str(self.layout.txlog))
        txlog_files.refresh()
        rebuild_state(self.sow, tables, txlog_files, max_seq)
        log.info("%s: SOW recovered at seq %d: %d records", self.name, max_seq, self.sow.count())
        self.compactor = Compactor(self.name, tables, topics, str(self.layout.txlog), lambda: state.applied_seq)

    def _start_ingest(self) -> None:
        stream = ingest_stream(self.spark, self.cfg, self.layout)
        if stream is None:
            return
        self._rewind_ingest_checkpoint()
        self.query = (
            stream.writeStream.queryName(f"{self.name}.ingest")
            .foreachBatch(self.writer)
            .option("checkpointLocation", spark_location(self.layout.checkpoint(INGEST_QUERY)))
            .trigger(processingTime=self.trigger_interval)
            .start()
        )

    def _rewind_ingest_checkpoint(self) -> None:
        """Undo Spark's commit of a batch the txlog does not hold (the writer commits behind Spark by one
        batch at most: see :class:`IngestWriter`)."""
        assert self.writer is not None  # set before the ingest query it runs in
        checkpoint = self.layout.checkpoint(INGEST_QUERY)
        spark_query = query_id(checkpoint)
        if spark_query is None:  # a new checkpoint: Spark has committed nothing yet
            return
        txlog = self.writer.txlog
        committed = txlog.committed_version_of(f"{INGEST_APP}:{spark_query}")
        if committed is None:  # (batches committed while the checkpoint's id could not be read)
            committed = txlog.committed_version_of(INGEST_APP)
        rewind(self.spark, spark_location(checkpoint), committed, name=self.name)

    def _restart_ingest_if_failed(self) -> None:
        """A failed ingest query (a Python worker that could not start, a storage hiccup, a batch whose
        commit failed) is restarted.

        The writer first catches up with anything the txlog committed that it did
        not fold in, so ``seq`` numbering and duplicate detection stay exact.
        """
        if self.query is None or self._stop.is_set():
            return
        assert self.writer is not None
        # (a failure the next batch has not raised within a beat: Spark has long written its commit of the batch)
        failed_commit = self.writer.commit_failure(older_than=HEARTBEAT_INTERVAL_S)
        if self.query.isActive and failed_commit is None:
            return
        now = time.monotonic()
        if now < self._next_restart:
            return
        if self.query.isActive:  # the last batch's commit failed, and no batch came after it to fail the query
            self.query.stop()
        error = self._query_error() or failed_commit
        self.writer.drain()
        self.restarts += 1
        self._next_restart = now + min(60.0, 2.0 ** min(self.restarts, 6))
        log.error("%s: ingest query stopped (%s); restarting it (restart %d)", self.name, error, self.restarts)
        self.writer.catch_up()
        self._start_ingest()

    def _txlog_keys(self, after: int, through: int):
        """``seq``, ``publisher``, ``publisher_seq`` and ``received_from`` of the txlog rows ``after < seq <=
        through``."""
        return read_range(str(self.layout.txlog), after, through, schema=TXLOG_KEYS)

    def _received_keys(self, upstream: str, after: int, through: int):
        """``publisher``, ``publisher_seq`` and ``upstream_seq`` of the inbox rows ``upstream`` sent with
        ``after < upstream_seq <= through`` (inbox files are written in upstream order: their statistics
        keep this read to the last few)."""
        seq = ds.field("upstream_seq")
        wanted = (ds.field("link") == upstream) & (seq > after) & (seq <= through)
        return arrow_dataset(open_table(self.layout.inbox)).to_table(
            columns=["publisher", "publisher_seq", "upstream_seq"], filter=wanted)

    def status(self) -> Heartbeat:
        """What the heartbeat file says: liveness, positions, counters."""
        writer = self.writer
        state = writer.state if writer else None
        links = {name: self._link_status(name, link) for name, link in self.links.items()}
        now = time.time()
        return Heartbeat(
            instance=self.name,
            group=self.cfg.group,
            time=time.time(),
            started=self.started_at,
            running=bool(self.query and self.query.isActive) and not self._stop.is_set(),
            max_seq=state.max_seq if state else 0,
            txlog_version=state.txlog_version if state else -1,
            publishers=len(state.publishers) if state else 0,
            durable_seq=self.durability.durable_seq if self.durability else 0,
            counters=dict(writer.stats) if writer else {},
            links=links,
            input_rows_per_second=writer.stats["input_rows_per_second"] if writer else None,
            error=self._query_error(),
            restarts=self.restarts,
            batch=self._batch_step(),
            sow=self._sow_status(),
            queues=self.queues.status() if self.queues is not None else {},
            clashes={client: {"earlier": c.earlier, "later": c.later, "at": c.at}
                     for client, c in list(writer.sessions.clashes.items())} if writer else {},
            refusals={upstream: dict(seen) for upstream, seen in list(self.inbox_rows.refusals.items())}
            if self.inbox_rows is not None else {},
            stalled={name: link["waiting_since"] for name, link in links.items()
                     if link["waiting_since"] is not None and now - link["waiting_since"] > STALL_REPORT_S},
        )

    def _log_link_authentication(self) -> None:
        transport = self.cfg.replication_transport
        if transport is not None:
            keys = transport.upstream_keys
            if keys is None:
                log.info("%s: incoming replication is not authenticated: every commit in the inbox is taken "
                         "(add <Authentication> to transport %s to take only signed commits)", self.name,
                         transport.name)
            else:
                log.info("%s: incoming replication is authenticated: only commits signed by %s are taken",
                         self.name, ", ".join(name for name, _key in keys))
        unsigned = [d.name for d in self.cfg.destinations if d.signing_key is None]
        if unsigned:
            log.info("%s: commits to %s are not signed (no <Authenticator> on the destination's transport)",
                     self.name, ", ".join(unsigned))

    def _sow_status(self) -> dict[str, dict]:
        """Per SOW topic: records held now, and the txlog seq its table is compacted through."""
        if self.sow is None or self.compactor is None:
            return {}
        return {table.sow.name: {"records": self.sow.count(i), "compacted_through": table.compacted_through}
                for i, table in enumerate(self.compactor.tables)}

    def _batch_step(self) -> dict | None:
        """The ingest batch in progress: its id, what it is doing and for how long."""
        step = self.writer.step if self.writer else None
        if step is None:
            return None
        batch_id, what, since = step
        return {"id": batch_id, "step": what, "seconds": round(time.monotonic() - since, 1)}

    def _report_slow_ingest(self) -> None:
        """Say in the log what a slow ingest batch is doing: the first place an operator looks when acks stop."""
        if self.writer is None or self.query is None or not self.query.isActive:
            return
        now = time.monotonic()
        if now < self._next_slow_report:
            return
        step = self.writer.step
        if step is not None:
            batch_id, what, since = step
            if now - since < SLOW_BATCH_REPORT_S:
                return
            log.warning("%s: ingest batch %d has been %s for %.0fs", self.name, batch_id, what, now - since)
        else:
            if now - self.writer.idle_since < SLOW_BATCH_REPORT_S:
                return
            status = self.query.status  # an idle query (no data) is not slow: only one planning a batch with data
            if not (status.get("isTriggerActive") and status.get("isDataAvailable")):
                return
            log.warning("%s: no ingest batch has started for %.0fs; Spark says: %s", self.name,
                        now - self.writer.idle_since, status.get("message"))
        self._next_slow_report = now + SLOW_BATCH_REPORT_S

    def _link_status(self, name: str, link: Link) -> dict:
        out = link.snapshot().to_json()
        committed = self.durability.committed_seq if self.durability else 0
        out["lag_messages"] = max(0, committed - out["acked_seq"])
        out["lag_seconds"] = round(self.durability.link_age(link), 3) if self.durability else 0.0
        out["waiting_since"] = self._waiting_since(name, out)
        return out

    def _waiting_since(self, name: str, link: dict) -> float | None:
        """Since when rows have waited for this link with none of its positions moving (None: none waits).

        Says so in the log once when that passes :data:`STALL_REPORT_S`, and again when it moves."""
        now = time.time()
        previous = self._progress.get(name)
        if link["lag_seconds"] <= 0:
            self._progress.pop(name, None)
            self._report_moving(name, previous, now)
            return None
        # any acknowledgement (the prefix or runs above it), any send, any change of state is progress
        unacked_rows = sum(last - first + 1 for first, last in link["unacked"])
        positions = (link["sent_seq"], link["acked_seq"], unacked_rows, link["state"])
        if previous is None or previous.positions != positions:
            self._report_moving(name, previous, now)
            self._progress[name] = _Progress(positions, now)
            return now
        if now - previous.since > STALL_REPORT_S and not previous.reported:
            previous.reported = True
            log.warning("%s: destination %s stalled: rows have waited for it with no progress since %s (%s)",
                        self.name, name, time.strftime("%H:%M:%S", time.localtime(previous.since)), link["state"])
        return previous.since

    def _report_moving(self, name: str, previous: _Progress | None, now: float) -> None:
        if previous is not None and previous.reported:
            log.warning("%s: destination %s moves again after %.0fs", self.name, name, now - previous.since)

    def _query_error(self) -> str | None:
        if self.query is None:
            return None
        exc = self.query.exception()
        return str(exc).splitlines()[0] if exc else None

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_INTERVAL_S):
            try:  # apart: a control file it cannot read must not stop the heartbeat
                if apply_manual_downgrades(self.links, self.layout) and self.durability is not None:
                    self.durability.release()
            except Exception:
                log.exception("%s: applying the operators' downgrades failed", self.name)
            try:
                if self.writer is not None:
                    self.writer.snapshot_state()
                self.status().write(self.layout.heartbeat_json)
                self._restart_ingest_if_failed()
                self._report_slow_ingest()
            except Exception:  # a failed heartbeat must not kill the instance
                log.exception("%s: heartbeat or restart failed", self.name)

    def stop(self) -> None:
        self._stop.set()
        if self.controller is not None:
            self.controller.stop()
        if self.retention is not None:
            self.retention.stop()
        for manager in self.managers:
            manager.stop()
        if self.query is not None:
            try:
                self.query.stop()
            except Exception:
                log.exception("%s: stopping the ingest query failed", self.name)
        if self.writer is not None:
            failed = self.writer.drain()  # the last batch Spark handed over, committed before anything stops
            if failed is not None:
                log.error("%s: %s (the next start reads it again)", self.name, failed)
            try:
                self.writer.snapshot_state()  # (the batches since the heartbeat's last one)
            except Exception:
                log.exception("%s: writing publishers.json failed (recovery reads the txlog instead)", self.name)
            if isinstance(self.writer.driver_read, DriverRead):  # (the one start() gave)
                self.writer.driver_read.close()
        if self.compactor is not None:
            self.compactor.stop()  # the SOW tables current as of the last batch
        if self.queues is not None:
            self.queues.stop()
        if self._heartbeat is not None:  # (a put to S3 may take a while: the last word must be this one)
            self._heartbeat.join(timeout=35)
        self.status().write(self.layout.heartbeat_json)
        if self.durability is not None:
            self.durability.close()
