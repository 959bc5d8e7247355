"""Bootstrap of a new or rebuilt instance from another (real broker, Spark, Delta, processes for kill -9)."""

from __future__ import annotations

import json
import shutil
import uuid
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from support.cli import run_cli
from support.fabric import ONE_WAY, publish_orders
from support.factories import (
    bulk_publish,
    destination_xml,
    replication_xml,
    txlog_rows,
    wait_until,
    write_config,
)
from support.processes import InstanceProcess

from replication import config
from replication.connectors.ports import free_loopback_port
from replication.sow.table import read_current

TOPICS = ("/a", "/b", "/c")


def bootstrap_xml(topics, addresses, data_types: str | None = None) -> str:
    names = "".join(f"<Topic><Name>{t}</Name><MessageType>json</MessageType></Topic>" for t in topics)
    inet = "".join(f"<InetAddr>{a}</InetAddr>" for a in addresses)
    dt = f"<DataType>{data_types}</DataType>" if data_types else ""
    return f"<Bootstrap>{names}{dt}<Transport><Type>amps-replication</Type>{inet}</Transport></Bootstrap>"


def spread(n: int, tag: str):
    """``n`` messages over the three topics."""
    return [(TOPICS[i % 3], json.dumps({"i": i, "from": tag}).encode()) for i in range(n)]


def test_a_rebuilt_instance_bootstraps_the_sources_rows_of_its_topics_then_replication_goes_on(fabric):
    s, r, x = (fabric.storage(n) for n in "srx")
    fabric.configure("x", replication=replication_xml(destination_xml(fabric.name("s"), [s], sync="async",
                                                                      topics=ONE_WAY)))
    fabric.configure("s", replication=replication_xml(destination_xml(fabric.name("r"), [r], sync="async",
                                                                      topics=ONE_WAY)))
    r_links = replication_xml(destination_xml(fabric.name("s"), [s], topics=ONE_WAY))
    fabric.configure("r", replication=r_links)
    for name in "sxr":
        fabric.start(name)
    # the source's 200k rows: its own publishes, replicated ones from x, and ones that originated at r's old self
    old_r, from_x = fabric.publisher("r-old", "r"), fabric.publisher("x-pub", "x")
    for pub, tag in ((old_r, "r"), (from_x, "x")):
        for topic, body in spread(6000, tag):
            pub.publish(topic, body)
    bulk_publish(fabric.broker.bootstrap, f"{fabric.name('s')}.publish", "s-pub", spread(188_000, "s"))
    old_r.flush(timeout=300)  # sync: in s once persisted
    from_x.flush(timeout=300)
    wait_until(lambda: fabric.count("s") == 200_000, timeout=300, what="the source to hold 200k rows")
    old_r.close()

    # r is lost and rebuilt: empty storage, a <Bootstrap> of two of the three topics (first address missing)
    fabric.stop("r")
    shutil.rmtree(r)
    fabric.configure("r", replication=r_links + bootstrap_xml(TOPICS[:2], [fabric.root / "gone", s]))
    fabric.start("r")  # bootstraps before it serves anything
    # (compared column by column in Arrow: 200k rows as Python dicts took seconds)
    everything = fabric.rows("s")
    source = everything.filter(pc.is_in(everything["topic"], pa.array(TOPICS[:2])))
    copied = fabric.rows("r")
    assert copied["bookmark"].to_pylist() == source["bookmark"].to_pylist(), "the source's order"
    assert copied["seq"].to_pylist() == list(range(1, source.num_rows + 1)), "this instance's own seqs"
    own = copied.filter(pc.equal(copied["origin"], fabric.name("r")))
    assert own.num_rows == 4000 and own["received_from"].null_count == 4000, "own-origin rows, as published here"
    others = copied.filter(pc.not_equal(copied["origin"], fabric.name("r")))
    assert set(others["received_from"].unique().to_pylist()) == {fabric.name("s")}
    for column in ("bookmark", "publisher", "publisher_seq", "origin", "path", "publish_time", "data"):
        assert copied[column].combine_chunks().equals(source[column].combine_chunks()), column

    # live publishing continues on both sides; replication delivers every later message once
    r_live, s_live, x_more = (fabric.publisher(c, n) for c, n in (("r-live", "r"), ("s-live", "s"), ("x-more", "x")))
    publish_orders(r_live, 1500, topic="/a")
    publish_orders(s_live, 1500, topic="/b")
    publish_orders(x_more, 500, topic="/a")
    for pub in (r_live, s_live, x_more):
        pub.flush(timeout=300)

    def later(name: str) -> dict[str, int]:
        counts = Counter(fabric.rows(name, ["seq", "publisher"])["publisher"].to_pylist())
        return {c: counts[c] for c in ("r-live", "s-live", "x-more")}

    wait_until(lambda: later("r") == {"r-live": 1500, "s-live": 1500, "x-more": 500}, timeout=240,
               what="r to receive the later messages once each")
    wait_until(lambda: later("s")["r-live"] == 1500, timeout=240, what="s to receive r's later messages")
    rows = fabric.rows("r")
    assert len(set(rows["bookmark"].to_pylist())) == rows.num_rows, "no message twice"

    # an instance that has messages never bootstraps again
    fabric.stop("r")
    before = fabric.count("r")
    fabric.start("r")
    assert fabric.count("r") == before


