"""Replay for notebooks: an instance's txlog (and SOW) as Spark DataFrames, from a bookmark, as a batch or a stream.

Where a replay starts and ends is a bookmark (AMPS forms, see
:func:`replication.messages.parse_bookmarks`): ``0`` (EPOCH), ``0|1|`` (NOW),
a message's bookmark (start after it), a UTC time ``YYYYMMDDThhmmss[.ffffff][Z]``
(messages persisted at or after it) or a comma-separated list (the earliest;
as ``until``, the latest). Each resolves to a local ``seq`` position from the
Delta file statistics, without reading the whole log
(:mod:`replication.txlog.seek`). ``until`` is inclusive: a
bookmark ends with its own message, a time with the last message persisted
before it.

A replay returns rows in ``seq`` order (the instance's delivery order) that
match a topic regex (literal names match exactly, regexes are searched, as in
routing) and an AMPS content filter. In Spark both are native columns: no
Python UDF runs. The same selection evaluated in Python
(:meth:`Selection.mask`) serves ``replication replay``, which reads without Spark.

On a Spark that reads Delta itself (Databricks, delta-spark) the txlog is read
with ``format("delta")``; elsewhere from the snapshot's file list that
deltalake gives (never a directory glob: files a compaction replaced stay on
disk until a vacuum). Both read the same snapshot range, so the results are equal.

Example:
    >>> from replication import replay                                          # doctest: +SKIP
    >>> df = replay.txlog("conf/amps-1.xml", topic="^/orders", filter="/qty > 100",
    ...                   bookmark="20261123T093000Z")
    >>> replay.json_columns(df).groupBy("side").sum("qty").show()
    >>> stream = replay.subscribe("conf/amps-1.xml", topic="/orders", bookmark="0|1|", rate="2x")
    >>> stream.writeStream.format("console").start()
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import TableNotFoundError
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from replication import config, expressions, routing
from replication.config.model import InstanceConfig
from replication.connectors.delta.tables import open_table
from replication.connectors.spark.pacing import parse_rate
from replication.connectors.spark.session import session
from replication.errors import InputError, ReplicationError
from replication.expressions import columnar
from replication.messages import FIELD_TYPES
from replication.sow.keys import SowTopics
from replication.sow.table import SOW_SCHEMA, SowTable, as_records, net_changes, sow_topic_for, tail_rows
from replication.storage.control import read_instance_config
from replication.storage.layout import spark_uri
from replication.txlog import stream as txlog_stream
from replication.txlog.reader import Source, TxlogReader, open_txlog
from replication.txlog.schema import REJECTED_SCHEMA
from replication.txlog.stream import SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "Selection",
    "TxlogReader",
    "json_columns",
    "open_txlog",
    "reads_delta_natively",
    "rejected",
    "sow",
    "subscribe",
    "txlog",
]


#: The Spark format name of a native Delta reader.
DELTA_FORMAT = "delta"
#: Message types whose bodies a content filter reads; rows of other types never match a filter.
FILTERABLE_TYPES = FIELD_TYPES


# -- where a replay reads, and where bookmarks are --------------------------------------


# -- which rows: topic regex and content filter -----------------------------------------


@dataclass(frozen=True)
class Selection:
    """Which rows a replay returns: a topic regex and an AMPS content filter, both optional."""

    topic: str | None = None
    filter: expressions.Filter | None = None

    @classmethod
    def of(cls, topic: str | None = None, filter: str | expressions.Filter | None = None) -> Selection:
        """Check both: a regex that does not compile is an InputError; a filter that does not parse a
        :class:`~replication.expressions.FilterSyntaxError` (with its position)."""
        if topic is not None:
            try:
                re.compile(topic)
            except re.error as exc:
                raise InputError(f"topic {topic!r} is not a regular expression ({exc}); e.g. '^/orders/' "
                                 "or a plain topic name such as '/orders'") from None
        if isinstance(filter, str):
            filter = expressions.Filter(filter) if filter.strip() else None
        return cls(topic or None, filter)

    def conditions(self, message_types: set[str] | None = None) -> list[Column]:
        """The selection as native Spark boolean columns over the txlog's columns, all of which must hold.

        Separate conditions, cheapest first: Spark evaluates them in turn and
        compiles each alone, so the filter's one parse of the body is shared
        by all its field reads (inside a CASE WHEN, Spark's common
        subexpression elimination leaves it out and each field read parses
        again). So when the rows are known to be of one message type
        (``message_types``, e.g. from file statistics) the filter is compiled
        for that type alone; otherwise it reads each row as its own type.
        """
        out = []
        if self.topic is not None:
            literal = routing.is_literal(self.topic)
            topic = F.col("topic") == F.lit(self.topic) if literal else F.col("topic").rlike(self.topic)
            out.append(F.coalesce(topic, F.lit(False)))
        if self.filter is not None:
            # A body is read as its message type; only FILTERABLE_TYPES have fields a filter can name.
            out.append(F.col("message_type").isin(*FILTERABLE_TYPES))
            (only,) = message_types if message_types is not None and len(message_types) == 1 else (None,)
            kind = only if only is not None else F.col("message_type")
            out.append(expressions.to_spark_column(self.filter.expr, "data", message_type=kind))
        return out

    def where(self, df: DataFrame, message_types: set[str] | None = None) -> DataFrame:
        """``df`` (txlog rows) keeping the selected rows (``message_types``: see :meth:`conditions`)."""
        for condition in self.conditions(message_types):
            df = df.where(condition)
        return df

    def mask(self, rows: pa.Table) -> np.ndarray:
        """:meth:`where` evaluated in Python on txlog rows (``topic``, ``message_type``, ``data``)."""
        keep = np.ones(rows.num_rows, dtype=bool)
        if self.topic is not None and rows.num_rows:
            topics = pc.dictionary_encode(rows.column("topic").combine_chunks())
            matching = np.array([routing.regex_matches(self.topic, t) for t in topics.dictionary.to_pylist()])
            keep &= matching[topics.indices.to_numpy(zero_copy_only=False)]
        if self.filter is not None and rows.num_rows:
            types = rows.column("message_type").combine_chunks()
            bodies = rows.column("data").combine_chunks()
            for message_type in pc.unique(types.filter(pa.array(keep))).to_pylist():
                at = np.flatnonzero(keep & pc.fill_null(pc.equal(types, message_type), False).to_numpy(
                    zero_copy_only=False))
                keep[at] = message_type in FILTERABLE_TYPES and columnar.matching(
                    self.filter, bodies.take(pa.array(at)), message_type)
        return keep


# -- Spark ------------------------------------------------------------------------------


def reads_delta_natively(spark: SparkSession) -> bool:
    """Can this Spark read ``format("delta")`` itself (Databricks, delta-spark)?"""
    if os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        return True
    try:
        jvm = spark._jvm  # absent with Spark Connect: then only Databricks (above) is known to have Delta
        jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(
            DELTA_FORMAT, spark._jsparkSession.sessionState().conf()
        )
    except Exception:
        return False
    return True


def txlog(
    source: Source,
    *,
    topic: str | None = None,
    filter: str | None = None,
    bookmark: str = "0",
    until: str | None = None,
    fully_durable: bool = False,
    spark: SparkSession | None = None,
) -> DataFrame:
    """The txlog's messages after ``bookmark`` through ``until``, in ``seq`` order, as a DataFrame.

    Args:
        source: a config file path, a parsed config, or an instance's storage root.
        topic: a topic regex (a name without regex characters matches exactly); None: every topic.
        filter: an AMPS content filter, e.g. ``"/qty > 100 AND /side = 'buy'"``.
        bookmark: where to start (see the module doc); default ``"0"``, the beginning.
        until: where to end, inclusive; default: the log's end at the time of the call.
        fully_durable: only messages every sync destination (not downgraded) has acknowledged.
        spark: the session (default: the active one, or a local one).

    Columns: those of the txlog (:data:`replication.txlog.schema.TXLOG_SCHEMA`).

    Example:
        >>> df = replay.txlog("conf/amps-1.xml", topic="^/orders", bookmark="20261123T093000Z")  # doctest: +SKIP
        >>> df.groupBy("publisher").count().show()
    """
    log = open_txlog(source)
    selection = Selection.of(topic, filter)
    start, end = log.range(bookmark, until, fully_durable=fully_durable)
    end = log.committed_seq() if end is None else end
    spark = _spark_for(log, spark)
    rows = snapshot(spark, log, start, end)
    types = log.message_types(start, end) if selection.filter is not None else None
    return selection.where(rows.where((F.col("seq") > start) & (F.col("seq") <= end)), types).orderBy("seq")


def _spark_for(log: TxlogReader, spark: SparkSession | None) -> SparkSession:
    """The session to read ``log`` with: ``spark``, else the active one, else a local one; one built here
    for an instance on S3 has Hadoop's S3A filesystem, with this process's S3 settings (a session of the
    user's own reads ``s3a://`` as it was set up to: Databricks', for one, does)."""
    return spark or session(object_storage=log.path.startswith("s3://"))


def snapshot(spark: SparkSession, log: TxlogReader, start: int, end: int) -> DataFrame:
    """The txlog's rows that may lie in ``(start, end]``: the whole table natively, else the files that overlap."""
    if reads_delta_natively(spark):
        return spark.read.format(DELTA_FORMAT).load(spark_uri(log.path)).select(*SCHEMA.fieldNames())
    uris = [spark_uri(uri) for uri in log.file_uris(start, end)]
    if not uris:
        return spark.createDataFrame([], SCHEMA)
    return spark.read.schema(SCHEMA).parquet(*uris)


