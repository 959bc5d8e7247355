"""Micro-batch ranges from a query's offset log (replication/planned_batch.py), against real Spark queries."""

from __future__ import annotations

import pytest
from support.tables import TxlogWriter

from replication.connectors.spark.planned_batch import PlannedBatch
from replication.txlog.stream import FORMAT, register

META = '{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}'


def write_entry(checkpoint, batch_id: int, *lines: str, version: str = "v1") -> None:
    offsets = checkpoint / "offsets"
    offsets.mkdir(parents=True, exist_ok=True)
    (offsets / str(batch_id)).write_text("\n".join([version, META, *lines]))


def test_a_batch_runs_from_the_previous_entry_to_its_own(tmp_path):
    write_entry(tmp_path, 4, '{"t": {"0": 10, "1": 3}}', '{"version": 2}')
    write_entry(tmp_path, 5, '{"t": {"0": 12, "1": 3}}', '{"version": 5}')
    assert PlannedBatch(tmp_path).ranges(5) == [
        ({"t": {"0": 10, "1": 3}}, {"t": {"0": 12, "1": 3}}),
        ({"version": 2}, {"version": 5}),
    ]


@pytest.mark.parametrize(
    "entries, batch",
    [
        ({0: ['{"seq": 3}']}, 0),  # the first batch starts at the sources' initial offsets
        ({5: ['{"seq": 3}']}, 5),  # previous entry missing
        ({4: ['{"seq": 1}']}, 5),  # own entry not written
        ({4: ['{"seq": 1}'], 5: ['{"seq": 3}', '{"version": 1}']}, 5),  # sources differ
        ({4: ['{"seq": 1}'], 5: ["[1, 2]"]}, 5),  # not an offset object
    ],
    ids=["first-batch", "no-previous", "no-entry", "source-count", "not-an-object"],
)
def test_unknown_ranges_are_none(tmp_path, entries, batch):
    for batch_id, lines in entries.items():
        write_entry(tmp_path, batch_id, *lines)
    assert PlannedBatch(tmp_path).ranges(batch) is None


def test_a_source_without_an_offset_yet_reads_nothing(tmp_path):
    # Spark's Kafka source has no offset while none of its topics exists: Spark logs "-"
    write_entry(tmp_path, 4, "-", '{"version": 2}')
    write_entry(tmp_path, 5, '{"t": {"0": 7}}', '{"version": 2}')
    write_entry(tmp_path, 6, '{"t": {"0": 9}}', "-")
    assert PlannedBatch(tmp_path).ranges(5) == [({}, {"t": {"0": 7}}), ({"version": 2}, {"version": 2})]
    assert PlannedBatch(tmp_path).ranges(6) == [({"t": {"0": 7}}, {"t": {"0": 9}}), ({"version": 2}, {})]


def test_the_first_batch_runs_from_the_initial_offsets_given_to_its_own_entry(tmp_path):
    write_entry(tmp_path, 0, '{"t": {"0": 10}}', '{"version": 2}')
    asked = []
    initial = [{"t": {"0": 4}}, {"version": -1}]
    assert PlannedBatch(tmp_path).ranges(0, initial=lambda: asked.append(1) or initial) == [
        ({"t": {"0": 4}}, {"t": {"0": 10}}), ({"version": -1}, {"version": 2})]
    assert PlannedBatch(tmp_path).ranges(0, initial=lambda: initial[:1]) is None, "one source too few"
    assert PlannedBatch(tmp_path / "none").ranges(0, initial=lambda: asked.append(2) or initial) is None
    assert asked == [1], "the sources are asked only when the entry is there"


def test_another_log_format_is_not_guessed(tmp_path):
    write_entry(tmp_path, 1, '{"seq": 1}', version="v2")
    write_entry(tmp_path, 2, '{"seq": 5}', version="v2")
    assert PlannedBatch(tmp_path).ranges(2) is None


def test_ranges_are_exactly_the_rows_spark_gives_each_batch(spark, tmp_path):
    """A real query's offset log names, for every batch, the seqs its DataFrame holds (the first from the
    source's initial offset)."""
    txlog = TxlogWriter(tmp_path / "txlog")
    for count in (7, 13, 1, 20, 9):
        txlog.append(count)
    checkpoint = tmp_path / "checkpoint"
    planned = PlannedBatch(checkpoint)
    seen: list[tuple[int, list[int], list | None]] = []
    register(spark)
    query = (
        spark.readStream.format(FORMAT).option("path", str(txlog.path)).option("maxRowsPerTrigger", "8").load()
        .writeStream.trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(lambda df, batch_id: seen.append(
            (batch_id, df.toArrow()["seq"].to_pylist(), planned.ranges(batch_id, initial=lambda: [{"seq": 0}]))))
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None
    assert [s for _, seqs, _ in seen for s in seqs] == list(range(1, 51))
    assert len(seen) > 3
    for batch_id, seqs, ranges in seen:
        assert ranges == [({"seq": seqs[0] - 1}, {"seq": seqs[-1]})], batch_id


def test_each_entry_is_read_once_as_one_batch_follows_another(tmp_path, monkeypatch):
    for batch_id, seq in enumerate((0, 4, 9, 12)):
        write_entry(tmp_path, batch_id, f'{{"seq": {seq}}}')
    planned = PlannedBatch(tmp_path)
    reads: list[int] = []
    read = planned._read
    monkeypatch.setattr(planned, "_read", lambda batch_id: reads.append(batch_id) or read(batch_id))
    assert [planned.ranges(b) for b in (1, 2, 3)] == [
        [({"seq": 0}, {"seq": 4})], [({"seq": 4}, {"seq": 9})], [({"seq": 9}, {"seq": 12})]
    ]
    assert reads == [0, 1, 2, 3]
