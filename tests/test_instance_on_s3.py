"""Instances whose every address is ``s3://`` (issue 36): their txlogs, inboxes, SOW tables, rejected tables,
control files and Spark's streaming checkpoints live in the bucket (the local S3 server), the machines keep
nothing but scratch.

A two-way sync pair A <-> B and a chain A -> B -> C, each instance in a process of its own with a private
scratch folder (``TMPDIR``, Spark's local directories); B is killed with kill -9 mid-batch and its scratch is
deleted before the next start, as when a machine is lost and a new one takes the same config. C, the chain's
end, also serves a queue and takes a backfill (killed, then run again), and the query commands read it from
the bucket. (One fabric for all of it: each start of an instance process costs the suite ~20 s.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from support.cli import run_cli
from support.fabric import ONE_WAY
from support.factories import (
    assert_exactly_once,
    destination_xml,
    instance_xml,
    replication_xml,
    wait_until,
)
from support.processes import InstanceProcess

from replication.client import Publisher, QueueConsumer
from replication.queues.wire import bookmarks_in

pytestmark = pytest.mark.slow

#: Tasks published to C's queue /work over /tasks, each delivered to and acknowledged by its consumer.
TASKS = 30
QUEUE = ("<Queue><Name>/work</Name><MessageType>json</MessageType><UnderlyingTopic>/tasks</UnderlyingTopic>"
         "<Semantics>at-least-once</Semantics></Queue>")


#: The SOW topic of the pair and chain: a record per publisher and ``i`` modulo :data:`KEYS`, each updated in turn.
SOW = "<Topic><Name>/orders</Name><MessageType>json</MessageType><Key>/k</Key></Topic>"
KEYS = 37


def publish(pub: Publisher, published: int, count: int) -> int:
    for n in range(published + 1, published + count + 1):
        pub.publish("/orders", json.dumps({"i": n, "k": f"{pub.name}-{n % KEYS}"}).encode())
    return published + count


def current_records(published: dict[str, int]) -> dict[str, int]:
    """What the SOW of /orders holds once ``published[publisher]`` messages of each are stored: key -> last i."""
    return {f"{pub}-{n % KEYS}": n for pub, count in published.items() for n in range(1, count + 1)}


def keys(s3, bucket: str) -> list[str]:
    pages = s3.access.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


#: Rows the instance's backfill client stores: three files, one part each.
BACKFILLED = 3 * 2000


def backfill_into_the_running_instance(s3, cfg: Path, inputs: Path) -> None:
    """``replication backfill`` into the instance on S3: killed with kill -9 after its first commit, then run
    again; the instance stores each row once (its parts classified, see ``test_backfill_on_s3``)."""
    inputs.mkdir()
    for n in range(3):
        pq.write_table(pa.table({"id": list(range(n * 2000, (n + 1) * 2000))}), inputs / f"f{n}.parquet")
    args = ["backfill", cfg, "--input", inputs, "--format", "parquet", "--client", "loader", "--topic", "/history"]
    killed = run_cli(*args, env={**s3.environment(), "REPLICATION_FAILPOINTS": "backfill.after_part@1"})
    assert killed.code == -signal.SIGKILL and "failpoint backfill.after_part reached" in killed.err, killed.err[-3000:]
    # (its lease is left in the bucket: this run, on the same host, takes it over since its holder is gone)
    rerun = run_cli(*args, "--wait", "300", env=s3.environment())
    assert rerun.code == 0, rerun.err[-3000:]
    assert "4,000 written, 0 rejected, in 2 new commit(s)" in rerun.out, rerun.out
    assert f"stored every backfilled row (client loader through {BACKFILLED:,})" in rerun.out
    assert "took over the lease" in rerun.err


class _BucketRoot(str):
    """An ``s3://`` prefix that test config builders join as they join a local folder (``root / name``)."""

    def __truediv__(self, name: str) -> str:
        return f"{self}/{name}"


#: Where the middle instance is killed: Spark's checkpoint (in the bucket) holds a batch of rows its upstream
#: replicated, its txlog does not (B commits each batch behind Spark, as a backlog's are; the pause lets Spark
#: commit the batch first), and neither its acknowledgements nor its own replicator have moved.
FABRIC_CRASH_POINT = "ingest.commit_begins@4:pause,ingest.before_txlog_commit@4"
FABRIC_PER_RUN = 200
PAIR = "<Topic><Name>.*</Name><MessageType>json</MessageType><ExcludeValidation>cascade</ExcludeValidation></Topic>"


