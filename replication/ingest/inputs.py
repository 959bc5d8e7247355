"""Streaming inputs of the ingest query, mapped onto the candidate columns of :mod:`replication.ingest.classify`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replication import routing
from replication.config import link_auth
from replication.config.model import DEFAULT_BATCH_ROWS, InstanceConfig
from replication.connectors.delta.log import commit_info
from replication.connectors.kafka.ranges import RangeReader
from replication.connectors.kafka.source import (
    KafkaSourceOptions,
    KafkaStreamReader,
)
from replication.connectors.spark import planned_batch
from replication.connectors.spark.planned_batch import PlannedBatch
from replication.connectors.spark.planned_read_ahead import PlannedReadAhead
from replication.inbox import staged_parts as staged
from replication.inbox import stream as inbox_stream
from replication.inbox.entitlement import Entitlements
from replication.inbox.read_ahead import InboxReadAhead
from replication.inbox.schema import INBOX_SCHEMA
from replication.inbox.signing import CommitVerifier, Refusal
from replication.inbox.versions import read_versions, staged_parts
from replication.ingest import spark_kafka
from replication.ingest.classify import CANDIDATE_SCHEMA
from replication.messages import BACKFILL_LINK
from replication.storage.layout import INGEST_QUERY, StorageLayout

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from replication.config.model import KafkaTransport

log = logging.getLogger(__name__)


def publish_stream(spark: SparkSession, cfg: InstanceConfig) -> DataFrame:
    """Kafka publishes of every ``kafka`` transport, as candidate rows (DESIGN §7 wire format) with each
    record's raw headers in :data:`spark_kafka.HEADERS`: :func:`spark_candidates` takes them out once the
    batch is collected."""
    from pyspark.sql import functions as F

    frames = []
    for transport in cfg.kafka_transports:
        raw = spark.readStream.format("kafka").options(**spark_kafka_options(transport)).load().select(
            F.col("topic").alias("kafka_topic"), F.col("partition").alias("kafka_partition"),
            F.col("offset").alias("kafka_offset"), F.col("timestamp").alias("kafka_timestamp"), "key", "value",
            "headers")
        frames.append(raw.select(*_spark_columns(spark_kafka.without_headers(kafka_candidate_columns(transport))),
                                 F.col("headers").alias(spark_kafka.HEADERS)))
    return _union(frames)


def spark_kafka_options(transport: KafkaTransport) -> dict[str, str]:
    """The ingest query's options of Spark's ``format("kafka")`` for one transport.

    Every partition from its earliest offset, as the project's reader plans batch 0; a range that retention
    removed before it was read is logged by Spark and skipped (``failOnDataLoss``): the instance keeps running.
    """
    return {
        "kafka.bootstrap.servers": ",".join(transport.bootstrap_servers),
        "subscribePattern": spark_kafka.topics_pattern(transport.topics),
        "startingOffsets": "earliest",
        "failOnDataLoss": "false",
        "includeHeaders": "true",
        "maxOffsetsPerTrigger": str(transport.max_offsets_per_trigger),
        **transport.security.spark_kafka(),
    }


def kafka_options(transport: KafkaTransport) -> dict[str, str]:
    """The options of the project's ``replication-kafka`` reader for one transport (the driver's reads)."""
    return {
        "bootstrap.servers": ",".join(transport.bootstrap_servers),
        "topics": ",".join(transport.topics),
        "maxOffsetsPerTrigger": str(transport.max_offsets_per_trigger),
        # Batches up to DRIVER_READ_MAX_ROWS are read in the driver by the writer (DriverRead): the planner need not.
        "driverReadRows": "0",
        **transport.security.to_options(),
    }


def kafka_candidate_columns(transport: KafkaTransport) -> dict[str, tuple]:
    """How each candidate column comes from a Kafka source row (``kafka_source.SCHEMA``): the one mapping for
    Spark and for Arrow.

    ``("col", name)``: that column; ``("first", name, default)``: that column,
    or ``default`` where it is null; ``("lit", value)``: a constant (None: null).
    """
    return _candidate_columns(transport.message_type)


def _candidate_columns(message_type: str) -> dict[str, tuple]:
    return {
        "source": ("lit", "kafka"),
        "kafka_topic": ("col", "kafka_topic"),
        "kafka_partition": ("col", "kafka_partition"),
        "kafka_offset": ("col", "kafka_offset"),
        "publisher": ("col", "h_client"),
        "publisher_seq": ("col", "h_seq"),
        "topic": ("first", "h_topic", ("col", "kafka_topic")),
        "message_type": ("first", "h_type", ("lit", message_type)),
        "command": ("first", "h_command", ("lit", "publish")),
        "sow_key": ("col", "h_sow_key"),
        "sow_keys": ("col", "h_sow_keys"),
        "filter": ("col", "h_filter"),
        "data": ("col", "value"),
        "publish_time": ("col", "kafka_timestamp"),
        "session": ("col", "h_session"),
        **{name: ("lit", None) for name in ("origin", "received_from", "received_from_group", "path",
                                             "upstream_seq", "refused", "inbox_version")},
    }


#: The candidate column each DESIGN §7 publish header fills (header key -> column).
PUBLISH_HEADER_COLUMNS = spark_kafka.header_columns(_candidate_columns("json"))


def spark_candidates(batch: pa.Table) -> pa.Table:
    """An ingest batch as Spark collected it, as candidate rows: its Kafka records' headers taken out."""
    return spark_kafka.with_publish_headers(batch, PUBLISH_HEADER_COLUMNS)


