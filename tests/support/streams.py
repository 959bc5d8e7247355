"""Spark streams in tests: one of the package's sources run to its end, a subscription collected as it goes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def _arrow(df) -> Any:
    return df.toArrow()


def run_available_now(spark, source, path: Path | None, checkpoint: Path | str, *,
                      take: Callable[[Any], Any] = _arrow, **options: str) -> list:
    """Run a source of the package to its end once (``availableNow``); each micro-batch as ``take`` makes it of
    the batch's DataFrame (Arrow by default), in delivery order.

    ``source`` is the source's module (``replication.txlog.stream``, ``replication.inbox.stream``,
    ``replication.connectors.kafka.source``): its ``register`` and ``FORMAT``; ``path`` its table (None: the
    source has none, Kafka's)."""
    source.register(spark)
    batches: list = []
    reader = spark.readStream.format(source.FORMAT)
    if path is not None:
        reader = reader.option("path", str(path))
    query = (
        reader.options(**options).load()
        .writeStream.trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(lambda df, _id: batches.append(take(df)))
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None
    return batches


def spark_seqs(df) -> list[int]:
    """The ``seq`` column of a DataFrame, in its order."""
    return [row.seq for row in df.select("seq").collect()]


def collecting(df, checkpoint: Path, seen: list[int]):
    """Start ``df`` (a subscription) into a list of seqs, micro-batch by micro-batch."""
    return (df.writeStream.trigger(processingTime="200 milliseconds").option("checkpointLocation", str(checkpoint))
            .foreachBatch(lambda batch, _id: seen.extend(spark_seqs(batch))).start())