def test_a_pair_and_a_chain_on_s3_survive_a_kill_9_and_a_lost_scratch_and_serve_a_queue_and_a_backfill(
        s3, broker, tmp_path):
    """A <-> B (a two-way sync pair) and A -> B -> C (a chain of three, B passing A's messages on), every address
    an ``s3://`` one, each instance a process of its own with a private scratch; B is killed mid-batch, loses its
    scratch, and is restarted. C serves a queue and takes a backfill meanwhile."""
    tag = uuid.uuid4().hex[:6]
    a, b, c = (f"{x}{tag}" for x in ("a", "b", "c"))
    bucket = f"fabric-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    root = _BucketRoot(f"s3://{bucket}/fabric")
    destinations = {a: [b], b: [a, c], c: []}
    configs = {}
    for name, downstream in destinations.items():
        # C does not replicate back: B's link to it excludes the replicate and cascade checks, as a chain's
        # does, and the pair's links accept that the other side relaxes them (the cascade check otherwise refuses)
        topics = {c: ONE_WAY, b: PAIR, a: PAIR}
        replication = replication_xml(*(destination_xml(d, [root / d], topics=topics[d])
                                        for d in downstream)) if downstream else ""
        configs[name] = tmp_path / f"{name}.xml"
        configs[name].write_text(instance_xml(name, root, broker.bootstrap, max_offsets=100,
                                              sow=SOW + (QUEUE if name == c else ""), replication=replication))

    def start(name: str, run: int, failpoints: str | None = None) -> InstanceProcess:
        scratch = tmp_path / f"scratch-{name}-{run}"  # this machine's: temporary files, Spark's local directories
        scratch.mkdir()
        behind = {"REPLICATION_COMMIT_BEHIND_ROWS": "0"} if name == b else {}
        return InstanceProcess(configs[name], tmp_path / f"{name}-{run}.log", failpoints=failpoints,
                               env={**s3.environment(), "TMPDIR": str(scratch), "SPARK_LOCAL_DIRS": str(scratch),
                                    **behind})

    procs = {a: start(a, 0), b: start(b, 0, FABRIC_CRASH_POINT), c: start(c, 0)}
    pubs: dict[str, Publisher] = {}
    published = dict.fromkeys((a, b), 0)
    tasker = worker = None
    try:  # (from the first logon on: a failed one must not leave the three processes running)
        for name in (a, b):
            pubs[name] = Publisher(f"pub-{name}", bootstrap=broker.bootstrap, topic=f"{name}.publish",
                                   instance=name, store_path=tmp_path / f"pub-{name}.store", resend_after=3,
                                   logon_timeout=300)
        for name, pub in pubs.items():
            published[name] = publish(pub, published[name], FABRIC_PER_RUN)
        assert procs[b].wait_killed(timeout=600) == -signal.SIGKILL, procs[b].log_text()[-3000:]
        assert "failpoint ingest.before_txlog_commit reached" in procs[b].log_text()
        assert pubs[b].persisted_seq < published[b], "the crash came after everything was acknowledged"
        shutil.rmtree(tmp_path / f"scratch-{b}-0")  # B's machine is lost with everything on its disk
        procs[b] = start(b, 1)
        for name, pub in pubs.items():
            published[name] = publish(pub, published[name], FABRIC_PER_RUN // 2)
        # the queue over /tasks at C, served from the bucket: each task delivered once, and acknowledged
        tasker = Publisher("tasker", bootstrap=broker.bootstrap, topic=f"{c}.publish", instance=c,
                           store_path=tmp_path / "tasker.store", resend_after=3, logon_timeout=300)
        tasks = {tasker.publish("/tasks", b'{"task": %d}' % n) for n in range(TASKS)}
        worker = QueueConsumer("worker", bootstrap=broker.bootstrap, topic=f"{c}.publish", instance=c,
                               queue="/work", store_path=tmp_path / "worker.store", max_backlog=TASKS)
        delivered = []
        while len(delivered) < TASKS and (message := worker.receive(timeout=120)) is not None:
            delivered.append(message)
            message.ack()
        assert worker.flush(timeout=120) == [], "every acknowledgement persisted"
        assert tasker.flush(timeout=120) == []
        backfill_into_the_running_instance(s3, configs[c], tmp_path / "in")
        for pub in pubs.values():
            pub.flush(timeout=600)
        expected = {f"pub-{name}": count for name, count in published.items()}
        for name in (a, b):
            wait_until(lambda name=name: _txlog(s3, root / name).num_rows >= sum(expected.values()), timeout=300,
                       what=f"{name} holds every message")
        at_c = {**expected, "tasker": TASKS, "worker": worker.publisher.persisted_seq, "loader": BACKFILLED}
        wait_until(lambda: _txlog(s3, root / c).num_rows >= sum(at_c.values()), timeout=300,
                   what=f"{c} holds every message")
    finally:
        for client in (*pubs.values(), tasker, worker):
            if client is not None:
                client.close()
        for proc in procs.values():
            proc.stop()
    for name, pub in pubs.items():
        assert pub.persisted_seq == published[name], f"every message published at {name} acknowledged"
    for name in (a, b):
        assert_exactly_once(_txlog(s3, root / name), expected)
    # the restart undid Spark's commit of the killed batch in the bucket's checkpoint, and Spark ran it again
    # from there (a lost checkpoint would have re-read Kafka from its start instead)
    assert re.search(rf"{b}: Spark had committed ingest batch \d+, the txlog had not", procs[b].log_text()), \
        procs[b].log_text()[-3000:]

    storage = f"s3://{bucket}/fabric/{c}"
    rows = DeltaTable(f"{storage}/txlog", storage_options=s3.access.delta_options()).to_pyarrow_table(
        columns=["seq", "bookmark", "publisher", "publisher_seq", "command", "topic", "sow_keys"]).sort_by("seq")
    assert_exactly_once(rows, at_c)
    seq_of = dict(zip(*(rows[col].to_pylist() for col in ("bookmark", "publisher_seq")), strict=True))
    assert sorted(seq_of[m.bookmark] for m in delivered) == sorted(tasks), "each task delivered once"
    acks = rows.filter(pc.equal(rows["publisher"], "worker"))
    acknowledged = [k for r in acks.to_pylist() if r["command"] == "sow_delete" and r["topic"] == "/work"
                    for k in bookmarks_in(r["sow_keys"])]
    assert sorted(acknowledged) == sorted(m.bookmark for m in delivered), "each acknowledged once in the txlog"

    verified = run_cli("verify", *configs.values(), "--engine", "arrow", "--format", "json", env=s3.environment())
    assert verified.code == 0, verified.out + verified.err
    # The SOW of every instance, exact (``replication sow``) and as compacted in its table in the bucket at stop
    sow = current_records({f"pub-{name}": count for name, count in published.items()})
    for name in (a, b, c):
        done = run_cli("sow", configs[name], "--topic", "/orders", "--format", "jsonl", env=s3.environment())
        assert done.code == 0, done.err
        assert {r["sow_key"]: r["data"]["i"] for r in map(json.loads, done.out.splitlines())} == sow, name
        [table] = [k.removesuffix("/_delta_log/00000000000000000000.json") for k in keys(s3, bucket)
                   if k.startswith(f"fabric/{name}/sow/") and k.endswith("/_delta_log/00000000000000000000.json")]
        compacted = DeltaTable(f"s3://{bucket}/{table}", storage_options=s3.access.delta_options()).to_pyarrow_table()
        assert {k: json.loads(d)["i"] for k, d in zip(compacted["sow_key"].to_pylist(), compacted["data"].to_pylist(),
                                                      strict=True)} == sow, f"{name}'s SOW table in the bucket"
    stored = keys(s3, bucket)
    assert all(k.startswith("fabric/") for k in stored)
    for name in (a, b, c):
        for expected_key in ("_control/instance.json", "_control/heartbeat.json", "_control/publishers.json",
                             "_control/durable.json", "_checkpoints/ingest/metadata", "_checkpoints/ingest/commits/0",
                             "txlog/_delta_log/00000000000000000000.json",
                             "rejected/_delta_log/00000000000000000000.json",
                             "inbox/_delta_log/00000000000000000000.json"):
            assert f"fabric/{name}/{expected_key}" in stored, f"{name}'s {expected_key} is in the bucket"
    for upstream, name in ((a, b), (b, a), (b, c)):
        assert f"fabric/{name}/_control/acks/{upstream}.json" in stored, f"{name} acknowledges {upstream} there"
        assert f"fabric/{upstream}/_control/links/{name}.json" in stored, f"{upstream}'s link to {name} is there"
    assert not [k for k in stored if k.startswith((f"fabric/{c}/inbox/_backfill/", f"fabric/{c}/_backfill/"))
                or k.endswith(".lock")], "no staged part, announcement or lock left"
    assert re.search(rf"{c}: backfill part _backfill/\w+/\d+-\w+\.parquet \(client loader\) is classified",
                     procs[c].log_text()), "the general path: no rename into txlog/ in a bucket"
    # on this machine: configs, logs, the clients' stores, the backfill's input, and the scratch of the runs
    # still there
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*(p.name for p in configs.values()), *(f"pub-{n}.store" for n in pubs), "tasker.store", "worker.store",
         "in", *(f"{n}-0.log" for n in (a, b, c)), f"{b}-1.log",
         *(f"scratch-{n}-0" for n in (a, c)), f"scratch-{b}-1"])

    # the query commands read C from the bucket, with no Spark
    status = run_cli("status", configs[c], "--format", "json", env=s3.environment())
    assert status.code == 0, status.err
    [instance] = json.loads(status.out)
    assert (instance["instance"], instance["max_seq"], instance["durable_seq"]) == (c, rows.num_rows,
                                                                                    rows.num_rows), \
        "status reads the heartbeat in the bucket"
    replayed = run_cli("replay", configs[c], "--topic", "/orders", "--fully-durable", env=s3.environment())
    assert replayed.code == 0, replayed.err
    assert sorted((r["publisher"], r["data"]["i"]) for r in map(json.loads, replayed.out.splitlines())) == sorted(
        (f"pub-{name}", i) for name, count in published.items() for i in range(1, count + 1))
    queue = run_cli("queue", configs[c], "--topic", "/work", "--format", "json", env=s3.environment())
    assert queue.code == 0, queue.err
    assert (json.loads(queue.out)["acknowledged"], json.loads(queue.out)["depth"]) == (TASKS, 0), queue.out
    # and with Spark, through S3A: verify's Spark engine, and the replay API as a notebook calls it
    by_spark = run_cli("verify", *configs.values(), "--engine", "spark", "--format", "json", env=s3.environment())
    assert by_spark.code == 0, by_spark.out + by_spark.err
    spark_report, arrow_report = json.loads(by_spark.out), json.loads(verified.out)
    assert (spark_report["ok"], spark_report["engine"], arrow_report["engine"]) == (True, "spark", "arrow")
    assert [(k["upstream"], k["downstream"], k["messages"], k["status"]) for k in spark_report["links"]] == \
        [(k["upstream"], k["downstream"], k["messages"], k["status"]) for k in arrow_report["links"]]
    notebook = run_python(NOTEBOOK, configs[c], tmp_path / "notebook-checkpoint", env=s3.environment())
    assert notebook.returncode == 0, notebook.stderr[-3000:]
    read = json.loads(notebook.stdout.splitlines()[-1])
    assert read["orders"] == sorted([f"pub-{name}", i] for name, count in published.items()
                                    for i in range(1, count + 1)), "replay.txlog() on S3"
    assert read["subscribed"] == sum(published.values()), "replay.subscribe(fully_durable=True) on S3"
    assert read["sow"] == len(sow), "replay.sow() on S3"
    assert read["rejected"] == DeltaTable(f"{storage}/rejected", storage_options=s3.access.delta_options()
                                          ).to_pyarrow_table().num_rows, "replay.rejected() on S3"
    secret = s3.secret_key
    assert secret not in (verified.out + verified.err + status.out + status.err + replayed.err + queue.out
                          + by_spark.out + by_spark.err + notebook.stdout + notebook.stderr)
    for log in tmp_path.glob("*.log"):
        assert secret not in log.read_text(errors="replace"), f"{log.name} names no secret"
    client = s3.access.client()
    for name in (a, b, c):
        for control in ("instance.json", "heartbeat.json"):
            body = client.get_object(Bucket=bucket, Key=f"fabric/{name}/_control/{control}")["Body"].read().decode()
            assert secret not in body, f"{name}'s {control} names no secret"


