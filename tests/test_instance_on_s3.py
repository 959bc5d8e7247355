"""An instance whose ``<Storage>`` is ``s3://`` (issue 36): its txlog, rejected table, control files and Spark's
streaming checkpoint live in the bucket (the local S3 server), the machine keeps nothing but scratch.

The instance runs in processes of its own, each with a private scratch folder (``TMPDIR``, Spark's local
directories), killed with kill -9 mid-batch; its scratch is deleted before the next start, as when a machine
is lost and a new one takes the same config.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
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

#: Where the instance is killed: its txlog commit done, Spark's checkpoint commit (in the bucket, through s3a)
#: not, so the restarted instance runs that batch again from the bucket alone and must not store it twice.
CRASH_POINT = "ingest.after_txlog_commit@2"
PER_RUN = 400
TASKS = 30


def s3_config(directory: Path, name: str, bucket: str, bootstrap: str) -> Path:
    path = directory / f"{name}.xml"
    path.write_text(f"""<?xml version="1.0"?>
<AMPSConfig>
  <Name>{name}</Name>
  <Storage>s3://{bucket}/fabric/{name}</Storage>
  <Transports>
    <Transport>
      <Name>json-kafka</Name><Type>kafka</Type><InetAddr>{bootstrap}</InetAddr>
      <Topic>{name}.publish</Topic><MessageType>json</MessageType>
      <MaxOffsetsPerTrigger>100</MaxOffsetsPerTrigger>
    </Transport>
    <Transport><Name>amps-replication</Name><Type>amps-replication</Type></Transport>
  </Transports>
  <TransactionLog><Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
  <SOW>
    <Queue><Name>/work</Name><MessageType>json</MessageType><UnderlyingTopic>/tasks</UnderlyingTopic>
      <Semantics>at-least-once</Semantics></Queue>
  </SOW>
