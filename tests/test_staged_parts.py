"""Backfill parts stored as they were staged: values written in place, Delta statistics, the ingest's choice.

The pieces without Spark: :mod:`replication.connectors.parquet_in_place`,
:mod:`replication.connectors.delta.stats` and
:class:`replication.ingest.staged_parts.StagedParts`; an instance storing
parts end to end, and killed while it does, is in ``test_backfill``.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from support.factories import write_config

from replication import config
from replication.connectors import parquet_in_place
from replication.connectors.delta.log_files import log_writer_properties, write_file
from replication.connectors.delta.stats import file_stats
from replication.connectors.delta.tables import IdempotentAppender
from replication.inbox import staged_parts
from replication.inbox.staged_parts import StagedParts
from replication.ingest.classify import CANDIDATE_SCHEMA, TopicRecorder
from replication.storage.layout import StorageLayout
from replication.txlog.files import TxlogFiles, read_range
from replication.txlog.schema import TXLOG_SCHEMA

WRITTEN = datetime(2026, 11, 25, 9, 0, 0, 123_456, tzinfo=timezone.utc)
NOW = datetime(2026, 11, 25, 10, 0, 0, 987_654, tzinfo=timezone.utc)


def part_rows(client: str, seqs: list[int], topic: str = "/orders", instance: str = "solo") -> pa.Table:
    return staged_parts.part_rows(instance, client, "json", pa.array([topic] * len(seqs)),
                                  pa.array([b'{"n":%d}' % s for s in seqs], pa.binary()),
                                  pa.array(seqs, pa.int64()), WRITTEN)


# -- values written in place ----------------------------------------------------------------------


def test_values_of_plain_columns_are_written_in_place_and_everything_else_is_kept(tmp_path):
    rows = part_rows("loader", list(range(1, 50_001)))
    path = tmp_path / "part.parquet"
    options = parquet_in_place.writer_options(["seq", "persist_time"], rows.column_names)
    # several row groups, several pages each; the other columns compressed
    pq.write_table(rows, path, **{**options, "compression": {**{c: "snappy" for c in rows.column_names},
                                                             **options["compression"]}}, row_group_size=20_000,
                   data_page_size=64 * 1024)
    assert pq.ParquetFile(path).metadata.num_row_groups == 3
    spans = parquet_in_place.value_spans(str(path), ["seq", "persist_time"])
    assert sum(s.count for s in spans["seq"]) == 50_000 and len(spans["seq"]) > 6
    at = int(pa.scalar(NOW, pa.timestamp("us", tz="UTC")).value)
    parquet_in_place.overwrite(str(path), spans, {"seq": np.arange(1001, 51_001),
                                                  "persist_time": np.full(50_000, at)})
    back = pq.read_table(path)
    assert back["seq"].to_pylist() == list(range(1001, 51_001))
    assert set(back["persist_time"].to_pylist()) == {NOW}
    assert back.drop_columns(["seq", "persist_time"]).equals(rows.drop_columns(["seq", "persist_time"]))


@pytest.mark.parametrize("how, why", [
    ({"compression": "snappy"}, "compressed"),
    ({"use_dictionary": True, "column_encoding": None}, "dictionary"),
    ({"write_statistics": True}, "statistics"),
    ({"write_page_checksum": True}, "checksum"),
    ({"data_page_version": "2.0"}, "v1 data page"),
])
def test_a_column_laid_out_otherwise_is_refused(tmp_path, how, why):
    rows = part_rows("loader", [1, 2, 3])
    options = {**parquet_in_place.writer_options(["seq"], rows.column_names), **how}
    pq.write_table(rows, tmp_path / "p.parquet", **{k: v for k, v in options.items() if v is not None})
    with pytest.raises(parquet_in_place.NotInPlace, match=why):
        parquet_in_place.value_spans(str(tmp_path / "p.parquet"), ["seq"])


def test_a_null_or_a_column_of_another_type_is_refused(tmp_path):
    rows = part_rows("loader", [1, 2, 3])
    with_null = rows.set_column(rows.schema.get_field_index("persist_time"), TXLOG_SCHEMA.field("persist_time"),
                                pa.array([WRITTEN, None, WRITTEN], pa.timestamp("us", tz="UTC")))
    pq.write_table(with_null, tmp_path / "p.parquet",
                   **parquet_in_place.writer_options(["persist_time", "topic"], rows.column_names))
    with pytest.raises(parquet_in_place.NotInPlace, match="not 3 plain 8-byte integers|one value per row"):
        parquet_in_place.value_spans(str(tmp_path / "p.parquet"), ["persist_time"])
    with pytest.raises(parquet_in_place.NotInPlace, match="BYTE_ARRAY, not INT64"):
        parquet_in_place.value_spans(str(tmp_path / "p.parquet"), ["topic"])


# -- Delta statistics -----------------------------------------------------------------------------


def test_statistics_are_those_delta_rs_writes_and_files_join_a_commit(tmp_path):
    rows = part_rows("loader", list(range(1, 1001)))
    rows = rows.set_column(rows.schema.get_field_index("received_from"), TXLOG_SCHEMA.field("received_from"),
                           pa.array([None if i % 3 else f"up-{i % 7}" for i in range(1000)], pa.string()))
    rows = rows.set_column(0, TXLOG_SCHEMA.field("seq"), pa.array(np.arange(1, 1001)))
    write_deltalake(str(tmp_path / "by-delta-rs"), rows, writer_properties=log_writer_properties())
    (add,) = [json.loads(line)["add"] for line in (tmp_path / "by-delta-rs" / "_delta_log" / f"{0:020d}.json").open()
              if '"add"' in line]
    assert json.loads(add["stats"]) == file_stats(rows), "timestamps in ms, nulls counted, no stats of bodies"

    txlog = IdempotentAppender(tmp_path / "txlog", TXLOG_SCHEMA, app_id="ingest", name="t")
    txlog.append(rows, 0, {"batch": 0})

    index = TxlogFiles(str(tmp_path / "txlog"))
    index.refresh()
    # a file written ahead (a staged part's: the commit's first seqs), and the batch's rows after it
    extra = write_file(tmp_path / "txlog",
                       rows.set_column(0, TXLOG_SCHEMA.field("seq"), pa.array(np.arange(1001, 2001))))
    txlog.append(rows.set_column(0, TXLOG_SCHEMA.field("seq"), pa.array(np.arange(2001, 3001))), 1, {"batch": 1},
                 files=[extra])
    assert txlog.version == 2 and DeltaTable(str(tmp_path / "txlog")).transaction_version("ingest") == 1
    txlog.append(rows.slice(0, 0), 2, {"batch": 2})  # (the appender follows its own commits: no conflict)
    assert read_range(str(tmp_path / "txlog"), 0, 3000)["seq"].to_pylist() == list(range(1, 3001))
    # a commit whose files are not in seq order (another writer's): a view following the commit files
    # still has them by seq
    high, low = (write_file(tmp_path / "txlog", rows.set_column(0, TXLOG_SCHEMA.field("seq"), pa.array(seqs)))
                 for seqs in (np.arange(4001, 5001), np.arange(3001, 4001)))
    DeltaTable(str(tmp_path / "txlog")).create_write_transaction([high, low], mode="append", schema=TXLOG_SCHEMA)
    index.refresh()  # (from the new commit files alone)
    assert index.version == 4 and index._table.version() == 1
    assert [(r.start, r.end, len(r.files)) for r in index.plan(0, 5000, rows_per_partition=1000)] == [
        (0, 1000, 1), (1000, 2000, 1), (2000, 3000, 1), (3000, 4000, 1), (4000, 5000, 1)]
    assert index.read(2500, 4500)["seq"].to_pylist() == list(range(2501, 4501))


# -- the ingest's choice ----------------------------------------------------------------------------


def staged(layout: StorageLayout, client: str, seqs: list[int], number: int, topic: str = "/orders") -> str:
    directory = layout.backfill_staging(client)
    directory.mkdir(parents=True, exist_ok=True)
    part = staged_parts.write_part(directory, layout.inbox, part_rows(client, seqs, topic),
                                   name=staged_parts.staged_name(number))
    return part.to_json()


def kafka_row(client: str, seq: int) -> pa.Table:
    values = {"source": "kafka", "publisher": client, "publisher_seq": str(seq), "topic": "/orders",
              "message_type": "json", "command": "publish", "data": b'{"k":1}'}
    return pa.table({f.name: pa.array([values.get(f.name)], f.type) for f in CANDIDATE_SCHEMA},
                    schema=CANDIDATE_SCHEMA)


def parts_of(tmp_path, sow: str = ""):
    cfg = config.load(str(write_config(tmp_path, "solo", "localhost:9", sow=sow)))
    layout = StorageLayout.of(cfg.storage)
    layout.txlog.mkdir(parents=True)
    return StagedParts(cfg, layout, TopicRecorder(cfg)), layout


def test_parts_stored_as_they_are_take_the_first_seqs_and_a_replay_writes_the_same(tmp_path):
    parts, layout = parts_of(tmp_path)
    descriptors = [staged(layout, "loader", [1, 2, 3], 1), staged(layout, "loader", [4, 6], 2)]
    batch = pa.concat_tables([kafka_row("pub", 1), staged_parts.markers([(7, descriptors[0]), (8, descriptors[1])])])
    taken = parts.take(batch, {"loader": 0}, 100, NOW)
    assert [(s.part.client, s.first_seq, s.part.rows) for s in taken.stored] == [("loader", 101, 3), ("loader", 104, 2)]
    assert taken.rows == 5 and taken.candidates.equals(kafka_row("pub", 1)), "the other rows, no marker"
    assert not any(layout.backfill_staging("loader").iterdir()), "moved into the txlog's directory"
    assert taken.publishers() == {"loader": 6}
    firsts, lasts = taken.publisher_rows()["loader"]
    assert (firsts.tolist(), lasts.tolist()) == ([101], [105]), "one run of local seqs: one ack"
    # a crash before the commit, then the batch again: the files found where they were moved, the same seqs
    # written again (here over zeros)
    for s in taken.stored:
        parquet_in_place.overwrite(str(s.path), parquet_in_place.value_spans(str(s.path), ["seq"]),
                                   {"seq": np.zeros(s.part.rows, np.int64)})
    cfg = config.load(str(tmp_path / "solo.xml"))
    again = StagedParts(cfg, layout, TopicRecorder(cfg)).take(batch, {"loader": 0}, 100, NOW)
    assert [(s.path, s.first_seq) for s in again.stored] == [(s.path, s.first_seq) for s in taken.stored]
    txlog = IdempotentAppender(layout.txlog, TXLOG_SCHEMA, app_id="ingest", name="t")
    txlog.append(TXLOG_SCHEMA.empty_table(), 0, {"batch": 0}, files=again.actions(layout.txlog, NOW))
    stored = read_range(str(layout.txlog), 100, 105)
    assert stored["seq"].to_pylist() == list(range(101, 106))
    assert stored["publisher_seq"].to_pylist() == [1, 2, 3, 4, 6] and set(stored["persist_time"].to_pylist()) == {NOW}
    assert stored["data"].to_pylist() == [b'{"n":%d}' % s for s in (1, 2, 3, 4, 6)]
    (add,) = [a for a in pa.table(DeltaTable(str(layout.txlog)).get_add_actions(flatten=True)).to_pylist()
              if a["path"] == again.stored[1].path.name]
    assert (add["min.seq"], add["max.seq"], add["num_records"], add["max.publisher_seq"]) == (104, 105, 2, 6)


def test_parts_stored_already_a_client_publishing_elsewhere_a_sow_topic_or_a_gone_file_are_not_stored_as_is(tmp_path):
    parts, layout = parts_of(tmp_path, sow="<Topic><Name>/sow</Name><MessageType>json</MessageType><Key>/n</Key>"
                                           "</Topic>")
    dup, partly, after = (staged(layout, "loader", [1, 2], 1), staged(layout, "loader", [3, 4], 2),
                          staged(layout, "loader", [5], 3))
    taken = parts.take(staged_parts.markers([(1, dup), (2, partly), (3, after)]), {"loader": 3}, 10, NOW)
    assert taken.duplicates == 2 and not taken.stored, "a part below the mark is a duplicate; the client's next "
    "part is classified (its row 3 is a duplicate), and so is the one after it: the client's order"
    assert taken.candidates["publisher_seq"].to_pylist() == ["3", "4", "5"]
    assert set(taken.candidates["source"].to_pylist()) == {"backfill"}
    assert set(taken.candidates["inbox_version"].to_pylist()) == {2, 3}
    assert len(taken.consumed) == 3, "each staged file is done with once the batch is committed"
    taken.clean_up()
    assert not any(layout.backfill_staging("loader").iterdir())

    elsewhere = staged(layout, "mixed", [1], 1)
    taken = parts.take(pa.concat_tables([kafka_row("mixed", 7), staged_parts.markers([(4, elsewhere)])]), {}, 10, NOW)
    assert not taken.stored and taken.candidates["publisher_seq"].to_pylist() == ["7", "1"], \
        "a client publishing in the same batch: its part's rows classified with its others, in order"

    sow_part = staged(layout, "sow-loader", [1], 1, topic="/sow")
    assert not parts.take(staged_parts.markers([(5, sow_part)]), {}, 10, NOW).stored, "a SOW topic's rows fold in"

    gone = staged(layout, "gone", [1, 2, 3], 1)
    (layout.inbox / staged_parts.StagedPart.from_json(gone).file).unlink()
    taken = parts.take(staged_parts.markers([(6, gone)]), {}, 10, NOW)
    assert not taken.stored and taken.candidates.num_rows == 0
    (reason,) = taken.rejected["reason"].to_pylist()
    assert "is gone from the inbox's staging directory: client gone's messages 1..3 (3) cannot be stored" in reason

    odd = staged(layout, "odd", [1, 2], 1)  # (a file laid out otherwise: its rows classified, never patched)
    path = layout.inbox / staged_parts.StagedPart.from_json(odd).file
    pq.write_table(pq.read_table(path), path)
    taken = parts.take(staged_parts.markers([(7, odd)]), {}, 10, NOW)
    assert not taken.stored and taken.candidates["publisher_seq"].to_pylist() == ["1", "2"]


def test_an_inbox_commit_hands_over_a_part_by_its_descriptor_and_counts_its_rows(tmp_path):
    from replication.backfill.commit import commit_staged_part
    from replication.inbox.schema import create_inbox
    from replication.inbox.versions import InboxLog
    from replication.inbox.versions import staged_parts as descriptors

    cfg = config.load(str(write_config(tmp_path, "solo", "localhost:9")))
    layout = StorageLayout.of(cfg.storage)
    inbox = create_inbox(layout.inbox)
    descriptor = staged(layout, "loader", list(range(1, 4001)), 1)
    assert commit_staged_part(layout, inbox, descriptor, "backfill:loader", 1)
    assert commit_staged_part(layout, inbox, None, "backfill:loader", 2), "all rejected: the position alone"
    assert not commit_staged_part(layout, inbox, staged(layout, "loader", [1], 1), "backfill:loader", 1)
    assert len(list(layout.backfill_staging("loader").iterdir())) == 1, "a version in already: its copy removed"
    assert descriptors(str(layout.inbox), 0, 2) == [(1, descriptor)]
    assert DeltaTable(str(layout.inbox)).to_pyarrow_table().num_rows == 0, "no rows in the inbox itself"
    view = InboxLog(str(layout.inbox))
    view.latest_version()
    assert (view.rows_in(1), view.rows_in(2)) == (4000, 0), "the planner bounds batches by the parts' rows"


def test_a_descriptor_naming_a_file_outside_the_staging_directory_moves_nothing(tmp_path):
    parts, layout = parts_of(tmp_path)
    layout.inbox.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "precious.parquet"
    pq.write_table(part_rows("loader", [1]), outside)
    forged = json.loads(staged(layout, "loader", [1], 1))
    forged["file"] = "../../precious.parquet"
    taken = parts.take(staged_parts.markers([(1, json.dumps(forged))]), {}, 0, NOW)
    assert not taken.stored and taken.rejected.num_rows == 1 and outside.exists()


def test_a_backfill_removes_the_staged_files_no_one_will_take_and_keeps_those_waiting(tmp_path):
    from replication.backfill.commit import remove_unclaimed_staged_files

    cfg = config.load(str(write_config(tmp_path, "solo", "localhost:9")))
    layout = StorageLayout.of(cfg.storage)
    # a part the instance stored (through 2), one waiting for it (3..5), one a killed run never handed over (6)
    staged(layout, "c", [1, 2], 1)
    waiting = staged(layout, "c", [3, 5], 3)
    staged(layout, "c", [6], 6)
    remove_unclaimed_staged_files(layout.backfill_staging("c"), done=5, stored=2)
    left = {p.name for p in layout.backfill_staging("c").iterdir()}
    assert left == {Path(staged_parts.StagedPart.from_json(waiting).file).name}, \
        "a stored part's file (its instance crashed before removing it) and a part never handed over go"


def test_parts_of_several_clients_take_seqs_in_inbox_order_and_a_failed_write_classifies_its_clients_parts(
        tmp_path, monkeypatch):
    parts, layout = parts_of(tmp_path)
    a1, b1, a2, c1 = (staged(layout, "a", [1, 2], 1), staged(layout, "b", [1], 1), staged(layout, "a", [3], 3),
                      staged(layout, "c", [1, 2, 3], 1))
    batch = staged_parts.markers([(1, a1), (2, b1), (3, a2), (4, c1)])
    taken = parts.take(batch, {}, 0, NOW)
    assert [(s.part.client, s.first_seq) for s in taken.stored] == [("a", 1), ("b", 3), ("a", 4), ("c", 5)]
    assert {c: (first.tolist(), last.tolist()) for c, (first, last) in taken.publisher_rows().items()} == {
        "a": ([1, 4], [2, 4]), "b": ([3], [3]), "c": ([5], [7])}, "each client's runs of local seqs"

    # b's file cannot be written in place: b's part is classified, the others' seqs stay contiguous
    (tmp_path / "second").mkdir()
    parts, layout = parts_of(tmp_path / "second")
    a1, b1, a2 = staged(layout, "a", [1, 2], 1), staged(layout, "b", [1], 1), staged(layout, "a", [3], 3)
    real = parquet_in_place.overwrite

    def failing(path, spans, values):
        if "seq" in values and Path(path).name == Path(staged_parts.StagedPart.from_json(b1).file).name:
            raise parquet_in_place.NotInPlace("read back wrong")
        return real(path, spans, values)

    monkeypatch.setattr(parquet_in_place, "overwrite", failing)
    taken = parts.take(staged_parts.markers([(1, a1), (2, b1), (3, a2)]), {}, 0, NOW)
    assert [(s.part.client, s.first_seq) for s in taken.stored] == [("a", 1), ("a", 3)]
    assert taken.candidates["publisher"].to_pylist() == ["b"] and taken.rows == 3
    stored = pq.read_table(taken.stored[1].path, columns=["seq"])["seq"].to_pylist()
    assert stored == [3], "a's second part written again after b's failure shifted the seqs"
    assert len(taken.consumed) == 1 and taken.consumed[0].parent == layout.txlog, \
        "b's file, moved before it failed, removed once the batch is committed"


def test_a_file_not_the_txlog_file_its_descriptor_says_is_classified_and_an_unreadable_one_rejected(tmp_path):
    parts, layout = parts_of(tmp_path)
    other = staged(layout, "ms", [1, 2], 1)
    path = layout.inbox / staged_parts.StagedPart.from_json(other).file
    rows = pq.read_table(path)
    rows = rows.set_column(rows.schema.get_field_index("persist_time"), "persist_time",
                           rows["persist_time"].cast(pa.timestamp("ms", tz="UTC"), safe=False))
    pq.write_table(rows, path, **parquet_in_place.writer_options(["seq", "persist_time"], rows.column_names))
    taken = parts.take(staged_parts.markers([(1, other)]), {}, 0, NOW)
    assert not taken.stored and taken.candidates["publisher_seq"].to_pylist() == ["1", "2"], \
        "a persist_time in milliseconds: not written over with microseconds"
    broken = staged(layout, "broken", [1, 2], 1)
    path = layout.inbox / staged_parts.StagedPart.from_json(broken).file
    path.write_bytes(b"PAR1 not really")
    taken = parts.take(pa.concat_tables([kafka_row("pub", 1), staged_parts.markers([(2, broken)])]), {}, 0, NOW)
    assert taken.candidates["publisher"].to_pylist() == ["pub"], "the batch goes on"
    (reason,) = taken.rejected["reason"].to_pylist()
    assert "cannot be read" in reason and "client broken's messages 1..2 (2) cannot be stored" in reason
    assert path.exists() and not taken.consumed, "kept for whoever looks into it"
