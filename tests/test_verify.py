"""``replication verify`` on tables written by hand: what it leaves out, what it reports, Spark agreeing.

What it leaves out as still on its way, what it reports, and the same findings from the Spark engine (the
running fabrics are in faults/test_destinations_down.py, test_mesh.py, test_sow.py).

The fabric: A and B, one group, replicate to each other without PassThrough; C sends to both. C's message 2
is at A but not yet at B: while C -> B has not acknowledged it, nothing is reported (a running fabric verifies
clean); once C -> B says it is acknowledged, its absence at B is a finding of the link, of the group and of
the group's SOW.
"""

from __future__ import annotations

from datetime import datetime, timezone

import orjson
import pyarrow as pa
import pytest
from deltalake import write_deltalake
from support.factories import destination_xml, replication_xml, write_config

from replication.config.fabric import Fabric
from replication.messages import bookmark
from replication.sow.table import SowTable, as_records
from replication.storage.control import LinkState
from replication.storage.layout import StorageLayout
from replication.txlog.schema import TXLOG_SCHEMA
from replication.verify import verify

SOW = "<Topic><Name>/orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>"
T = datetime(2026, 11, 23, 9, 30, tzinfo=timezone.utc)


def message(publisher: str, publisher_seq: int, key: str, qty: int) -> dict:
    return {"bookmark": bookmark(publisher, publisher_seq), "publisher": publisher, "publisher_seq": publisher_seq,
            "topic": "/orders", "message_type": "json", "command": "publish", "sow_key": key,
            "data": orjson.dumps({"id": key, "qty": qty})}


def write_txlog(root, name: str, messages: list[dict], received_from: str | None = None) -> None:
    rows = [{**m, "seq": seq, "sow_keys": None, "filter": None, "origin": m["publisher"].split("-")[0],
             "received_from": received_from, "received_from_group": received_from,
             "path": [received_from, name] if received_from else [name], "publish_time": T, "persist_time": T}
            for seq, m in enumerate(messages, start=1)]
    write_deltalake(str(StorageLayout.of(str(root / name)).txlog), pa.Table.from_pylist(rows, TXLOG_SCHEMA))


def link(root, up: str, down: str, acked: int) -> None:
    LinkState(down, "async", address=str(root / down), downstream=down, state="connected",
              sent_seq=acked).write(StorageLayout.of(str(root / up)).link_file(down))


@pytest.fixture
def fabric(tmp_path):
    paths = [
        write_config(tmp_path, "a", "localhost:9", group="G", sow=SOW, replication=replication_xml(
            destination_xml("b", [tmp_path / "b"], group="G", passthrough=None))),
        write_config(tmp_path, "b", "localhost:9", group="G", sow=SOW, replication=replication_xml(
            destination_xml("a", [tmp_path / "a"], group="G", passthrough=None))),
        write_config(tmp_path, "c", "localhost:9", replication=replication_xml(
            destination_xml("a", [tmp_path / "a"]), destination_xml("b", [tmp_path / "b"]))),
    ]
    x1, x2 = message("c-pub", 1, "k1", 10), message("c-pub", 2, "k2", 20)
    write_txlog(tmp_path, "c", [x1, x2])
    write_txlog(tmp_path, "a", [x1, x2], received_from="c")
    write_txlog(tmp_path, "b", [x1], received_from="c")
    loaded = Fabric.load(paths)
    for name in ("a", "b"):
        SowTable(StorageLayout.of(loaded[name].storage), loaded[name].sow_topics[0])
    link(tmp_path, "a", "b", 2)
    link(tmp_path, "b", "a", 1)
    link(tmp_path, "c", "a", 2)
    link(tmp_path, "c", "b", 1)  # message 2 is on its way to B
    return tmp_path, loaded


def found(report) -> set[tuple]:
    return {(f.kind, f.upstream, f.downstream, f.seq_ranges or f.keys) for f in report.findings}


