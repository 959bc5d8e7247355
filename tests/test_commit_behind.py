"""Spark's commit of a batch the engine did not commit, undone: Spark runs that batch again with the same rows."""

from __future__ import annotations

import logging

from support.kafka import publish_numbered, unique_topic

from replication.connectors.spark.commit_behind import rewind


def _run(spark, broker, topic: str, checkpoint, seen: dict[int, list[int]]) -> None:
    """Read ``topic`` to its end, 10 records a batch (Spark's own Kafka source), each batch's offsets kept."""
    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "10")
        .load()
        .writeStream.trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(lambda df, batch_id: seen.setdefault(batch_id, [r.offset for r in df.collect()]))
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None


def test_the_batch_after_the_last_one_committed_is_run_again_with_the_same_rows(spark, broker, tmp_path, caplog):
    topic = unique_topic("behind")
    publish_numbered(broker.bootstrap, topic, 30)
    checkpoint = tmp_path / "checkpoint"
    first: dict[int, list[int]] = {}
    _run(spark, broker, topic, checkpoint, first)
    assert sorted(first) == [0, 1, 2]
    # what a crash leaves: Spark's commit of batch 2 (and the plan of a batch 3), the engine's commit of 1 only
    (checkpoint / "offsets" / "3").write_text((checkpoint / "offsets" / "2").read_text())
    with caplog.at_level(logging.WARNING):
        assert rewind(spark, str(checkpoint), 1, name="behind") == 2
    assert not (checkpoint / "commits" / "2").exists() and not (checkpoint / "offsets" / "3").exists()
    assert (checkpoint / "offsets" / "2").exists(), "the batch's own offsets stay: Spark runs it with them"
    assert "Spark had committed ingest batch 2, the txlog had not" in caplog.text

    again: dict[int, list[int]] = {}
    publish_numbered(broker.bootstrap, topic, 5, first_seq=31)
    _run(spark, broker, topic, checkpoint, again)
    assert again[2] == first[2], "batch 2 again, with the rows it had"
    assert sorted(again) == [2, 3] and again[3] == list(range(30, 35))


def test_a_checkpoint_not_ahead_or_further_ahead_than_one_batch_is_left_as_it_is(spark, broker, tmp_path, caplog):
    topic = unique_topic("behind")
    publish_numbered(broker.bootstrap, topic, 30)
    checkpoint = tmp_path / "checkpoint"
    _run(spark, broker, topic, checkpoint, {})
    assert rewind(spark, str(checkpoint), 2, name="behind") is None
    with caplog.at_level(logging.WARNING):
        assert rewind(spark, str(checkpoint), 0, name="behind") is None
    assert "has committed batches through 2, the txlog only through 0" in caplog.text
    assert sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit()) == [0, 1, 2]
    assert rewind(spark, str(tmp_path / "never-started"), None, name="behind") is None