def subscribe(
    source: Source,
    *,
    topic: str | None = None,
    filter: str | None = None,
    bookmark: str = "0",
    until: str | None = None,
    fully_durable: bool = False,
    rate: str | float | None = None,
    max_rows_per_trigger: int | None = None,
    spark: SparkSession | None = None,
) -> DataFrame:
    """A bookmark subscription as a streaming DataFrame: the stored messages, then new ones as they commit.

    Arguments as :func:`txlog`, and:
        until: the subscription ends with this message (resolved now); default: never.
        fully_durable: a message is delivered once every sync destination (not
            downgraded) has acknowledged it; the stream waits for that.
        rate: replay at this multiple of the original publish pace, e.g. ``"2x"``; default: as fast as possible.
        max_rows_per_trigger: at most this many rows per micro-batch.

    Rows come in ``seq`` order, each once: a query restarted from its
    checkpoint continues after the last batch it completed (the bookmark
    applies to a new checkpoint only). Any ``writeStream`` sink works.

    Example:
        >>> q = (replay.subscribe("conf/amps-1.xml", topic="/orders", bookmark="0|1|")  # doctest: +SKIP
        ...      .writeStream.option("checkpointLocation", "/tmp/orders-cp").format("console").start())
    """
    log = open_txlog(source)
    selection = Selection.of(topic, filter)
    start, end = log.range(bookmark, until)
    speed = parse_rate(rate, where="replay.subscribe: rate")
    spark = _spark_for(log, spark)
    txlog_stream.register(spark)
    reader = spark.readStream.format(txlog_stream.FORMAT).option("path", log.path).option("startSeq", start)
    if end is not None:
        reader = reader.option("endSeq", max(end, start))
    if fully_durable:
        reader = reader.option("durableFile", str(log.layout.durable_json))
    if speed:
        reader = reader.option("rate", str(speed))
    if max_rows_per_trigger:
        reader = reader.option("maxRowsPerTrigger", int(max_rows_per_trigger))
    return selection.where(reader.load())


