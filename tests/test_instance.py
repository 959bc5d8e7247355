"""One instance end to end: real broker, real Spark, real Delta tables."""

from __future__ import annotations

import random
import threading
import time
import uuid

import pytest
from kafka import KafkaProducer
from support.factories import assert_exactly_once, raw_publish, rejected_rows, txlog_rows, wait_until, write_config

from replication import config
from replication.client import Publisher
from replication.durability import acks_topic
from replication.instance import Instance


@pytest.fixture
def start_instance(spark, broker, tmp_path):
    started: list[Instance] = []

    def start(**kwargs) -> Instance:
        name = f"i{uuid.uuid4().hex[:8]}"
        cfg = config.load(str(write_config(tmp_path, name, broker.bootstrap, **kwargs)))
        inst = Instance(cfg, spark).start()
        started.append(inst)
        return inst

    yield start
    for inst in started:
        inst.stop()


def publisher(broker, inst: Instance, client: str, tmp_path) -> Publisher:
    return Publisher(client, bootstrap=broker.bootstrap, topic=f"{inst.name}.publish", instance=inst.name,
                     store_path=tmp_path / f"{client}.store")


def test_100k_from_4_publishers_with_duplicates_are_stored_exactly_once(start_instance, broker, tmp_path, read_path):
    inst = start_instance()
    clients = [f"pub-{i}" for i in range(4)]
    pubs = [publisher(broker, inst, c, tmp_path) for c in clients]
    # 100k through the default path; the forced Spark-collect path is the same code on other batches, so a
    # fifth of the volume shows it (and keeps the suite's time down)
    per_client = 25_000 if read_path == "driver-read" else 5_000
    oob = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)  # a second, unrelated Kafka client
    rng = random.Random(7)
    sent_copies = 0

    def first_half(pub):
        for i in range(per_client // 2):
            pub.publish("/orders", b'{"id": %d, "qty": %d}' % (i, i % 500))

    threads = [threading.Thread(target=first_half, args=(p,)) for p in pubs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for pub in pubs:
        pub.logon()  # re-sends whatever is not yet acknowledged: duplicates for the instance to drop
    for client in clients:
        for seq in rng.sample(range(1, per_client // 2 + 1), 1250):
            raw_publish(oob, f"{inst.name}.publish", b'{"copy": true}', amps_client=client, amps_seq=str(seq),
                        amps_topic="/orders")
            sent_copies += 1
    oob.flush()

    def second_half(pub):
        for i in range(per_client // 2, per_client):
            pub.publish("/orders", b'{"id": %d, "qty": %d}' % (i, i % 500))
        pub.flush(timeout=300)

    threads = [threading.Thread(target=second_half, args=(p,)) for p in pubs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for pub in pubs:
        assert pub.persisted_seq == per_client
        pub.close()

    rows = txlog_rows(tmp_path, inst.name, ["seq", "publisher", "publisher_seq", "data"])
    assert rows.num_rows == 4 * per_client
    assert_exactly_once(rows, {c: per_client for c in clients})
    assert b'{"copy": true}' not in set(rows["data"].to_pylist()), "an out-of-band copy replaced the original"
    assert inst.status().counters["duplicates"] >= sent_copies
    in_driver = inst.writer.driver_read.batches
    assert in_driver > 0 if read_path == "driver-read" else in_driver == 0, in_driver
    if read_path == "driver-read":  # batches read as soon as Spark planned them, the rows still exactly once
        assert inst.writer.driver_read.ahead.hits > 0, (inst.writer.driver_read.ahead.hits, in_driver)


def test_a_publisher_gets_its_acks_from_an_acks_topic_with_a_long_history(start_instance, broker, tmp_path):
    """The acks topic keeps every ack ever sent: a new publisher starts at its end and still gets its logon reply
    and its acks."""
    inst = start_instance()
    history = KafkaProducer(bootstrap_servers=broker.bootstrap, batch_size=0, linger_ms=0)  # a batch per record
    for i in range(6000):
        history.send(acks_topic(inst.name), key=b"an-earlier-client", value=b'{"seq": %d}' % i)
    history.flush()
    history.close()
    pub = Publisher("patient", bootstrap=broker.bootstrap, topic=f"{inst.name}.publish", instance=inst.name,
                    store_path=tmp_path / "patient.store", logon_timeout=60)
    try:
        for i in range(20):
            pub.publish("/orders", b'{"id": %d}' % i)
        pub.flush(timeout=120)
        assert pub.persisted_seq == 20
    finally:
        pub.close()
    assert_exactly_once(txlog_rows(tmp_path, inst.name), {"patient": 20})


def test_bad_messages_go_to_rejected_with_reason_and_the_instance_keeps_running(start_instance, broker, tmp_path):
    inst = start_instance(txlog_topics="<Topic><Name>/orders.*</Name><MessageType>json</MessageType></Topic>"
                                       "<Topic><Name>/orders.*</Name><MessageType>xml</MessageType></Topic>")
    topic = f"{inst.name}.publish"
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    raw_publish(producer, topic, b'{"a": 1}', amps_seq="1", amps_topic="/orders")  # no client
    raw_publish(producer, topic, b'{"a": 1}', amps_client="bad", amps_topic="/orders")  # no seq
    raw_publish(producer, topic, b'{"a": 1}', amps_client="bad", amps_seq="seven", amps_topic="/orders")
    raw_publish(producer, topic, b'{"a": ', amps_client="bad", amps_seq="1", amps_topic="/orders")
    raw_publish(producer, topic, b'{"a": 1}', amps_client="bad", amps_seq="2", amps_topic="/trades")
    raw_publish(producer, topic, b"not xml", amps_client="bad", amps_seq="3", amps_topic="/orders", amps_type="xml")
    raw_publish(producer, topic, b'{"ok": 1}', amps_client="good", amps_seq="1", amps_topic="/orders")
    producer.flush()

    wait_until(lambda: txlog_rows(tmp_path, inst.name).num_rows == 1, what="the good message in the txlog")
    reasons = sorted(r["reason"] for r in rejected_rows(tmp_path, inst.name))
    assert len(reasons) == 6
    expected = ["missing amps-client header", "missing amps-seq header", "'seven' is not a decimal",
                "body is not valid JSON", "topic '/trades' (json) is not recorded", "body is not well-formed XML"]
    for fragment in expected:
        assert any(fragment in r for r in reasons), f"no rejection mentions {fragment!r}: {reasons}"
    assert txlog_rows(tmp_path, inst.name)["publisher"].to_pylist() == ["good"]
    assert inst.status().running


def test_logon_reports_the_last_persisted_sequence(start_instance, broker, tmp_path):
    inst = start_instance()
    with publisher(broker, inst, "logon-client", tmp_path) as pub:
        for i in range(10):
            pub.publish("/orders", b'{"i": %d}' % i)
        pub.flush(timeout=120)
    again = publisher(broker, inst, "logon-client", tmp_path)
    try:
        assert again.last_logon_seq == 10
        assert again.publish("/orders", b'{"i": 10}') == 11
        again.flush(timeout=120)
    finally:
        again.close()
    assert txlog_rows(tmp_path, inst.name)["publisher_seq"].to_pylist() == list(range(1, 12))


def test_publishers_json_catches_up_with_the_txlog_once_batches_stop(start_instance, broker, tmp_path):
    """The snapshot is written by the heartbeat, off the batches' path: within a second or so of the last
    batch it holds every publisher's last stored sequence and the txlog's version."""
    from deltalake import DeltaTable

    from replication.storage.control import PublishersSnapshot

    inst = start_instance()
    with publisher(broker, inst, "snap-a", tmp_path) as a, publisher(broker, inst, "snap-b", tmp_path) as b:
        for i in range(30):
            (a if i % 3 else b).publish("/orders", b'{"i": %d}' % i)
        a.flush(timeout=120)
        b.flush(timeout=120)

    def caught_up():
        saved = PublishersSnapshot.read(inst.layout.publishers_json)
        return saved is not None and saved.publishers == {"snap-a": 20, "snap-b": 10} and \
            saved.txlog_version == DeltaTable(str(inst.layout.txlog)).version()

    wait_until(caught_up, timeout=30, what="publishers.json at the txlog's version")
    assert PublishersSnapshot.read(inst.layout.publishers_json).max_seq == 30


def test_a_failed_ingest_query_is_restarted_and_loses_nothing(start_instance, broker, tmp_path):
    from replication import failpoints

    inst = start_instance(max_offsets=100)
    failpoints.arm("ingest.after_txlog_commit@3:raise")  # the 3rd batch fails after its commit
    try:
        with publisher(broker, inst, "survivor", tmp_path) as pub:
            for i in range(600):
                pub.publish("/orders", b'{"i": %d}' % i)
            pub.flush(timeout=240)
    finally:
        failpoints.arm("")
    assert inst.restarts >= 1
    assert_exactly_once(txlog_rows(tmp_path, inst.name), {"survivor": 600})


def _raw_orders(broker, inst: Instance, client: str, count: int) -> None:
    """``count`` publishes by a Kafka producer that never sends one again: a row lost stays lost."""
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for seq in range(1, count + 1):
        raw_publish(producer, f"{inst.name}.publish", b'{"i": %d}' % seq, amps_client=client, amps_seq=str(seq),
                    amps_topic="/orders")
    producer.flush()
    producer.close()


def _spark_ran_again(caplog, inst: Instance, batch_id: int) -> bool:
    wanted = f"{inst.name}: Spark had committed ingest batch {batch_id}, the txlog had not"
    return any(r.getMessage().startswith(wanted) for r in caplog.records)


def test_a_batch_spark_committed_whose_txlog_commit_failed_is_read_again(start_instance, broker, tmp_path, caplog,
                                                                         monkeypatch):
    """Spark commits a batch once the writer has its rows (every batch committed behind, as a backlog's are); the
    writer's commit of the 3rd batch fails after that (the pause lets Spark get there and start the 4th): the
    restarted query runs the 3rd batch again."""
    from replication import failpoints

    monkeypatch.setenv("REPLICATION_COMMIT_BEHIND_ROWS", "0")
    inst = start_instance(max_offsets=100)
    failpoints.arm("ingest.commit_begins@3:pause,ingest.before_txlog_commit@3:raise")
    try:
        _raw_orders(broker, inst, "once", 600)
        wait_until(lambda: txlog_rows(tmp_path, inst.name).num_rows >= 600, timeout=120, what="600 rows")
    finally:
        failpoints.arm("")
    assert inst.restarts >= 1
    assert _spark_ran_again(caplog, inst, 2)
    assert_exactly_once(txlog_rows(tmp_path, inst.name), {"once": 600})


@pytest.mark.parametrize("behind", [True, False], ids=["committed-behind", "small-inline"])
def test_a_batch_whose_commit_failed_is_read_again_after_a_restart(start_instance, broker, tmp_path, caplog,
                                                                   monkeypatch, behind):
    """Committed behind (as a backlog's batches are), no batch follows the one whose commit failed: the heartbeat
    sees the failure, restarts the query and undoes Spark's commit of it. A live stream's small batch is committed
    inline: its failed commit fails Spark's batch, whose checkpoint never gets ahead (nothing to undo)."""
    from replication import failpoints

    if behind:
        monkeypatch.setenv("REPLICATION_COMMIT_BEHIND_ROWS", "0")
    inst = start_instance()
    failpoints.arm("ingest.before_txlog_commit@1:raise")
    try:
        _raw_orders(broker, inst, "alone", 20)
        wait_until(lambda: txlog_rows(tmp_path, inst.name).num_rows >= 20, timeout=120, what="20 rows")
    finally:
        failpoints.arm("")
    assert inst.restarts == 1
    assert _spark_ran_again(caplog, inst, 0) == behind
    assert_exactly_once(txlog_rows(tmp_path, inst.name), {"alone": 20})


def test_a_bad_commit_behind_setting_is_named_with_its_fix(monkeypatch):
    from replication.errors import ConfigError
    from replication.ingest.writer import commit_behind_rows

    monkeypatch.setenv("REPLICATION_COMMIT_BEHIND_ROWS", "ten thousand")
    with pytest.raises(ConfigError, match=r"REPLICATION_COMMIT_BEHIND_ROWS='ten thousand': give a number of rows"):
        commit_behind_rows()


def test_a_batch_that_cannot_be_read_in_the_driver_is_read_by_spark(start_instance, broker, tmp_path, monkeypatch,
                                                                    caplog):
    from replication.connectors.kafka import ranges as kafka_ranges

    real_read = kafka_ranges.RangeReader.read
    failures = []

    def failing_for_one_batch(self, parts, **kwargs):
        # every driver read of the first batch fails, read ahead or not (Spark's tasks read with consumers
        # of their own)
        if not failures or failures[0] == parts:
            failures.append(parts)
            raise kafka_ranges.KafkaSourceError("no records for 15s (injected)")
        return real_read(self, parts, **kwargs)

    monkeypatch.setattr(kafka_ranges.RangeReader, "read", failing_for_one_batch)
    inst = start_instance()
    with publisher(broker, inst, "fallback", tmp_path) as pub:
        for i in range(300):
            pub.publish("/orders", b'{"i": %d}' % i)
        pub.flush(timeout=120)
    assert failures, "the injected failure was reached"
    assert any("reading it in the driver failed; Spark reads it instead" in r.getMessage() for r in caplog.records)
    assert_exactly_once(txlog_rows(tmp_path, inst.name), {"fallback": 300})
    assert inst.restarts == 0, "the query did not fail"


def test_a_slow_batch_is_reported_with_what_it_is_doing(start_instance, broker, tmp_path, monkeypatch, caplog):
    from replication import instance as instance_module
    from replication.connectors.kafka import ranges as kafka_ranges

    real_read = kafka_ranges.RangeReader.read
    armed, slowed = threading.Event(), threading.Event()

    def slow_once(self, parts, **kwargs):
        if armed.is_set() and not slowed.is_set():
            slowed.set()
            time.sleep(4)  # a broker that takes its time answering
        return real_read(self, parts, **kwargs)

    monkeypatch.setattr(instance_module, "SLOW_BATCH_REPORT_S", 1.5)
    monkeypatch.setattr(kafka_ranges.RangeReader, "read", slow_once)
    inst = start_instance()
    with publisher(broker, inst, "slowpoke", tmp_path) as pub:
        armed.set()
        pub.publish("/orders", b'{"i": 1}')
        step = wait_until(lambda: slowed.is_set() and inst.status().batch, timeout=60, what="a batch in progress")
        pub.flush(timeout=60)
    assert step["step"] == "reading its rows in the driver", step
    reports = [r.getMessage() for r in caplog.records
               if "has been reading its rows in the driver for" in r.getMessage()]
    assert reports and reports[0].startswith(f"{inst.name}: ingest batch {step['id']} "), reports
    assert inst.status().batch is None, "no batch in progress once the message is persisted"



def test_a_new_instance_reads_its_first_batch_in_the_driver_with_the_rows_spark_planned(fabric, broker, monkeypatch):
    """The first micro-batch of a new ingest query starts at the sources' initial offsets, which Spark does not
    log: the writer asks the sources for them and reads that batch itself, as it does every small one."""
    from replication.ingest.inputs import DriverRead

    read: list[tuple[int, int | None]] = []
    original = DriverRead.__call__

    def observed(self, batch_id):
        rows = original(self, batch_id)
        read.append((batch_id, None if rows is None else rows.num_rows))
        return rows

    monkeypatch.setattr(DriverRead, "__call__", observed)
    fabric.configure("a")
    early = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for seq in range(1, 301):  # waiting on its topic before the instance first starts
        raw_publish(early, f"{fabric.name('a')}.publish", b'{"n": %d}' % seq, amps_client="early",
                    amps_seq=str(seq), amps_topic="/orders")
    early.flush()
    early.close()
    fabric.start("a")
    wait_until(lambda: fabric.count("a") >= 300, timeout=120, what="the 300 waiting messages stored")
    assert read[0] == (0, 300), read[:3]
    assert_exactly_once(fabric.rows("a"), {"early": 300})