def test_the_sow_data_type_copies_records_whose_txlog_rows_the_source_no_longer_has(fabric):
    sow = "<Topic><Name>/orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>"
    fabric.configure("s", sow=sow)
    fabric.start("s")
    pub = fabric.publisher("p", "s")
    for i in range(300):
        pub.publish("/orders", json.dumps({"id": i % 100, "v": i}))  # 100 records, the last writes at seq 201..300
    pub.publish("/orders", json.dumps({"id": 999, "v": "old"}))
    for i in range(300, 400):
        pub.publish("/orders", json.dumps({"id": i % 100, "v": i}))
    for i in range(20):  # a bootstrapped topic that is no SOW topic here: sow,txlog copies its rows (the spec)
        pub.publish("/audit", json.dumps({"i": i}))
    pub.flush(timeout=120)
    fabric.stop("s")  # its last compaction brings the SOW table up to its txlog's end
    s_cfg = config.load(str(fabric.paths["s"]))
    expected = read_current(s_cfg, "/orders").to_pylist()
    DeltaTable(str(fabric.storage("s") / "txlog")).delete("seq <= 350")  # retention: record 999's row is gone
    assert "999" in {row["sow_key"] for row in expected}

    fabric.configure("r", sow=sow, replication=bootstrap_xml(["/orders", "/audit"], [fabric.storage("s")],
                                                             "sow,txlog"))
    fabric.start("r")
    r_cfg = config.load(str(fabric.paths["r"]))
    got = read_current(r_cfg, "/orders").to_pylist()
    fields = ("sow_key", "topic", "bookmark", "publisher", "publisher_seq", "data")
    assert [{k: row[k] for k in fields} for row in sorted(got, key=lambda r: r["sow_key"])] == \
        [{k: row[k] for k in fields} for row in sorted(expected, key=lambda r: r["sow_key"])]
    assert fabric.count("r") == 71, "the txlog rows the source still has (seq 351..421)"
    assert [row["topic"] for row in fabric.rows("r").to_pylist()[51:]] == ["/audit"] * 20
    by_key = {row["sow_key"]: row["seq"] for row in got}
    assert by_key["999"] == 0, "a record whose row is not in this txlog"
    assert 1 <= by_key["99"] <= 51


