"""The SOW's rules without services: keys, delta_publish merges, sow_delete forms, order within a batch, rejects."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from replication.config.model import InstanceConfig, SowTopic, TopicSpec
from replication.ingest.classify import CANDIDATE_SCHEMA, TopicRecorder, classify
from replication.sow.keys import SowTopics, escape, key_of, parse_body, split_keys
from replication.sow.merge import merge, merged_body, serialize
from replication.sow.recent import RecentRows
from replication.sow.state import SowChanges, SowState
from replication.sow.table import SOW_SCHEMA, TAIL_SCHEMA, Changes, apply_changes, net_changes
from replication.txlog.publishers import PublisherState

CFG = InstanceConfig(
    name="amps-1",
    group="amps-1",
    storage="/tmp/unused",
    txlog_topics=(TopicSpec(".*", "json"), TopicSpec(".*", "fix"), TopicSpec(".*", "xml")),
    sow_topics=(
        SowTopic("/orders", "json", ("/id",)),
        SowTopic("^/regions/", "json", ("/region", "/id")),
        SowTopic("/quotes", "fix", ("/55",)),
        SowTopic("/blobs", "xml", ()),
    ),
)
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def rows(*specs: dict) -> pa.Table:
    """Candidate rows published by ``pub`` with increasing sequence numbers."""
    out = []
    for seq, spec in enumerate(specs, start=1):
        row = {name: None for name in CANDIDATE_SCHEMA.names}
        row.update(source="kafka", kafka_topic="amps-1.publish", kafka_partition=0, kafka_offset=seq,
                   publisher="pub", publisher_seq=str(seq), topic="/orders", message_type="json", command="publish")
        body = spec.pop("body", None)
        row["data"] = json.dumps(body).encode() if isinstance(body, (dict, list, int)) else body
        row.update(spec)
        out.append(row)
    return pa.Table.from_pylist(out, schema=CANDIDATE_SCHEMA)


def run(batch: pa.Table, sow: SowState, state: PublisherState | None = None):
    result = classify(batch, state or PublisherState(), instance="amps-1", recorded=TopicRecorder(CFG), sow=sow,
                      now=NOW)
    # as the ingest writer does: the next fold (or any read of the state) waits for it
    sow.apply_in_background(result.sow, result.sow.through_seq if result.sow is not None else sow.applied_seq)
    return result


def fresh() -> SowState:
    return SowState(SowTopics.of(CFG))


def records(sow: SowState, index: int = 0, topic: str = "/orders") -> dict[str, object]:
    return {key: json.loads(body) for key, body in sow.items(index, topic)}


# ---------------------------------------------------------------------------- keys and merges


def test_key_text_escapes_separators_and_lists_split_back():
    assert escape("a|b,c\\d") == "a\\|b\\,c\\\\d"
    keys = [escape("EU|x") + "|" + escape("1,2"), "plain", escape("back\\")]
    assert split_keys(",".join(keys)) == keys
    assert split_keys(" a , ,b ") == ["a", "b"]


def test_keys_from_json_fix_and_composite_definitions():
    orders, regions, quotes, _ = CFG.sow_topics
    assert key_of(orders, parse_body("json", b'{"id": 7}')) == "7"
    assert key_of(orders, parse_body("json", b'{"id": "7"}')) == "7", "a number and its text are one key"
    assert key_of(orders, parse_body("json", b'{"id": true}')) == "true"
    assert key_of(orders, parse_body("json", b'{"id": 7.5}')) == "7.5"
    for missing in (b'{"id": null}', b'{"id": ""}', b'{"id": {"a": 1}}', b'{"x": 1}', b"[1]"):
        assert key_of(orders, parse_body("json", missing)) is None, missing
    assert key_of(regions, parse_body("json", b'{"region": "EU|W", "id": 3}')) == "EU\\|W|3"
    assert key_of(quotes, parse_body("fix", b"35=S\x0155=IBM\x0155=MSFT\x01")) == "IBM", "first occurrence of a tag"
    assert key_of(quotes, parse_body("fix", b"35=S\x01")) is None


def test_json_merge_nests_objects_replaces_arrays_and_scalars_keeps_absent_fields():
    current = {"id": 1, "qty": 5, "tags": ["a", "b"], "addr": {"city": "Oslo", "geo": {"lat": 1, "lon": 2}}}
    delta = {"qty": 7, "tags": ["c"], "addr": {"geo": {"lat": 9}, "zip": "0150"}, "new": {"x": None}}
    assert merge("json", current, delta) == {
        "id": 1, "qty": 7, "tags": ["c"], "addr": {"city": "Oslo", "geo": {"lat": 9, "lon": 2}, "zip": "0150"},
        "new": {"x": None},
    }
    assert merge("json", {"a": {"b": 1}}, {"a": 5}) == {"a": 5}, "a scalar replaces an object"
    assert current["qty"] == 5, "the current record is not modified in place"
    # what the fold stores: the same merge, from the record's body as stored
    for record, change in [(current, delta), ({"a": {"b": 1}}, {"a": 5}), ([1, 2], {"a": 1}), ({}, {"n": {"m": {}}}),
                           ({"n": {"m": {"x": 1}, "y": 2}}, {"n": {"m": {"z": 3}}})]:
        before = json.dumps(change)
        assert merged_body("json", json.dumps(record).encode(), change) == serialize("json",
                                                                                     merge("json", record, change))
        assert json.dumps(change) == before, "the delta is only read"


def test_fix_merge_is_tag_by_tag():
    merged = merge("fix", parse_body("fix", b"35=S\x0155=IBM\x01132=10\x01"),
                   parse_body("fix", b"132=11\x01133=12\x01"))
    assert serialize("fix", merged) == b"35=S\x0155=IBM\x01132=11\x01133=12\x01"
    assert merged_body("fix", b"35=S\x0155=IBM\x01132=10\x01", parse_body("fix", b"132=11\x01133=12\x01")) == \
        b"35=S\x0155=IBM\x01132=11\x01133=12\x01"


# ---------------------------------------------------------------------------- a batch against the state


def test_delta_publish_merges_into_the_record_and_the_txlog_stores_the_merged_message():
    sow = fresh()
    run(rows({"body": {"id": 1, "qty": 5, "side": "buy", "n": {"a": 1}}}), sow)
    result = run(rows({"body": {"id": 1, "qty": 6, "n": {"b": 2}}, "command": "delta_publish",
                       "publisher": "other"}), sow)
    stored = result.txlog_rows.to_pylist()[0]
    assert stored["command"] == "publish" and stored["sow_key"] == "1"
    assert json.loads(stored["data"]) == {"id": 1, "qty": 6, "side": "buy", "n": {"a": 1, "b": 2}}
    assert records(sow) == {"1": {"id": 1, "qty": 6, "side": "buy", "n": {"a": 1, "b": 2}}}


def test_changes_to_one_key_within_a_batch_apply_in_seq_order():
    sow = fresh()
    result = run(rows(
        {"body": {"id": 1, "qty": 1}, "command": "delta_publish"},  # no record yet: stored as it is
        {"body": {"id": 1, "side": "sell"}, "command": "delta_publish"},  # merges into the one before
        {"body": {"id": 2, "qty": 2}},
        {"command": "sow_delete", "sow_keys": "2"},
        {"body": {"id": 2, "qty": 3}, "command": "delta_publish"},  # the record is gone: a publish again
        {"body": {"id": 1}, "command": "sow_delete"},  # by data
    ), sow)
    stored = [(r["command"], r["sow_key"], json.loads(r["data"]) if r["data"] else None)
              for r in result.txlog_rows.to_pylist()]
    assert stored == [
        ("publish", "1", {"id": 1, "qty": 1}),
        ("publish", "1", {"id": 1, "qty": 1, "side": "sell"}),
        ("publish", "2", {"id": 2, "qty": 2}),
        ("sow_delete", "2", None),
        ("publish", "2", {"id": 2, "qty": 3}),
        ("sow_delete", "1", {"id": 1}),
    ]
    assert records(sow) == {"2": {"id": 2, "qty": 3}}
    deletes = [r for r in result.txlog_rows.to_pylist() if r["command"] == "sow_delete"]
    assert [(r["sow_keys"], r["filter"]) for r in deletes] == [("2", None), (None, None)]


def test_sow_delete_by_filter_sees_the_batch_so_far_and_is_recorded_with_what_it_removed():
    sow = fresh()
    run(rows(*({"body": {"id": i, "qty": i * 10}} for i in range(1, 6))), sow)
    result = run(rows(
        {"body": {"id": 6, "qty": 60}, "publisher": "p2"},
        {"command": "sow_delete", "filter": "/qty >= 30", "publisher": "p2"},
        {"command": "sow_delete", "filter": "1=1", "topic": "/orders", "sow_keys": None, "publisher": "p3"},
    ), sow)
    deletes = [r for r in result.txlog_rows.to_pylist() if r["command"] == "sow_delete"]
    assert deletes[0]["filter"] == "/qty >= 30" and split_keys(deletes[0]["sow_key"]) == ["3", "4", "5", "6"]
    assert sorted(split_keys(deletes[1]["sow_key"])) == ["1", "2"]
    assert records(sow) == {}


def test_a_duplicate_delta_publish_is_not_merged_twice():
    sow = fresh()
    state = PublisherState()
    first = run(rows({"body": {"id": 1, "n": 1}}, {"body": {"id": 1, "n": 2}, "command": "delta_publish"}), sow, state)
    state.apply(0, {"last_seq": 2, "publishers": first.publishers})
    again = run(rows({"body": {"id": 1, "n": 1}}, {"body": {"id": 1, "n": 2}, "command": "delta_publish"}), sow, state)
    assert again.txlog_rows.num_rows == 0 and again.duplicates == 2 and again.sow is None
    assert records(sow) == {"1": {"id": 1, "n": 2}}


def test_sow_deletes_after_dropped_duplicates_remove_what_they_name():
    """Duplicates dropped ahead of sow_deletes in one batch: each kept delete still resolves its own keys."""
    sow = fresh()
    state = PublisherState()
    first = run(rows({"body": {"id": 1}}, {"body": {"id": 2}}), sow, state)
    state.apply(0, {"last_seq": 2, "publishers": first.publishers})
    result = run(rows(
        {"body": {"id": 1}}, {"body": {"id": 2}},  # pub's seqs 1 and 2 again: duplicates
        {"command": "sow_delete", "sow_keys": "1", "publisher": "p2", "publisher_seq": "1"},
        {"body": {"id": 3, "qty": 5}, "publisher": "p2", "publisher_seq": "2"},
        {"command": "sow_delete", "filter": "/id = 2", "publisher": "p2", "publisher_seq": "3"},
    ), sow, state)
    assert result.duplicates == 2
    assert [(r["command"], r["sow_key"]) for r in result.txlog_rows.to_pylist()] == [
        ("sow_delete", "1"), ("publish", "3"), ("sow_delete", "2")]
    assert records(sow) == {"3": {"id": 3, "qty": 5}}


def test_fix_topic_keyed_by_tag_with_filter_delete_on_a_tag():
    sow = fresh()
    run(rows(
        {"topic": "/quotes", "message_type": "fix", "body": b"35=S\x0155=IBM\x01132=10\x01"},
        {"topic": "/quotes", "message_type": "fix", "body": b"35=S\x0155=MSFT\x01132=20\x01"},
        {"topic": "/quotes", "message_type": "fix", "body": b"55=IBM\x01132=11\x01", "command": "delta_publish"},
        {"topic": "/quotes", "message_type": "fix", "command": "sow_delete", "filter": "/132 > 15"},
    ), sow)
    assert {k: body for k, body in sow.items(2, "/quotes")} == {"IBM": b"35=S\x0155=IBM\x01132=11\x01"}


def test_composite_keys_and_a_keyless_topic_take_the_header_key():
    sow = fresh()
    result = run(rows(
        {"topic": "/regions/eu", "body": {"region": "EU", "id": 1}},
        {"topic": "/regions/eu", "body": {"region": "US", "id": 1}},
        {"topic": "/blobs", "message_type": "xml", "body": b"<a/>", "sow_key": "blob-1"},
    ), sow)
    assert [r["sow_key"] for r in result.txlog_rows.to_pylist()] == ["EU|1", "US|1", "blob-1"]
    assert {k for k, _ in sow.items(1, "/regions/eu")} == {"EU|1", "US|1"}
    assert [k for k, _ in sow.items(3, "/blobs")] == ["blob-1"]


def test_non_sow_topics_keep_no_key_and_a_delta_publish_there_is_a_publish():
    result = run(rows({"topic": "/trades", "body": {"id": 1}, "command": "delta_publish", "sow_key": "x"}), fresh())
    stored = result.txlog_rows.to_pylist()[0]
    assert (stored["command"], stored["sow_key"], result.sow) == ("publish", None, None)


@pytest.mark.parametrize("spec,reason", [
    ({"body": {"qty": 1}}, "publish on SOW topic '/orders' has no value for key /id"),
    ({"topic": "/regions/x", "body": {"region": "EU"}}, "has no value for key /id"),
    ({"topic": "/blobs", "message_type": "xml", "body": b"<a/>"},
     "has no amps-sow-key header: the SOW topic '/blobs' has no <Key>"),
    ({"body": [1, 2], "command": "delta_publish"}, "delta_publish body is an array, not a JSON object"),
    ({"body": b"{nope", "command": "delta_publish"}, "body is not valid JSON"),
    ({"command": "sow_delete"}, "names nothing to delete: give amps-sow-keys, amps-filter or a body with the key"),
    ({"command": "sow_delete", "body": {"qty": 1}}, "its body has no value for /id"),
    ({"command": "sow_delete", "sow_keys": " , "}, "amps-sow-keys ' , ' names no key"),
    ({"command": "sow_delete", "filter": "/qty >> 3"}, "amps-filter does not parse: invalid filter at position 7"),
    ({"command": "sow_delete", "topic": "/trades", "sow_keys": "1"}, "not a SOW topic of this instance"),
    ({"topic": "/quotes", "message_type": "fix", "body": b"35=S\x01"}, "has no value for key /55"),
])
def test_bad_input_is_rejected_with_its_reason_and_changes_nothing(spec, reason):
    sow = fresh()
    run(rows({"body": {"id": 1}}), sow)
    result = run(rows(dict(spec, publisher="bad")), sow)
    assert result.txlog_rows.num_rows == 0 and result.publishers == {}
    (rejected,) = result.rejected_rows.to_pylist()
    assert reason in rejected["reason"], rejected["reason"]
    assert records(sow) == {"1": {"id": 1}}


# ---------------------------------------------------------------------------- the fold of stored rows


def test_net_changes_of_stored_rows_equal_what_the_batch_did():
    """What the compaction and the exact read fold from the txlog is what the ingest state holds."""
    sow = fresh()
    result = run(rows(
        {"body": {"id": 1, "v": 1}}, {"body": {"id": 2, "v": 2}},
        {"body": {"id": 1, "w": 3}, "command": "delta_publish"},
        {"command": "sow_delete", "filter": "/v = 2"}, {"body": {"id": 3, "v": 3}},
        {"command": "sow_delete", "sow_keys": "3"},
        {"body": {"id": 3, "v": 4}},
    ), sow)
    stored = result.txlog_rows
    changes = net_changes(stored, SowTopics.of(CFG), 0)
    folded = apply_changes(SOW_SCHEMA.empty_table(), changes, buckets=4)
    assert {r["sow_key"]: json.loads(r["data"]) for r in folded.to_pylist()} == {
        key: json.loads(body) for key, body in sow.items(0, "/orders")}
    assert {r["sow_key"]: r["seq"] for r in folded.to_pylist()} == {"1": 3, "3": 7}, "each record's last write"
    assert changes.deleted == {("/orders", "2")}


def test_the_exact_read_with_a_filter_tests_the_base_and_the_changes_after_it(tmp_path):
    """``replication sow --filter`` narrows the compacted base before the txlog's later rows are laid over it:
    a record that stops matching after the base is gone, one that starts matching appears."""
    from deltalake import write_deltalake

    from replication.expressions import Filter
    from replication.sow.table import SowTable, exact_records
    from replication.storage.layout import StorageLayout
    from replication.txlog.files import TxlogFiles
    from replication.txlog.schema import TXLOG_SCHEMA

    sow = fresh()
    stored = run(rows(
        *({"body": {"id": i, "qty": i * 10}} for i in range(1, 7)),  # ids 1..6: the base
        {"body": {"id": 2, "qty": 1}},  # matched in the base, no longer
        {"body": {"id": 1, "qty": 500}, "command": "delta_publish"},  # did not match, now does
        {"command": "sow_delete", "sow_keys": "5"},  # matched, deleted
        {"body": {"id": 9, "qty": 90}},  # new and matching
        {"body": {"id": 8, "qty": 8}},  # new, not matching
    ), sow).txlog_rows.select(TXLOG_SCHEMA.names).cast(TXLOG_SCHEMA)
    first, later = stored.slice(0, 6), stored.slice(6)
    layout = StorageLayout.of(str(tmp_path))
    txlog_path = str(layout.txlog)
    write_deltalake(txlog_path, first)
    table, topics = SowTable(layout, CFG.sow_topics[0]), SowTopics.of(CFG)
    txlog = TxlogFiles(txlog_path)
    txlog.refresh()
    assert table.compact(txlog, topics, 0, 6) and table.records().num_rows == 6
    write_deltalake(txlog_path, later, mode="append")
    txlog.refresh()

    selected = exact_records(table, txlog, topics, 0, topic="/orders", filter=Filter("/qty >= 20"))
    got = {r["sow_key"]: json.loads(r["data"])["qty"] for r in selected.to_pylist()}
    assert got == {"1": 500, "3": 30, "4": 40, "6": 60, "9": 90}
    everything = exact_records(table, txlog, topics, 0, topic="/orders")
    assert {r["sow_key"]: r["data"] for r in everything.to_pylist()} == {k: b for k, b in sow.items(0, "/orders")}


def test_a_compactions_vacuum_removes_the_files_it_replaced_and_never_another_writers(tmp_path, monkeypatch):
    """A user's OPTIMIZE (or any writer) has written a file it has not committed yet when a compaction runs: the
    compaction's vacuum must leave it, or that writer's commit would name a file that is gone."""
    import pyarrow.parquet as pq
    from deltalake import write_deltalake

    from replication.sow import table as sow_table
    from replication.sow.table import SowTable
    from replication.storage.layout import StorageLayout
    from replication.txlog.files import TxlogFiles
    from replication.txlog.schema import TXLOG_SCHEMA

    monkeypatch.setattr(sow_table, "KEEP_SNAPSHOTS_S", -1.0)  # no snapshot kept: every replaced file may go
    sow = fresh()
    stored = run(rows(*({"body": {"id": i % 4, "qty": i}} for i in range(12))), sow).txlog_rows
    stored = stored.select(TXLOG_SCHEMA.names).cast(TXLOG_SCHEMA)
    layout = StorageLayout.of(str(tmp_path))
    write_deltalake(str(layout.txlog), stored.slice(0, 6))
    table, topics, txlog = SowTable(layout, CFG.sow_topics[0]), SowTopics.of(CFG), TxlogFiles(str(layout.txlog))
    txlog.refresh()
    assert table.compact(txlog, topics, 0, 6)
    first_files = set(table.table.file_uris())
    in_flight = table.path / "bucket=0" / "part-in-flight-of-another-writer.parquet"
    in_flight.parent.mkdir(exist_ok=True)
    pq.write_table(table.records().slice(0, 1), in_flight)
    write_deltalake(str(layout.txlog), stored.slice(6), mode="append")
    txlog.refresh()
    assert table.compact(txlog, topics, 0, 12)
    on_disk = {str(p) for p in table.path.glob("**/*.parquet")}
    assert str(in_flight) in on_disk, "the vacuum deleted a file no commit names yet"
    assert not first_files & on_disk, "the files the compaction replaced are removed"


def test_net_changes_keep_each_records_last_change_over_random_rows():
    """The column-wise fold equals the plain one: the last write or removal per (topic, key), in row order."""
    import random

    rng = random.Random(7)
    topics = SowTopics.of(CFG)
    keys = ["1", "2", "3", "a\\,b", "c\\|d", " 4 "]
    specs = []
    for _ in range(3000):
        topic, message_type = rng.choice([("/orders", "json"), ("/regions/eu", "json"), ("/orders", "fix"),
                                          ("/other", "json")])
        if rng.random() < 0.2:
            command, sow_key = "sow_delete", ",".join(rng.sample(keys, rng.randint(0, 3)))
        else:
            command, sow_key = rng.choice(["publish", "delta_publish"]), rng.choice(keys).strip()
        specs.append({"topic": topic, "message_type": message_type, "command": command,
                      "sow_key": None if rng.random() < 0.05 else sow_key, "position": len(specs)})
    table = pa.Table.from_pylist(specs)
    for index in range(2):
        last: dict[tuple[str, str], int] = {}
        for row in specs:
            if row["sow_key"] is None or topics.index(row["topic"], row["message_type"]) != index:
                continue
            for key in split_keys(row["sow_key"]) if row["command"] == "sow_delete" else [row["sow_key"]]:
                last[(row["topic"], key)] = -1 if row["command"] == "sow_delete" else row["position"]
        changes = net_changes(table, topics, index)
        assert changes.upserts["position"].to_pylist() == sorted(p for p in last.values() if p >= 0)
        assert changes.deleted == {k for k, p in last.items() if p < 0} and changes.deleted
    assert net_changes(table.slice(0, 0), topics, 0).upserts.num_rows == 0


def test_applying_changes_replaces_or_drops_only_the_records_of_their_own_topic():
    """Two topics of one ``<SOW><Topic>`` (a regex) with the same keys: a change to one leaves the other."""
    def record(topic: str, key: str, seq: int) -> dict:
        return {"bucket": 0, "sow_key": key, "topic": topic, "seq": seq, "bookmark": f"b{seq}", "publisher": "p",
                "publisher_seq": seq, "message_type": "json", "origin": None, "publish_time": NOW,
                "persist_time": NOW, "data": b"{}"}
    base = pa.Table.from_pylist([record(t, k, n) for n, (t, k) in enumerate(
        [("/regions/eu", "1"), ("/regions/us", "1"), ("/regions/eu", "2"), ("/regions/us", "2"), ("/r", "3")])],
        schema=SOW_SCHEMA)
    upserts = pa.Table.from_pylist([{**record("/regions/eu", "1", 10), "command": "publish"}]).drop(["bucket"])
    changes = Changes(upserts, {("/regions/us", "2"), ("/regions/us", "3")})
    after = apply_changes(base, changes, buckets=4)
    assert sorted((r["topic"], r["sow_key"], r["seq"]) for r in after.to_pylist()) == [
        ("/r", "3", 4), ("/regions/eu", "1", 10), ("/regions/eu", "2", 2), ("/regions/us", "1", 1)]


def test_batches_interleaving_topics_of_one_sow_topic_fold_as_a_plain_reference():
    """Random publishes, delta_publishes and sow_deletes (keys, data, filter) on two topics of one regex
    ``<SOW><Topic>`` and on another SOW topic, interleaved and cut into batches of random sizes: each stored body,
    each delete's removed keys and the final records are those a plain fold of the ops in order gives."""
    import random

    from support.sow_reference import Op
    from support.sow_reference import fold as reference_fold

    rng = random.Random(5)
    topics = ["/regions/eu", "/regions/us", "/orders"]

    def key(topic: str, doc: dict) -> str:
        return str(doc["id"]) if topic == "/orders" else f"{doc['region']}|{doc['id']}"

    def body(topic: str, i: int, **fields) -> bytes:
        doc = {"id": i, **fields} if topic == "/orders" else {"region": topic[-2:], "id": i, **fields}
        return json.dumps(doc).encode()

    ops: list[Op] = []
    for n in range(3000):
        topic, i, roll = rng.choice(topics), rng.randrange(40), rng.random()
        if roll < 0.55:
            ops.append(Op("publish", topic, body(topic, i, qty=rng.randrange(1000), tags=[n])))
        elif roll < 0.85:
            ops.append(Op("delta_publish", topic, body(topic, i, qty=rng.randrange(1000), more={"n": n})))
        elif roll < 0.93:
            ids = [rng.randrange(40) for _ in range(rng.randint(1, 3))]
            ops.append(Op("sow_delete", topic, keys=tuple(
                str(k) if topic == "/orders" else f"{topic[-2:]}|{k}" for k in ids)))
        elif roll < 0.98:
            ops.append(Op("sow_delete", topic, body(topic, i)))
        else:
            ops.append(Op("sow_delete", topic, filter=f"/qty > {rng.randrange(1000)}"))
    reference = reference_fold(ops, lambda flt, _, doc: doc.get("qty", -1) > int(flt.rsplit(" ", 1)[1]), key)

    sow, state, stored = fresh(), PublisherState(), []
    at = 0
    while at < len(ops):
        size = rng.choice([1, 7, 50, 400])
        chunk = ops[at:at + size]
        batch = rows(*({"topic": op.topic, "command": op.command, "body": op.body, "sow_keys": ",".join(op.keys)
                        if op.keys else None, "filter": op.filter} for op in chunk))
        batch = batch.set_column(batch.schema.get_field_index("publisher_seq"), "publisher_seq",
                                 pa.array([str(s) for s in range(at + 1, at + len(chunk) + 1)]))
        result = run(batch, sow, state)
        assert result.rejected_rows.num_rows == 0, result.rejected_rows.column("reason").to_pylist()[:3]
        state.apply(0, {"last_seq": state.max_seq + result.txlog_rows.num_rows, "publishers": result.publishers})
        stored += result.txlog_rows.to_pylist()
        at += len(chunk)

    assert len(stored) == len(ops)
    for row, op, (doc, removed) in zip(stored, ops, reference.stored, strict=True):
        if op.command == "sow_delete":
            assert set(split_keys(row["sow_key"]) if row["sow_key"] else []) == removed, (op, row["sow_key"])
        else:
            assert (row["sow_key"], json.loads(row["data"])) == (key(op.topic, doc), doc), op
    got = {(topic, k): json.loads(b) for index, topic in ((1, "/regions/eu"), (1, "/regions/us"), (0, "/orders"))
           for k, b in sow.items(index, topic)}
    assert got == reference.records and len(got) > 20