#: A notebook's reads of an instance on S3 through Spark: ``NOTEBOOK CONFIG CHECKPOINT`` prints what it read.
NOTEBOOK = """
import json, sys
from replication import replay

config, checkpoint = sys.argv[1:3]
orders = replay.txlog(config, topic="/orders").select("publisher", "publisher_seq").collect()
subscribed = []
query = (replay.subscribe(config, topic="/orders", fully_durable=True).writeStream
         .foreachBatch(lambda df, _batch: subscribed.extend(r.seq for r in df.select("seq").collect()))
         .option("checkpointLocation", checkpoint).start())
query.processAllAvailable()
query.stop()
print(json.dumps({"orders": sorted([r.publisher, r.publisher_seq] for r in orders),
                  "subscribed": len(subscribed), "sow": replay.sow(config, topic="/orders").count(),
                  "rejected": replay.rejected(config).count()}))
"""


def run_python(code: str, *args: object, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **env})


def _txlog(s3, storage: str):
    try:
        table = DeltaTable(f"{storage}/txlog", storage_options=s3.access.delta_options())
    except Exception:  # not created yet
        return pa.table({"seq": pa.array([], pa.int64())})
    return table.to_pyarrow_table(columns=["seq", "publisher", "publisher_seq"]).sort_by("seq")