@pytest.mark.slow
def test_kill_9_mid_bootstrap_then_restart_gives_the_uninterrupted_result(fabric, tmp_path):
    fabric.configure("s")
    fabric.start("s")
    bulk_publish(fabric.broker.bootstrap, f"{fabric.name('s')}.publish", "bulk", spread(30_000, "s"))
    wait_until(lambda: fabric.count("s") == 30_000, timeout=120, what="the source's rows")
    boot = bootstrap_xml(TOPICS[:2], [fabric.storage("s")])
    paths = {name: write_config(tmp_path, f"{name}-{uuid.uuid4().hex[:5]}", fabric.broker.bootstrap,
                                replication=boot) for name in ("killed", "whole")}
    small = {"REPLICATION_BOOTSTRAP_CHUNK_ROWS": "4000"}  # five chunks

    whole = run_cli("bootstrap", str(paths["whole"]), env=small)
    assert whole.code == 0, whole.err
    assert "bootstrapped from" in whole.out and "bootstrapped from" not in whole.err, "the summary, once"
    killed = run_cli("bootstrap", str(paths["killed"]),
                     env={**small, "REPLICATION_FAILPOINTS": "bootstrap.after_chunk@3"})
    assert killed.code == -9 and "failpoint bootstrap.after_chunk reached" in killed.err
    name = config.load(str(paths["killed"])).name
    assert 0 < txlog_rows(tmp_path, name).num_rows < 20_000, "interrupted mid-copy"
    proc = InstanceProcess(paths["killed"], tmp_path / "restart.log")  # the restart resumes, then serves
    try:
        wait_until(lambda: "bootstrapped from" in proc.log_text(), timeout=180, what="the resumed bootstrap")
    finally:
        proc.stop()
    columns = ["seq", "bookmark", "publisher", "publisher_seq", "topic", "data", "origin", "path"]
    want = txlog_rows(tmp_path, config.load(str(paths["whole"])).name, columns)
    assert txlog_rows(tmp_path, name, columns).to_pylist() == want.to_pylist()
    assert want.num_rows == 20_000 and len(set(want["bookmark"].to_pylist())) == 20_000


def test_two_empty_instances_bootstrapping_from_each_other_stop_with_the_fix(broker, tmp_path):
    a, b = (f"{n}-{uuid.uuid4().hex[:5]}" for n in "ab")
    paths = {}
    for name, other in ((a, b), (b, a)):
        paths[name] = write_config(tmp_path, name, broker.bootstrap,
                                   replication=bootstrap_xml(TOPICS, [tmp_path / other]))
    # a --from that names no instance is a bad argument: exit 2, one line, the fix names --from, nothing written
    # b's config, not its storage
    config_file = run_cli("bootstrap", str(paths[a]), "--from", str(paths[b]), process=True)
    assert config_file.code == 2 and len(config_file.err.strip().splitlines()) == 1, config_file.err
    assert (f"{paths[b]}: no instance there (no txlog and instance.json: not an instance, or it never started) (a "
            "file: an instance is addressed by its storage directory, not its config)") in config_file.err
    absent = run_cli("bootstrap", str(paths[a]), "--from", str(tmp_path / "absent"), process=True)
    assert absent.code == 2 and absent.err.strip().endswith(
        "Fix: start the source instance once, or point --from at an instance's storage"), absent.err
    empty = run_cli("bootstrap", str(paths[a]), "--from", "", process=True)
    assert empty.code == 2 and empty.err.strip().splitlines() == [
        "replication bootstrap: --from is empty. Fix: give the source instance's storage directory, or leave --from "
        "out to use the config's <Bootstrap>"], empty.err
    remote = run_cli("bootstrap", str(paths[a]), "--from", "gs://bucket/amps-b", process=True)
    assert remote.code == 2 and remote.err.strip().splitlines() == [
        "replication bootstrap: --from 'gs://bucket/amps-b': gs:// locations are not supported yet (an instance's "
        "control files, its heartbeat, acknowledgements and link state, need a local or mounted filesystem). Fix: "
        "give the source instance's storage: a path, file:///absolute/path or s3://bucket/prefix"], remote.err
    endpoint = f"http://127.0.0.1:{free_loopback_port()}"
    unreachable = run_cli("bootstrap", str(paths[a]), "--from", "s3://bucket/amps-b", env={
        "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s3cr3t-value",
        "AWS_REGION": "us-east-1"})
    assert unreachable.code == 2 and unreachable.err.strip().splitlines() == [
        f"replication bootstrap: {a}: no usable bootstrap source; tried bootstrap source s3://bucket/amps-b: cannot "
        f"reach {endpoint} (EndpointConnectionError). Fix: check that the endpoint is up and AWS_ENDPOINT_URL (or "
        "AWS_ENDPOINT_URL_S3) names it"], unreachable.err
    assert not (tmp_path / a).exists(), "a bad --from writes nothing"
    first = run_cli("bootstrap", str(paths[a]), process=True)
    assert first.code == 1 and f"{tmp_path / b}: no instance there" in first.err
    assert "Traceback" not in first.err and len(first.err.strip().splitlines()) == 1
    proc = InstanceProcess(paths[b], tmp_path / "b.log")  # `replication run`: it must not wait for ever
    code = proc.wait_killed(timeout=300)
    assert code == 1, proc.log_text()[-2000:]
    assert (f"{b} and {a} both have empty transaction logs and are configured to bootstrap from each other"
            in proc.log_text())
    assert "Fix: start one of them once without <Bootstrap>" in proc.log_text()
    assert "Traceback" not in proc.log_text()


