"""A new ingest checkpoint (the old one lost) reads its sources from their start again: what it must skip."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

from replication.connectors.spark.planned_batch import query_id
from replication.ingest.writer import _stored_versions


def test_inbox_versions_the_txlog_holds_are_marked_and_kafka_rows_are_not():
    batch = pa.table({"inbox_version": pa.array([None, 3, 4, None, 5, 6], pa.int64()),
                      "data": ["k1", "v3", "v4", "k2", "v5", "v6"]})
    stored = _stored_versions(batch, stored_through=4)
    assert stored is not None and stored.to_pylist() == [False, True, True, False, False, False]
    assert batch.filter(pc.invert(stored))["data"].to_pylist() == ["k1", "k2", "v5", "v6"]
    assert _stored_versions(batch, stored_through=2) is None  # nothing stored among them: the batch as it is
    assert _stored_versions(batch, stored_through=-1) is None  # no inbox version stored yet
    assert _stored_versions(pa.table({"data": ["k"]}), stored_through=9) is None  # no inbox in this instance


def test_the_checkpoint_query_id_is_read_from_sparks_metadata_file_or_none(tmp_path):
    assert query_id(tmp_path) is None  # not written yet
    (tmp_path / "metadata").write_text(json.dumps({"id": "8c2cbe15-7c77-4a43-92a1-512ad844414e"}))
    assert query_id(tmp_path) == "8c2cbe15-7c77-4a43-92a1-512ad844414e"
    (tmp_path / "metadata").write_text("{not json")
    assert query_id(tmp_path) is None