def test_a_batch_applied_in_the_background_is_waited_for_by_every_read_and_a_failure_is_raised():
    import threading

    class Held(dict):
        """A batch's changes whose application waits until the test lets it go."""
        release = threading.Event()

        def items(self):
            assert self.release.wait(30)
            return super().items()

    sow = fresh()
    run(rows({"body": {"id": 1, "qty": 1}}, {"body": {"id": 2, "qty": 2}}), sow)
    changes = SowChanges(9, Held({(0, "/orders"): {"1": None, "3": b'{"id":3}'}}))
    sow.apply_in_background(changes, 9)
    counted: list[int] = []
    reader = threading.Thread(target=lambda: counted.append(sow.count()))
    reader.start()
    reader.join(0.5)
    assert reader.is_alive() and not counted  # still waiting for the batch, not counting a half-applied state
    Held.release.set()
    reader.join(30)
    assert counted == [2] and sow.applied_seq == 9
    assert set(records(sow)) == {"2", "3"}

    class Broken(dict):
        def items(self):
            raise MemoryError("no room")

    sow.apply_in_background(SowChanges(10, Broken()), 10)
    with pytest.raises(RuntimeError, match="could not take a committed batch; restart the instance"):
        run(rows({"body": {"id": 4}}), sow)


# ---------------------------------------------------------------------------- compaction's recent rows