def test_an_instance_waits_while_its_s3_bootstrap_source_is_unreachable_then_bootstraps(fabric, monkeypatch, caplog):
    """An endpoint outage at start is waited out (the start logs each try); a wrong address would stop it."""
    import threading

    from support.tables import TxlogWriter

    from replication import bootstrap as bootstrap_module
    from replication.config.parser import parse_string
    from replication.connectors.s3.access import environment_access, environment_filesystem
    from replication.connectors.s3.server import LocalS3Server
    from replication.storage.control import write_instance_config
    from replication.storage.layout import StorageLayout

    server = LocalS3Server(port=free_loopback_port())  # not started yet: its endpoint refuses connections
    for name, value in server.environment().items():
        monkeypatch.setenv(name, value)
    environment_access.cache_clear()
    environment_filesystem.cache_clear()
    source = "s3://outage/amps-src"
    fabric.configure("r", replication=bootstrap_xml([".*"], [source]))
    failed: list[BaseException] = []

    def start() -> None:
        try:
            fabric.start("r")
        except BaseException as exc:  # (said by the assertion below)
            failed.append(exc)

    # The source is made here once the endpoint is back, one object after another: a try of the instance's
    # in between would find it half made (its txlog created, its rows not yet in). A running source's
    # objects were all there before an outage; so the instance's tries wait while the test makes them.
    making = threading.Lock()
    real_run = bootstrap_module.run

    def run_once_made(*args, **kwargs):
        with making:
            return real_run(*args, **kwargs)

    monkeypatch.setattr(bootstrap_module, "run", run_once_made)
    starting = threading.Thread(target=start)
    starting.start()
    try:
        wait_until(lambda: caplog.text.count("trying again in") >= 2, timeout=60, what="two tries logged")
        assert f"bootstrap source {source}: cannot reach" in caplog.text
        assert starting.is_alive() and not fabric.count("r"), "nothing served while the source is unreachable"
        try:
            with making:  # the endpoint comes back, with the source instance
                server.start()
                server.create_bucket("outage")
                layout = StorageLayout.of(source)
                write_instance_config(parse_string(
                    f"<AMPSConfig><Name>amps-src</Name><Storage>{source}</Storage></AMPSConfig>"), layout.instance_json)
                TxlogWriter(layout.txlog).append(150)
            starting.join(timeout=120)
        finally:
            server.stop()
    finally:
        starting.join(timeout=120)
        environment_access.cache_clear()
        environment_filesystem.cache_clear()
    assert not failed, failed
    assert fabric.count("r") == 150
    assert fabric.rows("r")["received_from"].to_pylist() == ["amps-src"] * 150