</AMPSConfig>
""")
    return path


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


def test_an_instance_on_s3_killed_mid_batch_and_restarted_on_a_new_scratch_stores_every_message_once(
        s3, broker, tmp_path):
    name = f"s3i{uuid.uuid4().hex[:6]}"
    bucket = f"fabric-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    cfg = s3_config(tmp_path, name, bucket, broker.bootstrap)

    def start(run: int, failpoints: str | None) -> InstanceProcess:
        scratch = tmp_path / f"scratch{run}"  # this machine's: temporary files, Spark's local directories
        scratch.mkdir()
        return InstanceProcess(cfg, tmp_path / f"run{run}.log", failpoints=failpoints,
                               env={**s3.environment(), "TMPDIR": str(scratch), "SPARK_LOCAL_DIRS": str(scratch)})

    proc = start(0, CRASH_POINT)
    worker = None
    pub = Publisher("s3-pub", bootstrap=broker.bootstrap, topic=f"{name}.publish", instance=name,
                    store_path=tmp_path / "pub.store", resend_after=3, logon_timeout=240)
    published = 0
    try:
        published = publish(pub, published, PER_RUN)
        assert proc.wait_killed(timeout=300) == -signal.SIGKILL, proc.log_text()[-3000:]
        assert f"failpoint {CRASH_POINT.split('@')[0]} reached" in proc.log_text()
        assert pub.persisted_seq < published, "the crash came after everything was acknowledged"
        shutil.rmtree(tmp_path / "scratch0")  # the machine is lost with everything on its disk
        proc = start(1, None)
        orders = published = publish(pub, published, PER_RUN // 2)
        # the queue over /tasks, served from the bucket: each task delivered once, and acknowledged
        tasks = {pub.publish("/tasks", b'{"task": %d}' % n) for n in range(TASKS)}
        published += TASKS
        pub.flush(timeout=300)
        worker = QueueConsumer("worker", bootstrap=broker.bootstrap, topic=f"{name}.publish", instance=name,
                               queue="/work", store_path=tmp_path / "worker.store", max_backlog=TASKS)
        delivered = []
        while len(delivered) < TASKS and (message := worker.receive(timeout=120)) is not None:
            delivered.append(message)
            message.ack()
        assert worker.flush(timeout=120) == [], "every acknowledgement persisted"
        backfill_into_the_running_instance(s3, cfg, tmp_path / "in")
        # Spark ran the killed batch again from the checkpoint in the bucket (a lost checkpoint would have
        # re-read Kafka from its start instead), and the txlog's app transaction knew it was stored
        assert re.search(rf"{name}: ingest batch \d+ already committed; replay skipped", proc.log_text()), \
            proc.log_text()[-3000:]
    finally:
        pub.close()
        if worker is not None:
            worker.close()
        proc.stop()
    assert pub.persisted_seq == published, "every message acknowledged as persisted"

    storage = f"s3://{bucket}/fabric/{name}"
    rows = DeltaTable(f"{storage}/txlog", storage_options=s3.access.delta_options()).to_pyarrow_table(
        columns=["seq", "bookmark", "publisher", "publisher_seq", "command", "topic", "sow_keys"]).sort_by("seq")
    acks = rows.filter(pc.equal(rows["publisher"], "worker"))
    assert_exactly_once(rows, {"s3-pub": published, "worker": acks.num_rows, "loader": BACKFILLED})
    seq_of = dict(zip(*(rows[c].to_pylist() for c in ("bookmark", "publisher_seq")), strict=True))
    assert sorted(seq_of[m.bookmark] for m in delivered) == sorted(tasks), "each task delivered once"
    acknowledged = [b for r in acks.to_pylist() if r["command"] == "sow_delete" and r["topic"] == "/work"
                    for b in bookmarks_in(r["sow_keys"])]
    assert sorted(acknowledged) == sorted(m.bookmark for m in delivered), "each acknowledged once in the txlog"

    stored = keys(s3, bucket)
    prefix = f"fabric/{name}/"
    assert all(k.startswith(prefix) for k in stored)
    for expected in ("_control/instance.json", "_control/heartbeat.json", "_control/publishers.json",
                     "_control/durable.json", "_checkpoints/ingest/metadata", "_checkpoints/ingest/commits/0",
                     "txlog/_delta_log/00000000000000000000.json", "rejected/_delta_log/00000000000000000000.json"):
        assert prefix + expected in stored, f"{expected} is in the bucket"
    assert not [k for k in stored if k.startswith((f"{prefix}inbox/_backfill/", f"{prefix}_backfill/"))
                or k.endswith(".lock")], "no staged part, announcement or lock left"
    # on this machine: the config, the logs, the publisher's store, the backfill's input and the scratch of the
    # running one
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [cfg.name, "pub.store", "worker.store", "run0.log", "run1.log", "scratch1", "in"])
    assert re.search(rf"{name}: backfill part _backfill/\w+/\d+-\w+\.parquet \(client loader\) is classified",
                     (tmp_path / "run1.log").read_text()), "the general path: no rename into txlog/ in a bucket"

    status = run_cli("status", cfg, "--format", "json", env=s3.environment())
    assert status.code == 0, status.err
    [instance] = json.loads(status.out)
    assert (instance["instance"], instance["max_seq"], instance["durable_seq"]) == (name, rows.num_rows,
                                                                                    rows.num_rows), \
        "status reads the heartbeat in the bucket"
    replayed = run_cli("replay", cfg, "--topic", "/orders", "--fully-durable", env=s3.environment())
    assert replayed.code == 0, replayed.err
    assert [json.loads(line)["data"]["i"] for line in replayed.out.splitlines()] == list(range(1, orders + 1))
    verified = run_cli("verify", cfg, "--engine", "arrow", env=s3.environment())
    assert verified.code == 0, verified.out + verified.err
    queue = run_cli("queue", cfg, "--topic", "/work", "--format", "json", env=s3.environment())
    assert queue.code == 0, queue.err
    assert (json.loads(queue.out)["acknowledged"], json.loads(queue.out)["depth"]) == (TASKS, 0), queue.out
    by_spark = run_cli("verify", cfg, "--engine", "spark", env=s3.environment())
    assert by_spark.code == 2 and "with Spark is not supported yet. Fix: --engine arrow" in by_spark.err, \
        by_spark.err
    secret = s3.secret_key
    assert secret not in status.out + status.err + replayed.err + verified.out + verified.err
    for run in range(2):
        assert secret not in (tmp_path / f"run{run}.log").read_text(errors="replace")
    client = s3.access.client()
    for control in ("instance.json", "heartbeat.json"):
        body = client.get_object(Bucket=bucket, Key=f"{prefix}_control/{control}")["Body"].read().decode()
        assert secret not in body, f"{control} names no secret"


class _BucketRoot(str):
    """An ``s3://`` prefix that test config builders join as they join a local folder (``root / name``)."""

    def __truediv__(self, name: str) -> str:
        return f"{self}/{name}"


#: Where the middle instance is killed: its txlog holds a batch of rows its upstream replicated, Spark's
#: checkpoint (in the bucket) does not, and neither its acknowledgements nor its own replicator have moved.
FABRIC_CRASH_POINT = "ingest.after_txlog_commit@4"
FABRIC_PER_RUN = 200
PAIR = "<Topic><Name>.*</Name><MessageType>json</MessageType><ExcludeValidation>cascade</ExcludeValidation></Topic>"