def _spark_columns(spec: dict[str, tuple]) -> list:
    from pyspark.sql import functions as F

    def column(how: tuple):
        if how[0] == "col":
            return F.col(how[1])
        if how[0] == "first":
            return F.coalesce(F.col(how[1]), column(how[2]))
        return F.lit(how[1])

    return [column(spec[name]).cast(_spark_type(name)).alias(name) for name in CANDIDATE_SCHEMA.names]


def kafka_candidates(rows: pa.Table, transport: KafkaTransport) -> pa.Table:
    """Kafka source rows (``kafka_source.SCHEMA``) as candidate rows, without Spark."""
    spec = kafka_candidate_columns(transport)
    n = rows.num_rows

    def column(how: tuple, field: pa.Field):
        if how[0] == "col":
            return rows[how[1]].cast(field.type)
        if how[0] == "first":
            return pc.coalesce(rows[how[1]].cast(field.type), column(how[2], field))
        if how[1] is None:
            return pa.nulls(n, field.type)
        return pa.repeat(pa.scalar(how[1], field.type), n)

    return pa.table({f.name: column(spec[f.name], f) for f in CANDIDATE_SCHEMA}, schema=CANDIDATE_SCHEMA)


def inbox_versions_stream(spark: SparkSession, cfg: InstanceConfig, layout: StorageLayout) -> DataFrame:
    """The versions upstream instances committed to this instance's inbox, one candidate row each.

    Spark tracks the inbox position exactly once (Delta versions in the ingest
    query's checkpoint); the rows of those versions are fetched by the ingest
    writer with :class:`InboxRows`, so message bodies do not travel through the JVM.
    """
    from pyspark.sql import functions as F

    inbox_stream.register(spark)
    raw = (
        spark.readStream.format(inbox_stream.FORMAT).option("path", str(layout.inbox))
        .option("versionsOnly", "true")
        .option("maxRowsPerTrigger", str(DEFAULT_BATCH_ROWS)).load()
    )
    return raw.select(
        *[F.lit(INBOX_MARK if name == "source" else None).cast(_spark_type(name)).alias(name)
          for name in CANDIDATE_SCHEMA.names if name != "inbox_version"],
        F.col("inbox_version"),
        *([F.lit(None).cast(_HEADERS_SPARK_TYPE).alias(spark_kafka.HEADERS)] if cfg.kafka_transports else []),
    )


#: ``source`` of a candidate row that stands for one inbox version.
INBOX_MARK = "inbox-version"


