"""SOW topics end to end (real broker, Spark, Delta): the SOW equals a plain-Python reference.

Through replication, crashes and compactions; bad input is rejected with its reason; ``replication sow``
answers."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from deltalake import DeltaTable
from kafka import KafkaProducer
from support.cli import run_cli
from support.factories import raw_publish, rejected_rows, txlog_rows, wait_until, write_config
from support.processes import InstanceProcess
from support.repo import REPO
from support.sow_reference import Reference, fold, key_of, matches, order_ops, parsed, quote_ops, send, txlog_fold

from replication import config
from replication.client import Publisher
from replication.config.fabric import Fabric
from replication.sow.keys import split_keys
from replication.sow.table import read_current, table_path
from replication.storage.layout import StorageLayout
from replication.verify import verify

SOW = (
    "<Topic><Name>/orders</Name><MessageType>json</MessageType><Key>/id</Key>"
    "<CompactionInterval>1s</CompactionInterval></Topic>"
    "<Topic><Name>/quotes</Name><MessageType>fix</MessageType><Key>/55</Key>"
    "<CompactionInterval>1s</CompactionInterval></Topic>"
)
TXLOG = ("<Topic><Name>.*</Name><MessageType>json</MessageType></Topic>"
         "<Topic><Name>.*</Name><MessageType>fix</MessageType></Topic>")


def current(cfg, topic: str) -> dict[tuple[str, str], object]:
    """What ``replication sow`` reads: the exact current records, parsed."""
    rows = read_current(cfg, topic).to_pylist()
    return {(r["topic"], r["sow_key"]): parsed_body(r["message_type"], r["data"]) for r in rows}


def plain_table(cfg, topic_index: int) -> list[dict]:
    """What any Delta reader sees in the SOW table."""
    table = table_path(StorageLayout.of(cfg.storage), cfg.sow_topics[topic_index])
    return DeltaTable(str(table)).to_pyarrow_table().to_pylist()


def parsed_body(message_type: str, data: bytes):
    if message_type == "fix":
        return [tuple(f.split("=", 1)) for f in data.decode().split("\x01") if f]
    return json.loads(data)


def expected(refs: list[Reference]) -> dict[tuple[str, str], object]:
    out: dict[tuple[str, str], object] = {}
    for ref in refs:
        out.update(ref.records)
    return out


def assert_txlog_holds_what_was_stored(rows: list[dict], ops_by_pub: dict[str, list],
                                       refs: dict[str, Reference]) -> None:
    """Every published message is in the txlog once, a delta_publish merged into its record, a sow_delete with
    the keys it removed."""
    by_id = {(r["publisher"], r["publisher_seq"]): r for r in rows}
    for pub, ops in ops_by_pub.items():
        for seq, (op, (doc, removed)) in enumerate(zip(ops, refs[pub].stored, strict=True), start=1):
            row = by_id[(pub, seq)]
            assert row["command"] == ("sow_delete" if op.command == "sow_delete" else "publish")
            if op.command == "sow_delete":
                assert set(split_keys(row["sow_key"] or "")) == removed, (pub, seq, op)
                assert (row["sow_keys"], row["filter"]) == (",".join(op.keys) if op.keys else None, op.filter)
            else:
                assert parsed(op, row["data"]) == doc, (pub, seq, op)
                assert row["sow_key"] == key_of(op.topic, doc)


def publish_all(pubs: dict[str, Publisher], ops_by_pub: dict[str, list]) -> None:
    def run(pub, ops):
        for op in ops:
            send(pub, op)
        pub.flush(timeout=600)

    threads = [threading.Thread(target=run, args=(pubs[name], ops)) for name, ops in ops_by_pub.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_100k_json_and_fix_messages_from_3_publishers_leave_the_sow_a_python_reference_computes(fabric):
    fabric.configure("a", txlog_topics=TXLOG, sow=SOW)
    inst = fabric.start("a")
    rng = random.Random(11)
    ops_by_pub = {}
    for n, pub in enumerate(("p1", "p2", "p3")):
        keys = list(range(n * 1700, n * 1700 + 1700))  # 5,100 keys in all, each publisher its own
        symbols = [f"{pub}-S{i}" for i in range(300)]
        orders, quotes = order_ops(pub, keys, 33_400, rng), quote_ops(pub, symbols, 8_000, rng)
        ops_by_pub[pub] = [op for pair in zip(orders, quotes) for op in pair] + orders[len(quotes):]
    refs = {pub: fold(ops, matches, key_of) for pub, ops in ops_by_pub.items()}
    pubs = {name: fabric.publisher(name, "a") for name in ops_by_pub}
    publish_all(pubs, ops_by_pub)

    cfg = config.load(str(fabric.paths["a"]))
    want = expected(list(refs.values()))
    got = current(cfg, "/orders") | current(cfg, "/quotes")
    assert len(got) == len(want) and got == want
    rows = fabric.rows("a").to_pylist()
    assert len(rows) == sum(len(ops) for ops in ops_by_pub.values()) == 124_200
    assert_txlog_holds_what_was_stored(rows, ops_by_pub, refs)
    kinds = {(op.command, op.keys is not None, op.filter is not None) for ops in ops_by_pub.values() for op in ops}
    assert len(kinds) == 5, "publish, delta_publish and the three sow_delete forms were all exercised"

    # The plain tables follow within their compaction interval: current records, no key twice, none deleted.
    def compacted() -> bool:
        return all(s["compacted_through"] == inst.status().max_seq for s in inst.status().sow.values())

    wait_until(compacted, timeout=120, what="both SOW tables to be compacted to the txlog's end")
    for index, topic in enumerate(("/orders", "/quotes")):
        table = plain_table(cfg, index)
        keys = [(r["topic"], r["sow_key"]) for r in table]
        assert len(keys) == len(set(keys))
        assert {k: parsed_body(r["message_type"], r["data"]) for k, r in zip(keys, table)} == {
            k: v for k, v in want.items() if k[0] == topic}


def shipped_pair(tmp_path: Path, bootstrap: str) -> tuple[list[Path], dict[str, str]]:
    """conf/amps-1.xml and conf/amps-2.xml with a SOW topic added (names made unique in the session's broker)."""
    tag = uuid.uuid4().hex[:5]
    names = {"amps-1": f"amps-1-{tag}", "amps-2": f"amps-2-{tag}"}
    paths = []
    for name in names:
        text = (REPO / "conf" / f"{name}.xml").read_text()
        for old, new in names.items():
            text = text.replace(old, new)
        text = (text.replace("${REPLICATION_HOME:-../var}", str(tmp_path))
                .replace("${KAFKA_BOOTSTRAP:-localhost:9092}", bootstrap))
        text = text.replace("</TransactionLog>", "</TransactionLog>\n  <SOW>"
                            "<Topic><Name>/orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic></SOW>")
        path = tmp_path / f"{names[name]}.xml"
        path.write_text(text)
        paths.append(path)
    return paths, names


def test_a_sync_pair_of_the_shipped_configs_with_a_sow_topic_ends_with_equal_sows(spark, broker, tmp_path):
    from replication.instance import Instance

    paths, names = shipped_pair(tmp_path, broker.bootstrap)
    cfgs = [config.load(str(p)) for p in paths]
    instances = [Instance(cfg, spark, trigger_interval="100 milliseconds").start() for cfg in cfgs]
    pubs = {}
    try:
        rng = random.Random(5)
        ops_by_pub = {"left": order_ops("left", list(range(0, 500)), 4000, rng),
                      "right": order_ops("right", list(range(500, 1000)), 4000, rng)}
        for pub_name, inst in zip(ops_by_pub, instances):
            pubs[pub_name] = Publisher(pub_name, bootstrap=broker.bootstrap, topic=f"{inst.name}.publish",
                                       instance=inst.name, store_path=tmp_path / f"{pub_name}.store")
        publish_all(pubs, ops_by_pub)  # sync: each flush returns once the other side has the messages too
        want = expected([fold(ops, matches, key_of) for ops in ops_by_pub.values()])
        sows = [current(cfg, "/orders") for cfg in cfgs]
        assert sows[0] == sows[1] == want
        replicated = [r for r in txlog_rows(tmp_path, instances[1].name).to_pylist()
                      if r["publisher"] == "left" and r["command"] == "sow_delete"]
        assert replicated and all(r["received_from"] == instances[0].name for r in replicated), \
            "sow_deletes reached the other side as commands, which it applied to its own SOW"
        # `replication verify` while both run: the links, the group and the two SOWs (key by key) agree
        report = verify(Fabric.load(paths))
        assert report.ok and [(s.topic, s.messages) for s in report.sows] == [("/orders", len(want))], \
            [f.message for f in report.findings]
    finally:
        for pub in pubs.values():
            pub.close()
        for inst in instances:
            inst.stop()


@pytest.mark.slow
def test_kill_9_between_the_txlog_commit_and_the_sow_and_during_compaction_then_restart(broker, tmp_path):
    """The SOW is derived from the txlog: whatever step a kill -9 hits, after a restart the SOW equals the fold
    of the txlog's rows in seq order, and the plain table catches up with it."""
    name = f"sowcrash{uuid.uuid4().hex[:6]}"
    path = write_config(tmp_path, name, broker.bootstrap, max_offsets=150,
                        sow=SOW.split("<Topic><Name>/quotes")[0])
    cfg = config.load(str(path))
    crash_points = ["ingest.after_txlog_commit@4", "sow.before_compaction_commit@2", "sow.after_compaction_commit@2"]
    rng = random.Random(3)
    ops = order_ops("crash", list(range(200)), 2400, rng)
    proc = InstanceProcess(path, tmp_path / "run0.log", failpoints=crash_points[0])
    pub = Publisher("crash", bootstrap=broker.bootstrap, topic=f"{name}.publish", instance=name,
                    store_path=tmp_path / "pub.store", resend_after=3, logon_timeout=180)
    try:
        for stage, failpoint in enumerate(crash_points):
            for op in ops[stage * 800:(stage + 1) * 800]:
                send(pub, op)
            assert proc.wait_killed(timeout=300) < 0, proc.log_text()[-3000:]
            assert f"failpoint {failpoint.split('@')[0]} reached" in proc.log_text()
            following = crash_points[stage + 1] if stage + 1 < len(crash_points) else None
            proc = InstanceProcess(path, tmp_path / f"run{stage + 1}.log", failpoints=following)
        pub.flush(timeout=300)
        rows = txlog_rows(tmp_path, name).to_pylist()
        assert current(cfg, "/orders") == {k: json.loads(v) for k, v in txlog_fold(rows).items()} == \
            fold(ops, matches, key_of).records
        # (every message may be acknowledged before the last kill: Ctrl-C must reach a running instance, not
        # one still starting, for the stop to compact)
        wait_until(lambda: f"running {name} (Ctrl-C to stop)" in proc.log_text(), timeout=240,
                   what="the restarted instance to run")
    finally:
        pub.close()
        code = proc.stop()  # a clean stop compacts once more
    assert code == 0, proc.log_text()[-3000:]
    table = plain_table(cfg, 0)
    assert {(r["topic"], r["sow_key"]): json.loads(r["data"]) for r in table} == fold(ops, matches, key_of).records
    assert len(table) == len({(r["topic"], r["sow_key"]) for r in table})


def test_bad_sow_input_lands_in_rejected_with_its_reason_and_the_instance_keeps_going(fabric):
    fabric.configure("a", txlog_topics=TXLOG,
                     sow=SOW + "<Topic><Name>/blobs</Name><MessageType>json</MessageType></Topic>")
    fabric.start("a")
    producer = KafkaProducer(bootstrap_servers=fabric.broker.bootstrap)
    topic = f"{fabric.name('a')}.publish"
    bad = [
        (b'{"qty": 1}', {}, "has no value for key /id"),
        (b'{"v": 1}', {"amps_topic": "/blobs"}, "has no amps-sow-key header"),
        (b"[1, 2]", {"amps_command": "delta_publish"}, "delta_publish body is an array, not a JSON object"),
        (b'{"id": ', {"amps_command": "delta_publish"}, "body is not valid JSON"),
        (b"", {"amps_command": "sow_delete"}, "names nothing to delete"),
        (b"", {"amps_command": "sow_delete", "amps_filter": "/qty >> 1"},
         "amps-filter does not parse: invalid filter at position 7"),
        (b"35=S\x01", {"amps_topic": "/quotes", "amps_type": "fix"}, "has no value for key /55"),
    ]
    for seq, (body, headers, _) in enumerate(bad, start=1):
        raw_publish(producer, topic, body, amps_client="bad", amps_seq=str(seq), **{"amps_topic": "/orders", **headers})
    producer.flush()
    pub = fabric.publisher("good", "a")
    pub.publish("/orders", b'{"id": 1, "qty": 2}')
    pub.flush(timeout=120)  # the instance went on after the bad ones
    got = wait_until(lambda: (lambda r: r if len(r) >= len(bad) else None)(
        rejected_rows(fabric.root, fabric.name("a"))), timeout=60, what="the bad messages in rejected/")
    reasons = {int(r["publisher_seq"]): r["reason"] for r in got}
    for seq, (_, _, why) in enumerate(bad, start=1):
        assert why in reasons[seq], (seq, reasons[seq])
    assert [r["publisher"] for r in fabric.rows("a").to_pylist()] == ["good"]
    assert current(config.load(str(fabric.paths["a"])), "/orders") == {("/orders", "1"): {"id": 1, "qty": 2}}


@pytest.mark.e2e  # CLI processes
@pytest.mark.parametrize("command", ["sow", "replay", "status"])
def test_query_commands_do_not_import_pandas(tmp_path, command):
    # pyarrow imports pandas (~0.3 s of a query's ~1.5 s) on its first Python-to-Arrow conversion, only to ask
    # whether a value is a pandas object: a query command's own process hides it
    probe = ("import sys\nfrom replication import cli\ncode = cli.main()\n"
             "print(code, 'pyarrow' in sys.modules, sorted(m for m, v in sys.modules.items() "
             "if m.split('.')[0] == 'pandas' and v is not None))")
    argv = [str(tmp_path / "absent.xml")] + (["--topic", "/orders"] if command in ("sow", "replay") else [])
    done = subprocess.run([sys.executable, "-c", probe, command, *argv], capture_output=True, text=True, timeout=60)
    assert "config file not found" in done.stderr
    assert done.stdout.split() == ["2", str(command != "status"), "[]"], (done.stdout, done.stderr)


def test_replication_sow_prints_the_records_a_filter_or_keys_select(fabric):
    fabric.configure("a", txlog_topics=TXLOG, sow=SOW)
    fabric.start("a")
    pub = fabric.publisher("cli", "a")
    for i in range(1, 11):
        pub.publish("/orders", json.dumps({"id": i, "qty": i * 10, "side": "buy" if i % 2 else "sell"}))
    pub.delta_publish("/orders", json.dumps({"id": 3, "qty": 999}))
    pub.sow_delete("/orders", keys=["10"])
    pub.flush(timeout=120)
    path = str(fabric.paths["a"])

    by_filter = run_cli("sow", path, "--topic", "/orders", "--filter", "/qty >= 60 AND /side = 'buy'", process=True)
    assert by_filter.code == 0, by_filter.err
    lines = [json.loads(line) for line in by_filter.out.splitlines()]
    assert [(r["sow_key"], r["data"]["qty"]) for r in lines] == [("7", 70), ("9", 90), ("3", 999)], "seq order"
    assert set(lines[0]) == {"sow_key", "topic", "seq", "bookmark", "publisher", "publisher_seq", "persist_time",
                             "data"}
    assert lines[0]["publisher"] == "cli" and lines[0]["topic"] == "/orders"

    by_key = run_cli("sow", path, "--topic", "/orders", "--key", "3", "--key", "10", "--key", "4", process=True)
    assert [json.loads(line)["data"] for line in by_key.out.splitlines()] == [
        {"id": 4, "qty": 40, "side": "sell"}, {"id": 3, "qty": 999, "side": "buy"}], "10 was deleted; 3 merged"
    table = run_cli("sow", path, "--topic", "/orders", "--format", "table", "--limit", "2", process=True)
    assert table.code == 0 and len(table.out.splitlines()) == 4 and "sow_key" in table.out

    for args, error in [(["--topic", "/nope"], "'/nope' is not a SOW topic"),
                        (["--topic", "/orders", "--filter", "/qty >"], "--filter: invalid filter at position"),
                        (["--topic", "/orders", "--limit", "-1"], "--limit -1")]:
        bad = run_cli("sow", path, *args, process=True)
        assert bad.code == 2 and bad.out == "" and "Traceback" not in bad.err
        assert len(bad.err.strip().splitlines()) == 1 and error in bad.err, bad.err
    missing = run_cli("sow", str(Path(path).with_name("absent.xml")), "--topic", "/orders", process=True)
    assert missing.code == 2 and "config file not found" in missing.err and "Traceback" not in missing.err
    assert re.search(r"^replication sow: .*absent\.xml", missing.err)


def test_replay_sow_gives_the_dataframe_of_what_replication_sow_prints(fabric, spark):
    from replication import replay

    fabric.configure("a", txlog_topics=TXLOG, sow=SOW.replace("<CompactionInterval>1s", "<CompactionInterval>1h"))
    fabric.start("a")
    pub = fabric.publisher("nb", "a")
    for i in range(40):
        pub.publish("/quotes", f"35=S\x0155=S{i % 12}\x01132={i * 10}\x01".encode(), message_type="fix")
    pub.sow_delete("/quotes", keys=["S1"], message_type="fix")
    pub.flush(timeout=120)
    fabric.stop("a")  # compacts: the table holds these
    fabric.start("a")
    pub.delta_publish("/quotes", b"55=S2\x01133=7\x01", message_type="fix")  # after the table: from the txlog
    pub.flush(timeout=120)
    cfg = config.load(str(fabric.paths["a"]))
    exact = {r["sow_key"]: r["data"] for r in read_current(cfg, "/quotes").to_pylist()}
    frame = replay.sow(fabric.paths["a"], topic="/quotes", spark=spark)
    assert {r["sow_key"]: bytes(r["data"]) for r in frame.collect()} == exact
    assert exact["S2"] == b"35=S\x0155=S2\x01132=380\x01133=7\x01" and "S1" not in exact
    high = replay.sow(fabric.paths["a"], topic="/quotes", filter="/132 >= 350", spark=spark)
    tag_132 = {k: int(dict(f.split("=", 1) for f in body.decode().split("\x01") if f)["132"])
               for k, body in exact.items()}
    assert sorted(r["sow_key"] for r in high.collect()) == sorted(k for k, v in tag_132.items() if v >= 350)
    assert 0 < len(high.collect()) < len(exact)