def test_what_is_still_on_its_way_is_left_out_and_reported_once_acknowledged(fabric):
    root, loaded = fabric
    report = verify(loaded)
    assert report.ok, [f.message for f in report.findings]
    assert [(s.topic, s.messages) for s in report.sows] == [("/orders", 1)], "k2 is left out while it changes"

    link(root, "c", "b", 2)  # B acknowledges message 2, but does not hold it
    report = verify(loaded)
    assert found(report) == {
        ("missing", "c", "b", ((2, 2),)),
        ("group", "a", "b", ((2, 2),)),
        ("sow", "a", "b", ("k2",)),
    }
    assert any("SOW '/orders': 1 record(s) held by a only: key k2" in f.message for f in report.findings)


def test_a_sow_record_changed_by_hand_is_a_finding_and_spark_finds_what_arrow_finds(fabric, spark):
    root, loaded = fabric
    link(root, "c", "b", 2)
    # B's SOW base gets a different body for k1 (as if its SOW had diverged)
    b = loaded["b"]
    table = SowTable(StorageLayout.of(b.storage), b.sow_topics[0])
    changed = {**message("c-pub", 1, "k1", 999), "seq": 1, "origin": "c", "publish_time": T, "persist_time": T}
    table.replace(as_records(pa.Table.from_pylist([changed]), table.buckets), through=1)
    arrow = verify(loaded, engine="arrow")
    assert ("sow", "a", "b", ("k1",)) in found(arrow)
    assert any("with different bodies: key k1" in f.message for f in arrow.findings)
    on_spark = verify(loaded, engine="spark", spark=spark)
    assert on_spark.engine == "spark" and found(on_spark) == found(arrow)
    assert [(c.upstream, c.downstream, c.messages) for c in on_spark.links + on_spark.groups] == \
        [(c.upstream, c.downstream, c.messages) for c in arrow.links + arrow.groups]


def test_a_queue_message_acknowledged_twice_is_a_finding_but_a_barrier_once_per_instance_is_not(tmp_path):
    """Acknowledgement rows as consumers at two instances would leave them after a proxied transfer: one message
    acknowledged at both is a finding; a barrier message, which each instance delivers, may be acknowledged once
    at each, not twice at one."""
    queue = ("<Queue><Name>/work</Name><MessageType>json</MessageType><UnderlyingTopic>/tasks</UnderlyingTopic>"
             "<Semantics>at-least-once</Semantics><BarrierExpression>/barrier = 1</BarrierExpression></Queue>")
    path = write_config(tmp_path, "amps-1", "localhost:9", sow=queue)
    cfg = Fabric.load([str(path)])["amps-1"]
    now = datetime.now(timezone.utc)
    messages = [("amps-1", {"task": 1}), ("amps-1", {"task": 2}), ("amps-2", {"barrier": 1}),
                ("amps-1", {"barrier": 1})]
    marks = [bookmark("feed", n + 1) for n in range(len(messages))]
    acks = [("w-a", 1, "amps-1", [marks[0], marks[1]]), ("w-b", 1, "amps-2", [marks[1]]),  # 2: twice
            ("w-a", 2, "amps-1", [marks[2]]), ("w-b", 2, "amps-2", [marks[2]]),  # barrier 3: once at each
            ("w-a", 3, "amps-1", [marks[3]]), ("w-a", 4, "amps-1", [marks[3]])]  # barrier 4: twice at one
    rows = [{"bookmark": mark, "publisher": "feed", "publisher_seq": n + 1, "topic": "/tasks", "command": "publish",
             "data": orjson.dumps(body), "origin": origin} for n, (mark, (origin, body)) in enumerate(
                 zip(marks, messages, strict=True))]
    rows += [{"bookmark": bookmark(client, seq), "publisher": client, "publisher_seq": seq, "topic": "/work",
              "command": "sow_delete", "sow_keys": ",".join(named), "data": b"", "origin": origin}
             for client, seq, origin, named in acks]
    table = pa.Table.from_pylist([{**row, "seq": n + 1, "message_type": "json", "persist_time": now,
                                   "publish_time": now, "path": [row["origin"]]} for n, row in enumerate(rows)],
                                 schema=TXLOG_SCHEMA)
    write_deltalake(str(StorageLayout.of(cfg.storage).txlog), table)

    report = verify(Fabric([cfg]))
    [compared] = report.queues
    assert compared.messages == 4
    [finding] = report.findings
    assert finding.kind == "queue" and finding.topic == "/work"
    assert finding.bookmarks == tuple(sorted([marks[1], marks[3]]))
    assert "2 message(s) acknowledged more than once" in finding.message