class InboxRows:
    """The ingest writer's ``expand``: inbox version rows replaced by the rows those versions hold.

    The rows are read with :func:`replication.inbox.versions.read_versions` and
    mapped onto the candidate columns: ``source`` ``inbox:<upstream>``,
    ``received_from``/``received_from_group`` from the upstream, ``path`` the
    upstream's path plus this instance. They follow the batch's other rows,
    per upstream in the upstream's order.
    """

    def __init__(self, cfg: InstanceConfig, inbox: str) -> None:
        self.instance = cfg.name
        self.inbox = inbox
        keys = link_auth.verifying_keys(cfg)
        self.verifier = CommitVerifier(inbox, keys, cfg.name) if keys is not None else None
        """Checks each commit's signature before its rows are taken (``<Authentication>``); None: all taken."""
        rules = cfg.replication_transport.entitlements if cfg.replication_transport is not None else None
        self.entitlements = Entitlements(cfg.name, rules) if rules is not None else None
        """Who may replicate which topics in (``<Entitlement>``); None: everything is allowed."""
        self.refusals: dict[str, dict] = {}
        """Per upstream named: commits and rows refused since start, the last reason and when."""
        self._counted_through = -1
        """Inbox versions through this one are in ``refusals`` (a retried batch is not counted twice)."""
        self._lock = threading.RLock()
        """One batch at a time: the ingest writer maps the next batch's rows while it commits the last."""

    def __call__(self, batch: pa.Table) -> pa.Table:
        with self._lock:
            return self._expand(batch)

    def _expand(self, batch: pa.Table) -> pa.Table:
        marks = pc.equal(batch["source"], INBOX_MARK)
        if not pc.any(marks).as_py():
            return batch
        versions = pc.filter(batch["inbox_version"], marks)
        first, last = pc.min(versions).as_py(), pc.max(versions).as_py()
        rows = read_versions(self.inbox, first, last)
        rows = rows.filter(pc.is_in(rows["inbox_version"], versions.combine_chunks()))
        wanted = set(versions.to_pylist())
        parts = [(v, text) for v, text in staged_parts(self.inbox, first, last) if v in wanted]
        others = batch.filter(pc.invert(pc.fill_null(marks, False)))
        return pa.concat_tables([others.select(CANDIDATE_SCHEMA.names).cast(CANDIDATE_SCHEMA),
                                 self.candidates(rows, parts)])

    def candidates(self, rows: pa.Table, parts: list[tuple[int, str]] | None = None) -> pa.Table:
        """Inbox rows (``replication.inbox.schema.STREAM_SCHEMA``) as candidate rows, and a marker row for each staged
        backfill part ``(version, descriptor)`` among them in version order (:mod:`replication.ingest.staged_parts`).

        Rows a backfill wrote (link ``BACKFILL_LINK``) are this instance's own
        publishes: source ``backfill``, not received from anyone, no upstream position.
        """
        with self._lock:
            return self._mapped(rows, parts)

    def _mapped(self, rows: pa.Table, parts: list[tuple[int, str]] | None) -> pa.Table:
        unverified = refused = None
        if self.verifier is not None:
            unverified, parts = self._verify(rows, parts or [])
        refused = unverified
        if self.entitlements is not None:
            refused = self._entitle(rows, unverified)
        out = self._candidates(rows, refused, unverified)
        if rows.num_rows:
            self._counted_through = max(self._counted_through, int(pc.max(rows["inbox_version"]).as_py()))
        if not parts:
            return out
        # a staged part's version adds no rows: its marker goes after the rows of the versions before it
        at = np.searchsorted(rows["inbox_version"].to_numpy(), [v for v, _ in parts], side="right")
        pieces, previous = [], 0
        for k, cut in enumerate(at.tolist()):
            pieces += [out.slice(previous, cut - previous), staged.markers([parts[k]])]
            previous = cut
        return pa.concat_tables(pieces + [out.slice(previous)])

    def _verify(self, rows: pa.Table, parts: list[tuple[int, str]]) -> tuple[pa.Array | None,
                                                                          list[tuple[int, str]]]:
        """Each row's refusal (null: taken) by its commit's verdict, and the staged parts that may be taken:
        none (a backfill's staged part is not signed)."""
        assert self.verifier is not None
        for version, _descriptor in parts:
            if version > self._counted_through:
                self._refuse(Refusal("backfill", f"inbox commit {version}: a staged backfill part is not signed, "
                                                 "and this instance takes only signed commits"), 0)
        n = rows.num_rows
        if n == 0:
            return None, []
        versions = rows["inbox_version"].to_numpy()
        starts = np.flatnonzero(np.r_[True, versions[1:] != versions[:-1]])
        ends = np.r_[starts[1:], n]
        pieces, any_refused = [], False
        for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
            version = int(versions[start])
            refusal = self.verifier.check(version, rows.slice(start, end - start).select(INBOX_SCHEMA.names),
                                          commit_info(self.inbox, version))
            if refusal is not None:
                if version > self._counted_through:
                    self._refuse(refusal, end - start)
                any_refused = True
            pieces.append(pa.repeat(pa.scalar(refusal.reason if refusal else None, pa.string()), end - start))
        return (pa.concat_arrays(pieces) if any_refused else None), []

    def _entitle(self, rows: pa.Table, refused: pa.Array | None) -> pa.Array | None:
        """``refused`` with the rows the entitlements refuse added (each one counted for its upstream)."""
        assert self.entitlements is not None
        denied = self.entitlements.refusals(rows)
        if denied is None:
            return refused
        if refused is not None:
            denied = pc.if_else(pc.is_valid(refused), pa.scalar(None, pa.string()), denied)
        new = pc.greater(rows["inbox_version"], self._counted_through)
        for (upstream, reason), count in _counts(pc.filter(rows["link"], new), pc.filter(denied, new)).items():
            self._refuse(Refusal(upstream, reason), count, commits=0)
        return denied if refused is None else pc.coalesce(refused, denied)

    def _refuse(self, refusal: Refusal, rows: int, *, commits: int = 1) -> None:
        log.error("%s: %s (%d rows to rejected/)", self.instance, refusal.reason, rows)
        seen = self.refusals.setdefault(refusal.upstream, {"commits": 0, "rows": 0})
        seen.update(commits=seen["commits"] + commits, rows=seen["rows"] + rows, last=refusal.reason,
                    at=time.time())

    def _candidates(self, rows: pa.Table, refused: pa.Array | None = None,
                    unverified: pa.Array | None = None) -> pa.Table:
        """``refused``: why each row is refused (null: not); ``unverified``: those of them whose commit did not
        verify, which move no upstream's acknowledgement (a row not entitled was still sent by its upstream,
        and is handled: rejected here)."""
        n = rows.num_rows
        link = rows["link"]
        backfilled = pc.fill_null(pc.equal(link, BACKFILL_LINK), False)
        columns = {
            "kafka_topic": pa.nulls(n, pa.string()),
            "kafka_partition": pa.nulls(n, pa.int32()),
            "kafka_offset": pa.nulls(n, pa.int64()),
            "publisher_seq": pc.cast(rows["publisher_seq"], pa.string()),
            "session": pa.nulls(n, pa.string()),
            "refused": refused if refused is not None else pa.nulls(n, pa.string()),
        }
        if n and pc.all(backfilled).as_py():  # a backfill's batch: constants (its path, as a publish's: here)
            columns.update({"source": pa.repeat(pa.scalar("backfill"), n), "received_from": pa.nulls(n, pa.string()),
                            "received_from_group": pa.nulls(n, pa.string()),
                            "path": pa.nulls(n, pa.list_(pa.string())), "upstream_seq": pa.nulls(n, pa.int64())})
        else:
            upstream = pc.if_else(backfilled, pa.scalar(None, pa.string()), link)
            columns.update({
                "source": pc.if_else(backfilled, "backfill",
                                     pc.binary_join_element_wise(pa.scalar("inbox:"), link, "")),
                "received_from": upstream,
                "received_from_group": pc.if_else(backfilled, pa.scalar(None, pa.string()), rows["link_group"]),
                "path": routing.received_paths(rows["path"], self.instance),
                "upstream_seq": pc.if_else(backfilled if unverified is None else pc.or_(backfilled, pc.is_valid(
                    unverified)), pa.scalar(None, pa.int64()), rows["upstream_seq"]),
            })
        return pa.table(
            {name: columns[name] if name in columns else rows[name] for name in CANDIDATE_SCHEMA.names},
            schema=CANDIDATE_SCHEMA,
        )


