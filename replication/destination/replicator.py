"""The replicator query of one destination: txlog rows, routed, appended to the destination's inbox.

Order of effects for replicator batch ``b`` (rows with local seq in (s, t]):

1. mark each row routed or not with the routing rules (the loop rule asks whether the instance
   actually reached, by its ``instance.json``, is on the row's path). The batch is read in
   the driver, its seq range taken from the query's offset log
   (:mod:`replication.connectors.spark.planned_batch`): from memory when this process's ingest
   has just committed every row of it (:mod:`replication.txlog.recent`), else from the
   txlog's Parquet files; and routed with
   :func:`replication.routing.route_mask`: no Spark job. Without a content filter that is
   every batch (the routing is computed once per distinct header combination); with one,
   a batch over ``DRIVER_READ_MAX_ROWS`` (a backlog, whose bodies Python would parse row by
   row) is routed by Spark with one native column
   (:func:`replication.routing.spark_condition`) over only the columns the
   rules read, which hands back (seq, routed) pairs; the routed rows are then
   taken here as above. Either way message bodies never travel
   through the JVM;
2. append the routed rows to the destination's ``inbox/`` with app transaction
   ``<this>-><destination>#<incarnation>``, version ``b`` (a replay finds it and skips);
3. tell the link which seqs were written and that (s, t] is decided: rows
   filtered out never wait for this destination's acknowledgement.

A crash between 2 and 3 replays ``b``: step 2 is skipped, step 3 runs.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from replication import failpoints, routing
from replication.config.model import DEFAULT_BATCH_ROWS, Destination, InstanceConfig
from replication.connectors.delta.tables import (
    IdempotentAppender,
)
from replication.connectors.spark import planned_batch
from replication.connectors.spark.planned_batch import PlannedBatch
from replication.connectors.spark.planned_read_ahead import PlannedReadAhead
from replication.inbox import signing
from replication.inbox.schema import INBOX_SCHEMA, INBOX_TABLE_CONFIGURATION
from replication.storage.layout import StoragePath, link_name, spark_location
from replication.txlog import stream as txlog_stream
from replication.txlog.files import TxlogFiles
from replication.txlog.runs import runs_of

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from replication.destination.link import Link
    from replication.txlog.recent import RecentTxlog

log = logging.getLogger(__name__)

#: The largest batch read and routed in the driver when no content filter reads bodies (every batch: the
#: query's ``maxRowsPerTrigger``). Spark's routing job would read the same files in a Python worker and hand
#: the decisions back; the routed rows are read here either way.
HEADER_ROUTED_MAX_ROWS = DEFAULT_BATCH_ROWS

#: How long stopping waits for a read ahead under way (a txlog read of one batch: ~0.3 s at 200k rows).
READ_AHEAD_WAIT_S = 5.0

_CODECS = {"zstd": "ZSTD", "snappy": "SNAPPY", "gzip": "GZIP", "lz4": "LZ4_RAW", "none": "UNCOMPRESSED"}


class ReplicatorWriter:
    """``foreachBatch`` of one replicator query (see the module docstring for the order of effects)."""

    def __init__(self, cfg: InstanceConfig, dest: Destination, *, txlog: StoragePath, inbox: StoragePath,
                 incarnation: str, link: Link, target: str, checkpoint: StoragePath | None = None,
                 start_seq: int = 0, recent: RecentTxlog | None = None) -> None:
        self.cfg = cfg
        self.dest = dest
        self.link = link
        self.target = target
        """The instance at the address in use (its ``instance.json`` name): the loop rule's subject. A
        destination named by its group, or failing over, reaches an instance of another name."""
        self.inbox = IdempotentAppender(
            inbox,
            INBOX_SCHEMA,
            app_id=link_name(cfg.name, dest.name, incarnation),
            name=f"{dest.name} inbox",
            configuration=INBOX_TABLE_CONFIGURATION,
            compression=_CODECS[dest.compression],
        )
        self.condition = routing.spark_condition(cfg, dest, target=target)
        self.reads_body = "data" in routing.spark_condition_columns(cfg, dest, target=target)
        """A content filter reads message bodies: a large batch is routed by Spark."""
        self.txlog = TxlogFiles(str(txlog))
        self.recent = recent
        """The rows the ingest committed last, taken from memory rather than read back from the txlog's files
        (:mod:`replication.txlog.recent`; None: always from the files)."""
        if recent is not None:
            recent.attach(dest.name, start_seq)
        self.start_seq = start_seq
        """The query's ``startSeq``: its source's initial offset, where its first batch starts."""
        self.planned = PlannedBatch(checkpoint) if checkpoint is not None else None
        """Where batches' seq ranges are found, to read them in the driver (see
        replication.connectors.spark.planned_batch)."""
        self.ahead = PlannedReadAhead.of_checkpoint(checkpoint, self._read_ahead, f"{cfg.name}->{dest.name}") \
            if checkpoint is not None else None
        """Reads and routes the next batch once Spark has planned it (a local checkpoint only; see
        replication.connectors.spark.planned_read_ahead)."""
        self.rows_sent = 0
        self.batches_read_in_driver = 0
        self.ranges_from_memory = 0
        """Txlog ranges taken from :attr:`recent` (the others were read from the txlog's files)."""
        self.signing_key = dest.signing_key.reveal().encode() if dest.signing_key is not None else None
        """HMAC key of this link's commits (the destination's ``<Authenticator>``, :mod:`replication.inbox.signing`)."""

    def __call__(self, df, batch_id: int) -> None:
        span = self._planned_span(self.planned, batch_id) if self.planned is not None else None
        # (the read-ahead thread is done after take: the txlog files are this thread's again)
        ahead = self.ahead.take(batch_id, lambda read: read[0] == span) if self.ahead is not None else None
        try:
            self._write(df, batch_id, span, ahead)
        finally:
            if self.ahead is not None:
                self.ahead.start(batch_id + 1)

    def _write(self, df, batch_id: int, span: tuple[int, int] | None,
               ahead: tuple[tuple[int, int], pa.Table, np.ndarray] | None) -> None:
        if span is not None and span[0] == span[1]:
            return  # an empty batch
        routed_here = self._route_here(*span, ahead) if span is not None else None
        if routed_here is not None:
            self._send(*routed_here, batch_id)
            return
        decided = df.select("seq", self.condition.alias("_routed")).toArrow()
        if decided.num_rows == 0:
            return
        seqs = decided["seq"].to_numpy()
        first, through = int(seqs.min()), int(seqs.max())
        routed_seqs = np.sort(seqs[decided["_routed"].to_numpy(zero_copy_only=False)])
        routed = None
        if routed_seqs.size:
            # seq is contiguous: the batch is exactly (first - 1, through], read in seq order.
            routed = self._txlog_rows(first - 1, through).take(pa.array(routed_seqs - first))
        self._send(routed, routed_seqs, through, batch_id)

    def close(self) -> None:
        """Stop reading ahead, and let go of the rows held for this replicator (the query has stopped)."""
        if self.ahead is not None:
            self.ahead.close(READ_AHEAD_WAIT_S)
        if self.recent is not None:
            self.recent.detach(self.dest.name)

    def _planned_span(self, planned: PlannedBatch, batch_id: int) -> tuple[int, int] | None:
        """(after, through) seqs of a batch small enough to read in the driver, from the offset log; else None."""
        # (the first batch starts at the source's initial offset, which Spark does not log: it is startSeq)
        ranges = planned.ranges(batch_id, initial=lambda: [{"seq": self.start_seq}])
        if ranges is None or len(ranges) != 1:
            return None
        start, end = ranges[0]
        try:
            after, through = int(start["seq"]), int(end["seq"])
        except (KeyError, TypeError, ValueError):
            return None
        most = planned_batch.DRIVER_READ_MAX_ROWS if self.reads_body else HEADER_ROUTED_MAX_ROWS
        return (after, through) if 0 <= through - after <= most else None

    def _read_and_route(self, after: int, through: int) -> tuple[pa.Table, np.ndarray]:
        """Txlog rows (after, through] and which of them are routed here."""
        rows = self._txlog_rows(after, through)
        return rows, routing.route_mask(self.cfg, self.dest, rows, target=self.target)

    def _txlog_rows(self, after: int, through: int) -> pa.Table:
        """Txlog rows (after, through] in seq order: from memory when the ingest just committed them all."""
        held = self.recent.read(after, through) if self.recent is not None else None
        if held is None:
            return self.txlog.read(after, through)
        self.ranges_from_memory += 1
        return held

    def _read_ahead(self, plans: PlannedBatch, batch_id: int) -> tuple[tuple[int, int], pa.Table, np.ndarray] | None:
        """(On the read-ahead thread.) The next batch's span, rows and routing, once Spark has planned it."""
        span = self._planned_span(plans, batch_id)
        return (span, *self._read_and_route(*span)) if span is not None and span[0] < span[1] else None

    def _route_here(self, after: int, through: int,
                    ahead: tuple[tuple[int, int], pa.Table, np.ndarray] | None = None,
                    ) -> tuple[pa.Table | None, np.ndarray, int] | None:
        """The batch (after, through] read from the txlog files and routed here, without a Spark job:
        (routed rows, their seqs, through); None when it could not be read in the driver (Spark routes it).
        ``ahead``: the batch's rows and routing, read ahead."""
        try:
            rows, mask = ahead[1:] if ahead is not None else self._read_and_route(after, through)
        except Exception:
            log.warning("%s->%s: seqs %d-%d could not be read in the driver; Spark reads them instead",
                        self.cfg.name, self.dest.name, after + 1, through, exc_info=True)
            return None
        self.batches_read_in_driver += 1
        routed_seqs = rows["seq"].to_numpy()[mask]
        return (rows.filter(pa.array(mask)) if routed_seqs.size else None), routed_seqs, through

    def _send(self, routed: pa.Table | None, routed_seqs: np.ndarray, through: int, batch_id: int) -> None:
        """Append the routed rows to the inbox (one idempotent commit), then tell the link."""
        if routed is not None and routed.num_rows:
            rows = self._inbox_rows(routed)
            self.inbox.append(rows, batch_id, {"link": self.cfg.name, "through": through},
                              commit_info=self._signature(rows, batch_id))
            self.rows_sent += routed.num_rows
        failpoints.hit("replicator.after_inbox_commit")
        self.link.on_sent(runs_of(routed_seqs), through)
        if self.recent is not None:
            self.recent.passed(self.dest.name, through)

    def _signature(self, rows: pa.Table, batch_id: int) -> dict[str, str] | None:
        """The commit's signature with the destination's ``<Authenticator>`` key (none without one)."""
        if self.signing_key is None:
            return None
        return {signing.SIGNATURE_KEY: signing.sign(self.signing_key, upstream=self.cfg.name, to=self.target,
                                                    app_id=self.inbox.app_id, batch=batch_id, rows=rows)}

    def _inbox_rows(self, routed: pa.Table) -> pa.Table:
        n = routed.num_rows
        columns = {name: routed[name] for name in INBOX_SCHEMA.names if name in routed.column_names}
        columns["upstream_seq"] = routed["seq"]
        columns["link"] = pa.array([self.cfg.name] * n, pa.string())
        columns["link_group"] = pa.array([self.cfg.group] * n, pa.string())
        return pa.table({name: columns[name] for name in INBOX_SCHEMA.names}, schema=INBOX_SCHEMA)


def start_query(
    spark: SparkSession,
    cfg: InstanceConfig,
    dest: Destination,
    *,
    txlog: StoragePath,
    inbox: StoragePath,
    checkpoint: StoragePath,
    start_seq: int,
    incarnation: str,
    link: Link,
    target: str,
    trigger_interval: str = "0 seconds",
    recent: RecentTxlog | None = None,
) -> tuple[StreamingQuery, ReplicatorWriter]:
    """Start the replicator query toward the inbox at ``inbox`` (one address of ``dest``, where the instance
    ``target`` runs); it and its writer."""
    txlog_stream.register(spark)
    stream = (
        spark.readStream.format(txlog_stream.FORMAT)
        .option("path", str(txlog))
        .option("columns", ",".join(routing.spark_condition_columns(cfg, dest, target=target)))
        .option("startSeq", str(start_seq))
        .option("maxRowsPerTrigger", str(DEFAULT_BATCH_ROWS))
        # Batches the writer reads in the driver (HEADER_ROUTED_MAX_ROWS; DRIVER_READ_MAX_ROWS with a content
        # filter) are not read by the planner either.
        .option("driverReadRows", "0")
        .load()
    )
    writer = ReplicatorWriter(cfg, dest, txlog=txlog, inbox=inbox, incarnation=incarnation, link=link,
                              target=target, checkpoint=checkpoint, start_seq=start_seq, recent=recent)
    query = (
        stream.writeStream.queryName(link_name(cfg.name, dest.name, incarnation))
        .foreachBatch(writer)
        .option("checkpointLocation", spark_location(checkpoint))
        .trigger(processingTime=trigger_interval)
        .start()
    )
    return query, writer