def _txlog_rows(first: int, last: int) -> pa.Table:
    """Txlog rows ``first`` .. ``last`` (TAIL_SCHEMA); every third one on no SOW topic (no sow_key)."""
    seqs = list(range(first, last + 1))
    n = len(seqs)
    return pa.table({
        "seq": pa.array(seqs, pa.int64()), "topic": ["/orders"] * n, "message_type": ["json"] * n,
        "command": ["publish"] * n, "sow_key": [None if s % 3 == 0 else str(s % 50) for s in seqs],
        "bookmark": [f"p|{s}|" for s in seqs], "publisher": ["p"] * n, "publisher_seq": pa.array(seqs, pa.int64()),
        "origin": ["a"] * n, "publish_time": [NOW] * n, "persist_time": [NOW] * n,
        "data": [b'{"id":%d}' % s for s in seqs]}).cast(TAIL_SCHEMA)


def test_recent_rows_answer_as_the_txlog_does_and_only_what_they_do_not_hold_is_read_there():
    txlog = _txlog_rows(1, 2_000)
    reads: list[tuple[int, int]] = []

    def read_txlog(a: int, b: int) -> pa.Table:
        reads.append((a, b))
        return txlog.filter(pc.and_(pc.greater(txlog["seq"], a), pc.less_equal(txlog["seq"], b)))

    def sow_rows(table: pa.Table) -> list[dict]:
        return table.filter(pc.is_valid(table["sow_key"])).to_pylist()

    recent = RecentRows(TAIL_SCHEMA, max_rows=500)
    at = 300  # rows 1..300 were committed before this process: never handed over
    for size in [0, 2, 1, 55, 0, 200, 93, 49]:  # batches, some empty (a commit with no row); 303 alone: no SOW row
        recent.add(txlog.slice(at, size), at + 1, at + size)
        at += size
    assert at == 700
    for since, through in [(0, 700), (250, 650), (300, 700), (450, 451), (699, 700)]:
        reads.clear()
        assert sow_rows(recent.rows(since, through, read_txlog)) == sow_rows(read_txlog(since, through))
        assert reads[:-1] == ([(since, 300)] if since < 300 else [])  # the last read is the reference's
    reads.clear()
    assert recent.rows(100, 800, read_txlog) is not None and reads == [(100, 800)]  # not all held: all read

    # the bound: 400 rows held, 500 more; the oldest batches (through 700) are let go, then read there
    recent.add(txlog.slice(700, 500), 701, 1_200)
    reads.clear()
    assert sow_rows(recent.rows(300, 1_200, read_txlog)) == sow_rows(read_txlog(300, 1_200))
    assert reads[0] == (300, 700)
    # what every table's base holds is let go; a gap (rows committed some other way) starts again
    recent.drop_through(1_000)
    reads.clear()
    assert sow_rows(recent.rows(1_000, 1_200, read_txlog)) == sow_rows(read_txlog(1_000, 1_200)) and len(reads) == 1
    recent.add(txlog.slice(1_300, 100), 1_301, 1_400)
    reads.clear()
    recent.rows(1_200, 1_400, read_txlog)
    assert reads[0] == (1_200, 1_300)


