"""An instance on a Spark standalone cluster: a master and two workers, each its own JVM with one core.

The instance is submitted with ``spark-submit.sh --master spark://...``. 200k messages wait in Kafka when the
instance starts, so its batches are large and Spark reads them with
tasks on the workers' executors (small batches are read in the driver). Every message is stored once, and
the executors' own logs show the tasks they ran.
"""

from __future__ import annotations

import re
import uuid

import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable
from support.factories import assert_exactly_once, txlog_rows, wait_until, write_config
from support.processes import InstanceProcess
from support.repo import REPO

from replication.connectors.kafka.broker import ensure_topics
from replication.connectors.spark.cluster import StandaloneCluster

pytestmark = pytest.mark.slow

PER_PUBLISHER = 100_000
RESENT = 2_000


@pytest.fixture(scope="module")
def cluster():
    with StandaloneCluster(workers=2, cores=1, memory="1g") as running:
        yield running


def finished_tasks(cluster: StandaloneCluster, worker: int) -> int:
    """Tasks the executors of ``worker`` finished, from their logs (``app-*/<executor id>/stderr``)."""
    logs = cluster.worker_dir(worker).glob("app-*/*/stderr")
    return sum(len(re.findall(r"Finished task", path.read_text(errors="replace"))) for path in logs)


def test_an_instance_on_a_standalone_cluster_stores_200k_messages_once_read_by_the_workers(
        cluster, broker, tmp_path):
    name = f"cl{uuid.uuid4().hex[:6]}"
    cfg = write_config(tmp_path, name, broker.bootstrap)
    topic = f"{name}.publish"
    ensure_topics(broker.bootstrap, [topic], partitions=2)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20, "compression.type": "zstd"})
    for partition in range(2):  # one publisher per partition: each one's sequence stays in order
        client = f"bulk-{partition}"
        seqs = [*range(1, PER_PUBLISHER + 1), *range(1, RESENT + 1)]  # a publisher's resends: duplicates
        for seq in seqs:
            producer.produce(topic, value=b'{"n": %d}' % seq, partition=partition, headers=[
                ("amps-client", client.encode()), ("amps-seq", str(seq).encode()), ("amps-topic", b"/orders")])
            if seq % 10_000 == 0:
                producer.poll(0)
    assert producer.flush(60) == 0

    # submitted as docs/operations.md says: the master given to spark-submit.sh is the one the instance runs on
    proc = InstanceProcess(cfg, tmp_path / "run.log",
                           command=[str(REPO / "spark-submit.sh"), "--master", cluster.master_url])
    try:
        txlog = tmp_path / name / "txlog"

        def stored() -> int:
            if not (txlog / "_delta_log").exists():
                return 0
            return sum(DeltaTable(str(txlog)).get_add_actions(flatten=True).column("num_records").to_pylist())

        wait_until(lambda: stored() >= 2 * PER_PUBLISHER or proc.proc.poll() is not None, timeout=600,
                   interval=1.0, what="the instance to store every message")
        assert proc.proc.poll() is None, proc.log_text()[-3000:]
    finally:
        proc.stop()
    assert_exactly_once(txlog_rows(tmp_path, name, ["seq", "publisher", "publisher_seq"]),
                        {"bulk-0": PER_PUBLISHER, "bulk-1": PER_PUBLISHER})
    tasks = [finished_tasks(cluster, worker) for worker in range(2)]
    assert sum(tasks) > 0, f"no task ran on the workers' executors: {tasks}"
    assert all(list(cluster.worker_dir(w).glob("app-*/*/stderr")) for w in range(2)), "an executor on each worker"
