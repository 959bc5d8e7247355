"""The replicator query of one destination: txlog rows, routed, appended to the destination's inbox.

Order of effects for replicator batch ``b`` (rows with local seq in (s, t]):

1. mark each row routed or not with the routing rules (one native Spark column,
   :func:`replication.routing.spark_condition`). Spark sees only the columns
   the rules read (``data`` only with a content filter) and hands back
   (seq, routed) pairs; the routed rows themselves are read from the txlog's
   Parquet files here, so message bodies never travel through the JVM;
2. append the routed rows to the destination's ``inbox/`` with app transaction
   ``<this>-><destination>#<incarnation>``, version ``b`` (a replay finds it and skips);
3. tell the link which seqs were written and that (s, t] is decided: rows
   filtered out never wait for this destination's acknowledgement.

A crash between 2 and 3 replays ``b``: step 2 is skipped, step 3 runs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from replication import failpoints, routing
from replication.config import DEFAULT_BATCH_ROWS, Destination, InstanceConfig
from replication.delta_tables import IdempotentAppender
from replication.inbox_source import INBOX_SCHEMA, INBOX_TABLE_CONFIGURATION
from replication.links import runs_of

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from replication.links import Link

log = logging.getLogger(__name__)

_CODECS = {"zstd": "ZSTD", "snappy": "SNAPPY", "gzip": "GZIP", "lz4": "LZ4_RAW", "none": "UNCOMPRESSED"}


def app_id(cfg: InstanceConfig, dest: Destination, incarnation: str) -> str:
    """Delta app transaction of one replicator incarnation in the destination's inbox."""
    return f"{cfg.name}->{dest.name}#{incarnation}"


class ReplicatorWriter:
    """``foreachBatch`` of one replicator query (see the module docstring for the order of effects)."""

    def __init__(self, cfg: InstanceConfig, dest: Destination, *, txlog: Path, inbox: Path, incarnation: str,
                 link: "Link") -> None:
        from deltalake import WriterProperties

        from replication.txlog_source import TxlogFiles

        self.cfg = cfg
        self.dest = dest
        self.link = link
        self.inbox = IdempotentAppender(
            inbox,
            INBOX_SCHEMA,
            app_id=app_id(cfg, dest, incarnation),
            name=f"{dest.name} inbox",
            configuration=INBOX_TABLE_CONFIGURATION,
            writer_properties=WriterProperties(compression=_CODECS[dest.compression]),
        )
        self.condition = routing.spark_condition(cfg, dest)
        self.txlog = TxlogFiles(str(txlog))
        self.rows_sent = 0

    def __call__(self, df, batch_id: int) -> None:
        decided = df.select("seq", self.condition.alias("_routed")).toArrow()
        if decided.num_rows == 0:
            return
        seqs = decided["seq"].to_numpy()
        first, through = int(seqs.min()), int(seqs.max())
        routed_seqs = np.sort(seqs[decided["_routed"].to_numpy(zero_copy_only=False)])
        if routed_seqs.size:
            # seq is contiguous: the batch is exactly (first - 1, through], read in seq order.
            rows = self.txlog.read(first - 1, through)
            routed = rows.take(pa.array(routed_seqs - first))
            self.inbox.append(self._inbox_rows(routed), batch_id, {"link": self.cfg.name, "through": through})
            self.rows_sent += routed.num_rows
        failpoints.hit("replicator.after_inbox_commit")
        self.link.on_sent(runs_of(routed_seqs), through)

    def _inbox_rows(self, routed: pa.Table) -> pa.Table:
        n = routed.num_rows
        columns = {name: routed[name] for name in INBOX_SCHEMA.names if name in routed.column_names}
        columns["upstream_seq"] = routed["seq"]
        columns["link"] = pa.array([self.cfg.name] * n, pa.string())
        columns["link_group"] = pa.array([self.cfg.group] * n, pa.string())
        return pa.table({name: columns[name] for name in INBOX_SCHEMA.names}, schema=INBOX_SCHEMA)


def start_query(
    spark: "SparkSession",
    cfg: InstanceConfig,
    dest: Destination,
    *,
    txlog: Path,
    inbox: Path,
    checkpoint: Path,
    start_seq: int,
    incarnation: str,
    link: "Link",
    trigger_interval: str = "0 seconds",
) -> "StreamingQuery":
    """Start the replicator query toward the inbox at ``inbox`` (one address of ``dest``)."""
    from replication import txlog_source

    txlog_source.register(spark)
    stream = (
        spark.readStream.format(txlog_source.FORMAT)
        .option("path", str(txlog))
        .option("columns", ",".join(routing.spark_condition_columns(cfg, dest)))
        .option("startSeq", str(start_seq))
        .option("maxRowsPerTrigger", str(DEFAULT_BATCH_ROWS))
        .load()
    )
    writer = ReplicatorWriter(cfg, dest, txlog=txlog, inbox=inbox, incarnation=incarnation, link=link)
    return (
        stream.writeStream.queryName(f"{cfg.name}->{dest.name}#{incarnation}")
        .foreachBatch(writer)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=trigger_interval)
        .start()
    )