def _counts(links: pa.ChunkedArray, reasons: pa.Array) -> dict[tuple[str, str], int]:
    """Rows per (link, reason) among those with a reason."""
    keep = pc.is_valid(reasons)
    pairs = pa.table({"link": pc.filter(links, keep), "reason": pc.filter(reasons, keep)})
    counted = pairs.group_by(["link", "reason"]).aggregate([([], "count_all")])
    return {(link, reason): count for link, reason, count in zip(
        counted["link"].to_pylist(), counted["reason"].to_pylist(), counted["count_all"].to_pylist(), strict=True)}


#: A read in the driver that gets no records for this long gives the batch to Spark's tasks.
DRIVER_READ_STALL_S = 15.0
#: A read ahead that gets no records for this long gives up (the batch's call reads it again).
READ_AHEAD_STALL_S = 2.0


@dataclass(frozen=True)
class _Plan:
    """What a batch reads: per Kafka transport its partitions' ranges, and its inbox versions."""

    ranges: list[tuple[dict, dict]]
    """As the offset log gives them (compared to take what was read ahead)."""
    kafka: list[tuple[KafkaTransport, RangeReader, list]]
    versions: tuple[int, int] | None


@dataclass(frozen=True)
class _Read:
    """A batch's rows as read, before they become candidate rows (in the caller's thread)."""

    ranges: list[tuple[dict, dict]]
    kafka: list[tuple[KafkaTransport, pa.Table]]
    inbox: tuple[pa.Table, list[tuple[int, str]]] | None


