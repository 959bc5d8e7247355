"""Small micro-batches read in the driver by the planner, large ones by tasks: the same rows either way.

These drive the stream readers the way Spark's planner process does (plan,
then ask for the rows read in the driver), on real Delta tables and a real broker; the
source tests run the same sources in Spark with driver reads on and off.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from support.kafka import publish_numbered, source_options, unique_topic
from support.tables import TxlogWriter

from replication.connectors.kafka.broker import ensure_topics
from replication.connectors.kafka.source import KafkaSource
from replication.connectors.spark import driver_read
from replication.connectors.spark.driver_read import DriverReadingReader, PartitionBundle
from replication.txlog.stream import SCHEMA as TXLOG_SPARK_SCHEMA
from replication.txlog.stream import TxlogSource


def reader_for(source_class, options: dict[str, str], schema):
    source = source_class(options)
    return source.streamReader(schema)


def rows_of(reader, partitions) -> pa.Table:
    """What tasks would read for ``partitions`` (each partition through ``reader.read``)."""
    return pa.Table.from_batches([b for p in partitions for b in reader.read(p)])


def test_the_installed_pyspark_offers_the_planner_path():
    # If a PySpark upgrade removes it, sources silently fall back to tasks: this says so.
    assert driver_read.AVAILABLE


def test_a_small_txlog_range_is_handed_over_by_the_planner_and_a_large_one_left_to_tasks(tmp_path):
    writer = TxlogWriter(tmp_path / "txlog")
    for _ in range(5):
        writer.append(20)
    reader = reader_for(TxlogSource, {"path": str(tmp_path / "txlog"), "driverReadRows": "50"}, TXLOG_SPARK_SCHEMA)
    assert isinstance(reader, DriverReadingReader)

    start = reader.initialOffset()
    assert reader.getCache(start, {"seq": 40}) is None  # nothing planned yet (a batch re-planned after a restart)

    small = reader.partitions(start, {"seq": 40})
    assert len(small) == 1 and isinstance(small[0], PartitionBundle)
    fetched = list(reader.getCache(start, {"seq": 40}))
    assert len(fetched) == 1  # one record batch: Spark is much slower with many
    assert fetched[0].column("seq").to_pylist() == list(range(1, 41))
    # A task handed the bundle (the block was lost, say) reads the same rows.
    assert rows_of(reader, small).column("seq").to_pylist() == list(range(1, 41))
    assert reader.getCache(start, {"seq": 40}) is None  # handed over once

    large = reader.partitions({"seq": 40}, {"seq": 100})
    assert not any(isinstance(p, PartitionBundle) for p in large)
    assert reader.getCache({"seq": 40}, {"seq": 100}) is None
    assert rows_of(reader, large).column("seq").to_pylist() == list(range(41, 101))

    assert reader.partitions({"seq": 100}, {"seq": 100}) == []  # Spark's "latest seen offset" call
    reader.stop()


def test_driver_read_rows_zero_leaves_the_reader_as_it_is(tmp_path):
    reader = reader_for(TxlogSource, {"path": str(tmp_path / "txlog"), "driverReadRows": "0"}, TXLOG_SPARK_SCHEMA)
    assert not isinstance(reader, DriverReadingReader)


def test_kafka_rows_read_by_the_planner_equal_those_read_by_tasks(broker):
    topic = unique_topic("driver-read")
    ensure_topics(broker.bootstrap, [topic], partitions=2)
    publish_numbered(broker.bootstrap, topic, 200, partitions=2)
    source = KafkaSource(source_options(broker, topic))
    reader = source.streamReader(source.schema())
    assert isinstance(reader, DriverReadingReader)
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())

    planned = reader.partitions(start, end)
    fetched = pa.Table.from_batches(list(reader.getCache(start, end)))
    by_tasks = rows_of(reader.simple_reader, reader.simple_reader.partitions(start, end))
    assert fetched.num_rows == 200
    assert fetched.to_pylist() == by_tasks.to_pylist()
    assert rows_of(reader, planned).to_pylist() == by_tasks.to_pylist()
    reader.stop()


@pytest.mark.parametrize("value", ["-1", "lots"])
def test_a_bad_driver_read_rows_option_names_the_fix(tmp_path, value):
    from replication.errors import ConfigError

    with pytest.raises(ConfigError,
                       match=r"driverReadRows must be an integer >= 0 .*\.option\('driverReadRows', 50000\)"):
        reader_for(TxlogSource, {"path": str(tmp_path), "driverReadRows": value}, TXLOG_SPARK_SCHEMA)


def test_a_planner_process_exits_quietly_when_spark_hangs_up():
    # What Spark's runner does when the JVM closes its socket: EOFError, then BrokenPipeError replying.
    script = (
        "import sys\n"
        "from replication.connectors.spark.driver_read import quiet_when_spark_hangs_up\n"
        "quiet_when_spark_hangs_up(); quiet_when_spark_hangs_up()\n"
        "try:\n"
        "    raise EOFError\n"
        "except EOFError:\n"
        "    raise {}('the JVM went away')\n"
    )
    import subprocess
    import sys

    hung_up = subprocess.run([sys.executable, "-c", script.format("BrokenPipeError")], capture_output=True, text=True)
    assert hung_up.returncode == 1 and hung_up.stderr == ""
    failed = subprocess.run([sys.executable, "-c", script.format("ValueError")], capture_output=True, text=True)
    assert failed.returncode == 1 and "ValueError: the JVM went away" in failed.stderr