def sow(source: Source, *, topic: str, filter: str | None = None, spark: SparkSession | None = None) -> DataFrame:
    """Current State-of-the-World records of ``topic`` matching ``filter``: one row per SOW key, exact.

    The topic's SOW table (its records as of some txlog position) is read by
    Spark, natively on a Spark with Delta, else from deltalake's file list;
    the txlog rows stored after that position are folded on top (they are few:
    at most one compaction interval's), so the result is what ``replication
    sow`` prints. Columns: :data:`replication.sow.table.SOW_SCHEMA`.

    Example:
        >>> replay.sow("conf/amps-1.xml", topic="/orders", filter="/qty > 100").count()  # doctest: +SKIP
    """
    log = open_txlog(source)
    cfg = _config_of(source, log)
    selection = Selection.of(None, filter)
    try:
        index, sow_topic = sow_topic_for(cfg, topic)
        table = SowTable(log.layout, sow_topic, create=False)
    except InputError as exc:
        raise InputError(f"replay.sow: {exc}") from None
    except TableNotFoundError:
        raise ReplicationError(f"replay.sow: {cfg.name} has no SOW table for {topic!r} yet: the SOW topic's table is "
                               "made when the instance first runs with it") from None
    tail = tail_rows(log.files, table.through_seq)
    changes = net_changes(tail.filter(pc.equal(tail["topic"], topic)), SowTopics.of(cfg), index)
    spark = _spark_for(log, spark)
    schema = from_arrow_schema(SOW_SCHEMA)
    if reads_delta_natively(spark):
        base = spark.read.format(DELTA_FORMAT).load(spark_uri(str(table.path)))
    else:
        uris = [spark_uri(uri) for uri in table.table.file_uris()]
        base = (spark.read.schema(schema).option("basePath", spark_uri(str(table.path))).parquet(*uris) if uris
                else spark.createDataFrame([], schema))  # bucket comes from the files' partition folders
    base = base.where(F.col("topic") == F.lit(topic)).select(*SOW_SCHEMA.names)
    touched = sorted(changes.touched())
    if touched:
        base = base.join(spark.createDataFrame(touched, "topic string, sow_key string"), ["topic", "sow_key"],
                         "left_anti")
    records = base.unionByName(spark.createDataFrame(as_records(changes.upserts, table.buckets), schema))
    return selection.where(records, {sow_topic.message_type})


