"""``replication verify``'s comparisons as Spark jobs, for txlogs too large to hold in one process.

The same comparisons as :mod:`replication.verify.arrow`: routing is the
engine's own Spark condition (:func:`replication.routing.spark_condition`),
lookups are joins by bookmark, and only what is found comes back to the
driver: missing messages as ``publisher_seq`` ranges (computed in Spark), and
at most :data:`replication.verify.report.LISTED` bookmarks of differing bodies.
Each txlog is read as of the snapshot it had when first asked for, like the
Arrow engine's one read.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from replication import routing
from replication.config.fabric import Fabric
from replication.config.model import Destination, InstanceConfig
from replication.replay import snapshot
from replication.storage.layout import StorageLayout
from replication.txlog.reader import TxlogReader
from replication.verify.report import LISTED, Outcome, retained_since

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class SparkTxlogs:
    """Each instance's txlog as a DataFrame (one snapshot per instance), and the comparisons over them."""

    name = "spark"

    def __init__(self, fabric: Fabric, pattern: re.Pattern[str] | None, spark: SparkSession) -> None:
        self.fabric = fabric
        self.pattern = pattern
        self.spark = spark
        self._frames: dict[str, DataFrame] = {}

    def link(self, up: InstanceConfig, dest: Destination, down: str, acked: int) -> Outcome:
        from pyspark.sql import functions as F

        routed = (_still_held(self.rows(up.name).where(F.col("seq") <= acked), self.fabric[down])
                  .where(routing.spark_condition(up, dest, target=down))
                  .select("bookmark", "publisher", "publisher_seq", "data"))
        # presence by a marker column: a sow_delete by keys or filter has no body (data is null)
        held = self.rows(down).select("bookmark", F.col("data").alias("held_data"), F.lit(True).alias("held"))
        compared = routed.join(held, "bookmark", "left").select(
            "bookmark", "publisher", "publisher_seq", F.col("held").isNull().alias("absent"),
            (F.col("held").isNotNull() & ~F.col("data").eqNullSafe(F.col("held_data"))).alias("differs"))
        totals = compared.agg(F.count(F.lit(1)).alias("n"), F.sum(F.col("absent").cast("long")).alias("absent"),
                              F.sum(F.col("differs").cast("long")).alias("differs")).first()
        out = Outcome(int(totals["n"]))
        if totals["absent"]:
            out.missing = _ranges_by_publisher(compared.where("absent"))
        if totals["differs"]:
            out.differ_count = int(totals["differs"])
            out.differ = tuple(r["bookmark"] for r in
                               compared.where("differs").select("bookmark").orderBy("bookmark").limit(LISTED).collect())
        return out

    def group(self, here: str, acked: int, there: str, shared: Callable[[str, str], bool],
              in_flight: list[tuple[str, int]]) -> Outcome:
        from pyspark.sql import functions as F

        window = _still_held(self.rows(here).where(F.col("seq") <= acked), self.fabric[there])
        pairs = [(r["topic"], r["message_type"]) for r in window.select("topic", "message_type").distinct().collect()]
        wanted = [p for p in pairs if shared(*p)]
        if not wanted:
            return Outcome()
        topics = self.spark.createDataFrame(wanted, "topic string, message_type string")
        on_shared = window.join(F.broadcast(topics), ["topic", "message_type"])
        missing = on_shared.select("bookmark", "publisher", "publisher_seq").join(
            self.rows(there).select("bookmark"), "bookmark", "left_anti")
        for upstream, upstream_acked in in_flight:
            on_the_way = self.rows(upstream).where(F.col("seq") > upstream_acked).select("bookmark")
            missing = missing.join(on_the_way, "bookmark", "left_anti")
        return Outcome(on_shared.count(), _ranges_by_publisher(missing))

    def rows(self, name: str) -> DataFrame:
        """The instance's txlog rows as of its snapshot when first asked for (topics asked for only)."""
        if name not in self._frames:
            from pyspark.sql import functions as F

            log = TxlogReader(StorageLayout.of(self.fabric[name].storage), name)
            end = log.committed_seq()
            frame = snapshot(self.spark, log, 0, end).where(F.col("seq") <= end)
            if self.pattern is not None:
                frame = frame.where(F.col("topic").rlike(self.pattern.pattern))
            self._frames[name] = frame
        return self._frames[name]


def _still_held(rows: DataFrame, holder: InstanceConfig) -> DataFrame:
    """``rows`` less those ``holder``'s retention may have removed (see
    :func:`~replication.verify.report.retained_since`)."""
    from pyspark.sql import functions as F

    since = retained_since(holder)
    if since is None:
        return rows
    return rows.where(F.col("persist_time").isNull()
                      | (F.col("persist_time") >= F.lit(since).cast("timestamp")))


def _ranges_by_publisher(rows: DataFrame) -> dict[str, tuple[tuple[int, int], ...]]:
    """publisher -> runs of consecutive ``publisher_seq`` (gaps and islands: seq minus its rank is constant
    along a run), computed in Spark."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    distinct = rows.select("publisher", "publisher_seq").distinct()
    island = F.col("publisher_seq") - F.row_number().over(Window.partitionBy("publisher").orderBy("publisher_seq"))
    runs = (distinct.withColumn("island", island).groupBy("publisher", "island")
            .agg(F.min("publisher_seq").alias("first"), F.max("publisher_seq").alias("last"))
            .orderBy("publisher", "first").collect())
    out: dict[str, list[tuple[int, int]]] = {}
    for r in runs:
        out.setdefault(r["publisher"], []).append((int(r["first"]), int(r["last"])))
    return {publisher: tuple(found) for publisher, found in out.items()}
