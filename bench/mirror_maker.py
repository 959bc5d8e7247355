"""Kafka MirrorMaker 2 copying a topic between two brokers: the replication benchmark's outside baseline.

What a Kafka user would run instead of A -> B replication: MM2 in dedicated mode
(``org.apache.kafka.connect.mirror.MirrorMaker``, from ``connect-mirror`` in jvm/pom.xml, the
jars the broker runs on), source cluster -> target cluster, one topic, its defaults but for
replication factors of 1 (single-node clusters) and no checkpoints or heartbeats (nothing reads
them here). It runs as its own JVM; the clock runs from its launch until the target topic holds
every record, and the copy alone from the first record on the target to the last.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from replication.connectors import jvm
from replication.connectors.kafka.security import PLAINTEXT, KafkaSecurity

#: Settings of the mm2.properties written for a run (the clusters and the topic are added).
MM2_PROPERTIES = {
    "clusters": "source, target",
    "source->target.enabled": "true",
    "target->source.enabled": "false",
    "replication.policy.class": "org.apache.kafka.connect.mirror.IdentityReplicationPolicy",
    "replication.factor": "1",
    "offset-syncs.topic.replication.factor": "1",
    "checkpoints.topic.replication.factor": "1",
    "heartbeats.topic.replication.factor": "1",
    "offset.storage.replication.factor": "1",
    "status.storage.replication.factor": "1",
    "config.storage.replication.factor": "1",
    "emit.checkpoints.enabled": "false",
    "emit.heartbeats.enabled": "false",
    "sync.topic.configs.enabled": "false",
    "sync.topic.acls.enabled": "false",
    "refresh.topics.interval.seconds": "1",
    "source->target.consumer.auto.offset.reset": "earliest",
}


@dataclass
class MirrorRun:
    """One MM2 copy of ``rows`` records."""

    rows: int
    seconds: float
    """From the MM2 JVM's launch until the target held every record."""
    copy_seconds: float
    """From the first record on the target until the last (MM2's start-up left out)."""
    cpu_kinds: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.rows / self.seconds

    @property
    def copy_rate(self) -> float:
        return self.rows / self.copy_seconds

    @property
    def cpu_seconds(self) -> float:
        return sum(self.cpu_kinds.values())


class TargetCount:
    """Records the target's copy of a topic holds (0 before MM2 created it), with one kept consumer."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from kafka import KafkaConsumer

        self.topic = topic
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap)

    def __call__(self) -> int:
        from kafka import TopicPartition

        parts = self.consumer.partitions_for_topic(self.topic)
        if not parts:
            self.consumer.topics()  # a metadata refresh: the topic appears when MM2 creates it
            return 0
        return sum(self.consumer.end_offsets([TopicPartition(self.topic, p) for p in parts]).values())

    def close(self) -> None:
        self.consumer.close()


def mirror(source: str, target: str, topic: str, rows: int, partitions: int, workdir: Path, *,
           cpu_by_kind, timeout: float = 900.0, source_security: KafkaSecurity = PLAINTEXT) -> MirrorRun:
    """Copy ``topic`` (``rows`` records) from ``source`` to ``target`` with MM2; time it.

    ``cpu_by_kind``: the benchmark's CPU accounting (a dict of CPU seconds by process kind so far).
    ``source_security``: TLS and SASL toward ``source`` (its password is written to the run's mm2.properties,
    under the run's own folder).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    props = {**MM2_PROPERTIES, "source.bootstrap.servers": source, "target.bootstrap.servers": target,
             "source->target.topics": topic, "tasks.max": str(partitions),
             # the source is the benchmark's Kafka (--kafka-security); the target, MM2's own broker, is plain
             **{f"source.{key.removeprefix('kafka.')}": value for key, value in source_security.spark_kafka().items()}}
    config = workdir / "mm2.properties"
    config.touch(mode=0o600)  # (it may hold the source's password: readable by this user only)
    config.write_text("".join(f"{k} = {v}\n" for k, v in props.items()))
    log4j = workdir / "log4j2.properties"
    log4j.write_text("status = warn\nappender.f.type = File\nappender.f.name = f\n"
                     f"appender.f.fileName = {workdir / 'mm2.log'}\nappender.f.layout.type = PatternLayout\n"
                     "appender.f.layout.pattern = [%d] %p %m (%c)%n\nrootLogger.level = WARN\n"
                     "rootLogger.appenderRef.f.ref = f\n")
    cmd = [jvm.java(), "-Xmx1g", f"-Dlog4j2.configurationFile=file:{log4j}", "-cp", jvm.kafka_classpath(),
           "org.apache.kafka.connect.mirror.MirrorMaker", str(config)]
    before = cpu_by_kind()
    started = time.perf_counter()
    with open(workdir / "mm2.out", "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    first = None
    count = TargetCount(target, topic)
    try:
        while True:
            copied = count()
            now = time.perf_counter()
            if copied and first is None:
                first = now
            if copied >= rows:
                break
            if proc.poll() is not None:
                raise SystemExit(f"MirrorMaker 2 exited with code {proc.returncode}; see {workdir / 'mm2.log'}")
            if now - started > timeout:
                raise SystemExit(f"MirrorMaker 2 copied {copied:,} of {rows:,} records in {timeout:.0f}s")
            time.sleep(0.05)
        after = cpu_by_kind()
    finally:
        count.close()
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    spent = {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0.005}
    assert first is not None
    return MirrorRun(rows, now - started, max(now - first, 1e-3), spent)