def test_repeated_compactions_keep_the_table_equal_to_the_fold_and_reread_a_table_another_wrote(tmp_path):
    """A compactor keeps the base it wrote in memory for its next compaction: the table a plain reader opens
    equals the fold after each one, and a commit by another writer in between is read, not overwritten."""
    import random

    from deltalake import DeltaTable, write_deltalake

    from replication.sow.table import SowTable
    from replication.storage.layout import StorageLayout
    from replication.txlog.files import TxlogFiles
    from replication.txlog.schema import TXLOG_SCHEMA

    rng = random.Random(3)
    layout = StorageLayout.of(str(tmp_path))
    txlog_path = str(layout.txlog)
    sow, state, topics = fresh(), PublisherState(), SowTopics.of(CFG)
    table = SowTable(layout, CFG.sow_topics[0])
    txlog = TxlogFiles(txlog_path)
    recent = RecentRows(TAIL_SCHEMA)
    for round_ in range(6):
        ops = []
        for _ in range(300):
            i, roll = rng.randrange(200), rng.random()
            ops.append({"body": {"id": i, "qty": rng.randrange(100)}} if roll < 0.7 else
                       {"body": {"id": i, "fill": [round_]}, "command": "delta_publish"} if roll < 0.9 else
                       {"command": "sow_delete", "sow_keys": str(i)} if roll < 0.98 else
                       {"command": "sow_delete", "filter": f"/qty > {rng.randrange(90, 100)}"})
        batch = rows(*ops)
        batch = batch.set_column(batch.schema.get_field_index("publisher_seq"), "publisher_seq",
                                 pa.array([str(state.max_seq + k) for k in range(1, batch.num_rows + 1)]))
        first = state.max_seq + 1
        stored = run(batch, sow, state).txlog_rows.select(TXLOG_SCHEMA.names).cast(TXLOG_SCHEMA)
        write_deltalake(txlog_path, stored, mode="append")
        state.max_seq += stored.num_rows
        state.publishers["pub"] = state.max_seq
        recent.add(stored, first, state.max_seq)
        if round_ == 3:  # another writer compacts this round: the next compaction must read what it wrote
            assert SowTable(layout, CFG.sow_topics[0]).compact(txlog, topics, 0, state.max_seq)
            assert not table.compact(txlog, topics, 0, state.max_seq, recent)
        else:
            assert table.compact(txlog, topics, 0, state.max_seq, recent)
        plain = DeltaTable(str(table.path)).to_pyarrow_table().to_pylist()
        assert len({r["sow_key"] for r in plain}) == len(plain)
        assert {r["sow_key"]: r["data"] for r in plain} == {k: b for k, b in sow.items(0, "/orders")}
    assert table._base is not None, "200 keys over 16 buckets: every bucket rewritten, so the base is kept"


def test_stored_bodies_are_replaced_row_by_row_across_chunks():
    """The merged bodies land on their own rows whatever the chunks of the batch's data column."""
    import numpy as np

    from replication.ingest.classify import _replaced

    column = pa.chunked_array([pa.array([b"a", b"b"], pa.binary()), pa.array([], pa.binary()),
                               pa.array([b"c", b"d", b"e"], pa.binary())])
    changed = np.array([False, True, True, False, True])
    got = _replaced(column, changed, [b"B", None, b"E"])
    assert got.to_pylist() == [b"a", b"B", None, b"d", b"E"]
    assert _replaced(column, np.zeros(5, dtype=bool), []).to_pylist() == column.to_pylist()