def _config_of(source: Source, log: TxlogReader) -> InstanceConfig:
    """The instance's config: the one given, or its ``_control/instance.json``."""
    if isinstance(source, InstanceConfig):
        return source
    text = os.fspath(source)
    if text.lower().endswith(".xml") or Path(text).is_file():
        return config.load(text)
    return read_instance_config(log.layout.instance_json)


def rejected(source: Source, *, spark: SparkSession | None = None) -> DataFrame:
    """The messages ``source`` refused (``rejected/``), each with its ``reason``; empty when it refused none.

    Example:
        >>> replay.rejected("conf/amps-1.xml").groupBy("reason").count().show()  # doctest: +SKIP
    """
    log = open_txlog(source)
    spark = _spark_for(log, spark)
    path = str(log.layout.rejected)
    schema = from_arrow_schema(REJECTED_SCHEMA)
    try:
        uris = [spark_uri(uri) for uri in open_table(path).file_uris()]
    except TableNotFoundError:  # the instance has not run yet
        return spark.createDataFrame([], schema)
    if reads_delta_natively(spark):
        return spark.read.format(DELTA_FORMAT).load(spark_uri(path))
    return spark.read.schema(schema).parquet(*uris) if uris else spark.createDataFrame([], schema)


def json_columns(df: DataFrame, schema: str | None = None, *, sample_rows: int = 1000) -> DataFrame:
    """``df`` with each top-level field of its JSON bodies as a typed column, and all of them as struct ``fields``.

    Args:
        df: txlog rows (a ``data`` and a ``message_type`` column), e.g. from :func:`txlog`.
        schema: the bodies' schema as DDL (``"id BIGINT, qty BIGINT, side STRING"``)
            or a ``StructType``; default: inferred from the first ``sample_rows`` json bodies.

    Rows of other message types get nulls. A body field named like an
    existing column (``topic``, ``seq``...) is only in ``fields``.

    Example:
        >>> replay.json_columns(replay.txlog(cfg, topic="/orders")).where("qty > 100")  # doctest: +SKIP
    """
    body = F.col("data").cast("string")
    if schema is None:
        sample = df.where(F.col("message_type") == "json").select(body.alias("body")).limit(sample_rows)
        found = sample.select(F.schema_of_variant_agg(F.try_parse_json("body"))).first()
        if found is None or not found[0] or not found[0].startswith("OBJECT<"):
            raise InputError("json_columns: no JSON object among the bodies to infer a schema from; "
                             "pass schema=, e.g. json_columns(df, 'id BIGINT, qty BIGINT')")
        schema = _struct_ddl(found[0])
    parsed = df.withColumn("fields", F.when(F.col("message_type") == "json", F.from_json(body, schema)))
    names = parsed.select("fields.*").columns
    taken = set(df.columns)
    return parsed.select("*", *[F.col("fields")[n].alias(n) for n in names if n not in taken])


def _struct_ddl(variant_type: str) -> str:
    """A VARIANT schema (``OBJECT<a: BIGINT, b: DECIMAL(3,1)>``) as DDL ``from_json`` reads.

    JSON numbers with a fraction come out as decimals sized by the sample: a
    double keeps values outside it.
    """
    ddl = re.sub(r"\bOBJECT<", "STRUCT<", variant_type)
    return re.sub(r"\bDECIMAL\(\d+,\s*\d+\)", "DOUBLE", ddl)
