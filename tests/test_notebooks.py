"""The notebooks in notebooks/, run top to bottom as plain Python against a small fabric (A -> B, sync)."""

from __future__ import annotations

import json
import runpy

import pytest
from kafka import KafkaProducer
from support.fabric import TestFabric
from support.factories import raw_publish, rejected_rows, wait_until
from support.repo import REPO
from support.streams import spark_seqs

NOTEBOOKS = REPO / "notebooks"
PER_PUBLISHER = 60
SOW = "<Topic><Name>/orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>"


@pytest.fixture(scope="module")
def pair(spark, broker, tmp_path_factory):
    """A -> B (sync): 2 publishers x 60 orders on A, all replicated; one message A rejected."""
    fabric = TestFabric(spark, broker, tmp_path_factory.mktemp("notebooks"))
    fabric.start_one_way_pair(sow=SOW)
    for client in ("north", "south"):
        pub = fabric.publisher(client, "a")
        for i in range(PER_PUBLISHER):
            pub.publish("/orders", json.dumps({"id": i % 10, "qty": i * 7 % 200, "desk": client}).encode())
        pub.flush(timeout=120)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    raw_publish(producer, f"{fabric.name('a')}.publish", b'{"id": ', amps_client="sloppy", amps_seq="1",
                amps_topic="/orders")
    producer.flush()
    producer.close()
    wait_until(lambda: fabric.count("b") == 2 * PER_PUBLISHER and rejected_rows(fabric.root, fabric.name("a")),
               what="B to hold every order and A to reject the broken one")
    yield fabric
    fabric.close()


def run_notebook(name: str, monkeypatch, **params: str) -> dict:
    """Run ``notebooks/<name>`` as a plain Python file with ``REPLICATION_<NAME>`` parameters; its globals."""
    for key, value in params.items():
        monkeypatch.setenv(f"REPLICATION_{key.upper()}", value)
    return runpy.run_path(str(NOTEBOOKS / name), run_name="__main__")


@pytest.mark.parametrize("name", ["replay.py", "sow.py", "fabric_health.py"])
def test_notebooks_are_in_databricks_source_format(name):
    text = (NOTEBOOKS / name).read_text()
    assert text.startswith("# Databricks notebook source\n")
    cells = text.split("\n# COMMAND ----------\n")
    assert len(cells) >= 5 and "# MAGIC %md" in cells[0]
    assert all(line.startswith("# MAGIC") for cell in cells if "# MAGIC %md" in cell
               for line in cell.strip().splitlines() if line and not line.startswith("# Databricks"))


def test_replay_notebook_counts_and_resumes(pair, monkeypatch, capsys):
    rows = pair.rows("a")
    first_half = 50
    out = run_notebook("replay.py", monkeypatch, config=str(pair.paths["a"]), topic="/orders", first=str(first_half))
    assert out["total"] == 2 * PER_PUBLISHER
    assert {r["publisher"]: r["count"] for r in out["per_publisher"].collect()} == {
        "north": PER_PUBLISHER, "south": PER_PUBLISHER}
    assert sum(r["count"] for r in out["per_minute"].collect()) == 2 * PER_PUBLISHER
    assert out["last_bookmark"] == rows["bookmark"][first_half - 1].as_py()
    assert spark_seqs(out["resumed"]) == rows["seq"].to_pylist()[first_half:]
    assert dict(out["typed"].dtypes)["qty"] == "bigint"
    printed = capsys.readouterr().out
    assert "messages per publisher" in printed and "north" in printed
    assert f"took {first_half} messages" in printed and f"gives {2 * PER_PUBLISHER - first_half} more" in printed


def test_sow_notebook_shows_current_records_a_query_and_the_history_of_a_key(pair, monkeypatch, capsys):
    out = run_notebook("sow.py", monkeypatch, config=str(pair.paths["a"]), topic="/orders", filter="/qty > 150",
                       key_field="/id", key="3")
    rows = pair.rows("a").to_pylist()
    latest = {}
    for row in rows:  # the last message of each id is its current record
        latest[str(json.loads(row["data"])["id"])] = json.loads(row["data"])
    assert out["sow_error"] is None
    assert {r["sow_key"]: json.loads(r["data"]) for r in out["current"].collect()} == latest
    assert sorted(r["sow_key"] for r in out["matching"].collect()) == sorted(
        k for k, doc in latest.items() if doc["qty"] > 150)
    expected = [r["seq"] for r in rows if json.loads(r["data"])["id"] == 3]
    assert len(expected) == 2 * PER_PUBLISHER // 10
    assert spark_seqs(out["history"]) == expected
    assert "current records of /orders" in capsys.readouterr().out


def test_fabric_health_notebook_reports_links_rejects_and_charts_latency(pair, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("REPLICATION_OUTPUT_DIR", str(tmp_path))
    configs = f"{pair.paths['a']},{pair.paths['b']}"
    out = run_notebook("fabric_health.py", monkeypatch, configs=configs)
    a, b = pair.name("a"), pair.name("b")
    total = 2 * PER_PUBLISHER
    status = out["status"].set_index("instance")
    assert status.loc[a, "max_seq"] == total and status.loc[a, "durable"] == total
    [link] = out["links"].to_dict("records")
    assert (link["link"], link["sync"], link["sent"], link["acked"]) == (f"{a} -> {b}", "sync", total, total)
    rejected = [(r["instance"], r["count"]) for r in out["rejected_by_reason"].collect()]
    assert rejected == [(a, 1)]
    [hop] = out["latency"].to_dict("records")
    assert hop["hop"] == f"{a} -> {b}" and hop["messages"] == total
    assert 0 < hop["p50_hop_ms"] <= hop["p50_from_publish_ms"]
    assert out["chart"] == tmp_path / "replication_latency.png"
    assert out["chart"].read_bytes().startswith(b"\x89PNG")
    assert "replication links" in capsys.readouterr().out