class DriverRead:
    """The ingest writer's own read of a small micro-batch, as candidate rows; None: collect Spark's.

    The batch's ranges come from the ingest query's offset log
    (:mod:`replication.connectors.spark.planned_batch`), one per source in the order
    :func:`ingest_stream` unions them: each Kafka transport, then the inbox.
    Kafka ranges are read with the source's decoding (one consumer kept per
    transport, ``kafka_source.RangeReader``) and mapped with
    :func:`kafka_candidates`, inbox versions with :class:`InboxRows`. The rows
    and their order are those Spark would have collected. With a local
    checkpoint, the next batch is read as soon as Spark has planned it
    (:mod:`replication.connectors.spark.planned_read_ahead`).
    """

    def __init__(self, cfg: InstanceConfig, layout: StorageLayout, inbox: InboxRows | None = None) -> None:
        """``inbox``: the writer's :class:`InboxRows` (one verifier of the inbox's commits); default a new one."""
        checkpoint = layout.checkpoint(INGEST_QUERY)
        self.planned = PlannedBatch(checkpoint)
        self.kafka = [(t, KafkaSourceOptions.parse(kafka_options(t))) for t in cfg.kafka_transports]
        self.readers = [RangeReader(options) for _t, options in self.kafka]
        if inbox is None and cfg.replication_transport is not None:
            inbox = InboxRows(cfg, str(layout.inbox))
        self.inbox = inbox
        # (the inbox stream's batches hold about DEFAULT_BATCH_ROWS rows: read about one ahead)
        self.inbox_reads = InboxReadAhead(str(layout.inbox), DEFAULT_BATCH_ROWS) if self.inbox is not None else None
        self.batches = 0
        """Micro-batches read in the driver rather than by a Spark job."""
        self.ahead = PlannedReadAhead.of_checkpoint(checkpoint, self._read_ahead, f"{cfg.name} ingest")
        """Reads the next batch once Spark has planned it (a local checkpoint only)."""

    def __call__(self, batch_id: int) -> pa.Table | None:
        plan = self._plan(self.planned, batch_id, initial=self._initial_offsets)
        # (the read-ahead thread is done after take: the readers are this thread's again)
        read = self.ahead.take(batch_id, lambda ahead: plan is not None and ahead.ranges == plan.ranges) \
            if self.ahead is not None else None
        try:
            if plan is None:
                return None
            table = self._candidates(read if read is not None else self._read(plan, DRIVER_READ_STALL_S))
        except Exception:
            # Spark's tasks read the same ranges with their own consumers and retries.
            log.warning("ingest batch %d: reading it in the driver failed; Spark reads it instead", batch_id,
                        exc_info=True)
            self._close_readers()
            return None
        finally:
            if self.ahead is not None:
                self.ahead.start(batch_id + 1)
        self.batches += 1
        return table

    def _plan(self, planned: PlannedBatch, batch_id: int,
              initial: Callable[[], list[dict] | None] | None = None) -> _Plan | None:
        """What batch ``batch_id`` reads; None: Spark's tasks read it (not a layout known here, or too big)."""
        ranges = planned.ranges(batch_id, initial=initial)
        if ranges is None or len(ranges) != len(self.kafka) + (self.inbox is not None):
            return None
        plans, offsets = [], 0
        for (transport, options), reader, (start, end) in zip(self.kafka, self.readers, ranges):
            try:
                parts = KafkaStreamReader(options).partitions(start, end)
            except (AttributeError, TypeError, ValueError):  # not a Kafka offset: not the layout we know
                return None
            offsets += sum(p.end - p.start for p in parts)
            plans.append((transport, reader, parts))
        if offsets > planned_batch.DRIVER_READ_MAX_ROWS:
            return None
        versions = None
        if self.inbox is not None:
            start, end = ranges[-1]
            try:
                versions = (int(start["version"]) + 1, int(end["version"]))
            except (KeyError, TypeError, ValueError):
                return None
        return _Plan(ranges, plans, versions)

    def _read(self, plan: _Plan, stall_timeout: float) -> _Read:
        """The rows of ``plan`` as read, with the readers (the read-ahead thread calls this too, never while the
        caller reads); the mapping to candidate rows, which counts refusals, stays with the caller."""
        kafka = []
        for transport, reader, parts in plan.kafka:
            batches = reader.read(parts, stall_timeout=stall_timeout)
            if batches:
                kafka.append((transport, pa.Table.from_batches(batches)))
        inbox = None
        if plan.versions is not None and plan.versions[1] >= plan.versions[0]:
            assert self.inbox is not None and self.inbox_reads is not None  # versions are read with an inbox only
            inbox = (self.inbox_reads.read(*plan.versions), staged_parts(self.inbox.inbox, *plan.versions))
        return _Read(plan.ranges, kafka, inbox)

    def _read_ahead(self, plans: PlannedBatch, batch_id: int) -> _Read | None:
        plan = self._plan(plans, batch_id)
        return self._read(plan, READ_AHEAD_STALL_S) if plan is not None else None

    def _candidates(self, read: _Read) -> pa.Table:
        tables = [kafka_candidates(rows, transport) for transport, rows in read.kafka]
        if read.inbox is not None:
            assert self.inbox is not None
            tables.append(self.inbox.candidates(*read.inbox))
        return pa.concat_tables(tables) if tables else CANDIDATE_SCHEMA.empty_table()

    def _initial_offsets(self) -> list[dict] | None:
        """Where a new ingest query starts, per source (what its readers' ``initialOffset`` gave Spark): each
        Kafka topic's earliest offsets, the inbox's first version. Asked again here: a Kafka partition's earliest
        offset only moves forward, past records that no read could return any more. None: Kafka did not
        answer (Spark's tasks read the batch)."""
        starts = []
        for _transport, options in self.kafka:
            reader = KafkaStreamReader(options)
            try:
                starts.append(reader.initialOffset())
            except Exception:
                log.warning("ingest batch 0: the topics' earliest offsets could not be read; Spark reads it instead",
                            exc_info=True)
                return None
            finally:
                reader.stop()
        if self.inbox is not None:
            starts.append(dict(inbox_stream.InboxStreamReader.FIRST))
        return starts

    def close(self) -> None:
        if self.ahead is not None and not self.ahead.close(READ_AHEAD_STALL_S + 1):
            # a read ahead still under way (a broker not answering) uses the readers: it ends within its stall
            # limit, and its consumer goes with it
            log.warning("%s: a read ahead is still under way at stop; its Kafka consumer is left to it",
                        self.ahead.name)
            return
        self._close_readers()

    def _close_readers(self) -> None:
        for reader in self.readers:
            reader.close()
        if self.inbox_reads is not None:
            self.inbox_reads.close()


def _spark_type(name: str) -> str:
    from pyspark.sql.pandas.types import from_arrow_type

    return from_arrow_type(CANDIDATE_SCHEMA.field(name).type).simpleString()


def ingest_stream(spark: SparkSession, cfg: InstanceConfig, layout: StorageLayout) -> DataFrame | None:
    """Everything the ingest query reads: Kafka publishes and, with an incoming replication transport, the inbox."""
    frames = []
    if cfg.kafka_transports:
        frames.append(publish_stream(spark, cfg))
    if cfg.replication_transport is not None:
        frames.append(inbox_versions_stream(spark, cfg, layout))
    return _union(frames)


def _union(frames: list[DataFrame]) -> DataFrame | None:
    if not frames:
        return None
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    assert out.columns[:len(CANDIDATE_SCHEMA)] == CANDIDATE_SCHEMA.names, out.columns
    return out


_HEADERS_SPARK_TYPE = "array<struct<key:string,value:binary>>"