def test_a_sync_pair_and_a_chain_of_three_on_s3_survive_a_kill_9_of_the_middle_instance(s3, broker, tmp_path):
    """A <-> B (a two-way sync pair) and A -> B -> C (a chain of three, B passing A's messages on), every address
    an ``s3://`` one, each instance a process of its own with a private scratch; B is killed mid-batch, loses its
    scratch, and is restarted."""
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
        configs[name].write_text(instance_xml(name, root, broker.bootstrap, max_offsets=100, sow=SOW,
                                              replication=replication))

    def start(name: str, run: int, failpoints: str | None = None) -> InstanceProcess:
        scratch = tmp_path / f"scratch-{name}-{run}"
        scratch.mkdir()
        return InstanceProcess(configs[name], tmp_path / f"{name}-{run}.log", failpoints=failpoints,
                               env={**s3.environment(), "TMPDIR": str(scratch), "SPARK_LOCAL_DIRS": str(scratch)})

    procs = {a: start(a, 0), b: start(b, 0, FABRIC_CRASH_POINT), c: start(c, 0)}
    pubs = {name: Publisher(f"pub-{name}", bootstrap=broker.bootstrap, topic=f"{name}.publish", instance=name,
                            store_path=tmp_path / f"pub-{name}.store", resend_after=3, logon_timeout=300)
            for name in (a, b)}
    published = dict.fromkeys(pubs, 0)
    try:
        for name, pub in pubs.items():
            published[name] = publish(pub, published[name], FABRIC_PER_RUN)
        assert procs[b].wait_killed(timeout=600) == -signal.SIGKILL, procs[b].log_text()[-3000:]
        assert f"failpoint {FABRIC_CRASH_POINT.split('@')[0]} reached" in procs[b].log_text()
        shutil.rmtree(tmp_path / f"scratch-{b}-0")  # B's machine is lost with everything on its disk
        procs[b] = start(b, 1)
        for name, pub in pubs.items():
            published[name] = publish(pub, published[name], FABRIC_PER_RUN // 2)
        for pub in pubs.values():
            pub.flush(timeout=600)
        expected = {f"pub-{name}": count for name, count in published.items()}
        for name in (a, b, c):
            wait_until(lambda name=name: _txlog(s3, root / name).num_rows >= sum(expected.values()), timeout=300,
                       what=f"{name} holds every message")
    finally:
        for pub in pubs.values():
            pub.close()
        for proc in procs.values():
            proc.stop()
    for name, pub in pubs.items():
        assert pub.persisted_seq == published[name], f"every message published at {name} acknowledged"
    for name in (a, b, c):
        assert_exactly_once(_txlog(s3, root / name), expected)
    assert re.search(rf"{b}: ingest batch \d+ already committed; replay skipped", procs[b].log_text()), \
        procs[b].log_text()[-3000:]

    verified = run_cli("verify", *configs.values(), "--engine", "arrow", env=s3.environment())
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
    for name in (a, b, c):
        assert f"fabric/{name}/inbox/_delta_log/00000000000000000000.json" in stored, f"{name}'s inbox is in the bucket"
    for upstream, name in ((a, b), (b, a), (b, c)):
        assert f"fabric/{name}/_control/acks/{upstream}.json" in stored, f"{name} acknowledges {upstream} there"
        assert f"fabric/{upstream}/_control/links/{name}.json" in stored, f"{upstream}'s link to {name} is there"
    # on this machine: configs, logs, the publishers' stores, and the scratch of the runs still there
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*(p.name for p in configs.values()), *(f"pub-{n}.store" for n in pubs),
         *(f"{n}-0.log" for n in (a, b, c)), f"{b}-1.log",
         *(f"scratch-{n}-0" for n in (a, c)), f"scratch-{b}-1"])
    secret = s3.secret_key
    assert secret not in verified.out + verified.err
    for log in tmp_path.glob("*.log"):
        assert secret not in log.read_text(errors="replace"), f"{log.name} names no secret"


def _txlog(s3, storage: str):
    try:
        table = DeltaTable(f"{storage}/txlog", storage_options=s3.access.delta_options())
    except Exception:  # not created yet
        return pa.table({"seq": pa.array([], pa.int64())})
    return table.to_pyarrow_table(columns=["seq", "publisher", "publisher_seq"]).sort_by("seq")
