"""A test fabric: several instances in the test session's Spark application, with unique names."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

from replication import config
from replication.client import Publisher
from replication.connectors.kafka.security import PLAINTEXT, KafkaSecurity
from replication.instance import Instance
from support.factories import destination_xml, replication_xml, txlog_rows, write_config

TEST_TRIGGER = "100 milliseconds"

#: A destination topic for one-way links (nothing replicates back), as AMPS validation wants it said.
ONE_WAY = (
    "<Topic><Name>.*</Name><MessageType>json</MessageType>"
    "<ExcludeValidation>replicate,cascade</ExcludeValidation></Topic>"
)


def publish_orders(pub, n: int, topic: str = "/orders") -> None:
    """Publish ``n`` small JSON orders through an HA publisher."""
    for i in range(n):
        pub.publish(topic, json.dumps({"i": i, "qty": i % 300}).encode())


class TestFabric:
    """Writes configs, starts and stops instances, makes publishers; stops everything at the end."""

    __test__ = False  # not a test class

    def __init__(self, spark, broker, root: Path) -> None:
        self.spark = spark
        self.broker = broker
        self.root = root
        self.suffix = uuid.uuid4().hex[:5]
        self.paths: dict[str, Path] = {}
        self.running: dict[str, Instance] = {}
        self.publishers: list[Publisher] = []

    def name(self, short: str) -> str:
        """Instance names are unique per test (Kafka topics are shared by the session's broker)."""
        return f"{short}-{self.suffix}"

    def storage(self, short: str) -> Path:
        return self.root / self.name(short)

    def rows(self, short: str, columns: list[str] | None = None):
        """The txlog of an instance, in seq order; ``columns`` (``seq`` among them): only those."""
        return txlog_rows(self.root, self.name(short), columns)

    def count(self, short: str) -> int:
        """Rows in an instance's txlog (0 before it exists); one column read, as tests poll it."""
        try:
            return self.rows(short, ["seq"]).num_rows
        except Exception:
            return 0

    def configure(self, short: str, **kwargs) -> Path:
        path = write_config(self.root, self.name(short), self.broker.bootstrap, **kwargs)
        self.paths[short] = path
        return path

    def start_one_way_pair(self, **kwargs) -> None:
        """A -> B (a sync destination, ``ONE_WAY`` topics), ``kwargs`` in both configs: B started, then A."""
        self.configure("b", **kwargs)
        self.configure("a", replication=replication_xml(destination_xml(self.name("b"), [self.storage("b")],
                                                                        topics=ONE_WAY)), **kwargs)
        self.start("b")
        self.start("a")

    def start_sync_pair(self) -> None:
        """A <-> B, each the other's sync destination, both in group ``pair``: A started, then B."""
        self.configure("a", group="pair", replication=replication_xml(destination_xml(self.name("b"),
                                                                                      [self.storage("b")])))
        self.configure("b", group="pair", replication=replication_xml(destination_xml(self.name("a"),
                                                                                      [self.storage("a")])))
        self.start("a")
        self.start("b")

    def start(self, short: str) -> Instance:
        inst = Instance(config.load(str(self.paths[short])), self.spark, trigger_interval=TEST_TRIGGER).start()
        self.running[short] = inst
        return inst

    def stop(self, short: str) -> None:
        self.running.pop(short).stop()

    def publisher(self, client: str, short: str, **kwargs) -> Publisher:
        name = self.name(short)
        pub = Publisher(client, bootstrap=self.broker.bootstrap, topic=f"{name}.publish", instance=name,
                        store_path=kwargs.pop("store_path", self.root / f"{client}.store"), **kwargs)
        self.publishers.append(pub)
        return pub

    def close(self) -> None:
        for pub in self.publishers:
            try:
                pub.close()
            except Exception:
                pass
        for short in list(self.running):
            self.stop(short)


def link_of(fabric: TestFabric, short: str, dest: str) -> dict:
    """What ``replication status`` shows for one destination of a running instance."""
    return fabric.running[short].status().links[dest]


class AckRecorder:
    """Samples a publisher's persisted position every 20 ms: when each advance was seen."""

    def __init__(self, pub) -> None:
        import threading
        import time

        self.pub = pub
        self.advances: list[tuple[float, int]] = []  # (monotonic time, persisted seq)
        self._stop = threading.Event()

        def sample() -> None:
            last = -1
            while not self._stop.wait(0.02):
                seq = pub.persisted_seq
                if seq != last:
                    self.advances.append((time.monotonic(), seq))
                    last = seq

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()

    def first_covering(self, seq: int) -> float | None:
        """When the persisted position first reached ``seq``."""
        return next((t for t, s in self.advances if s >= seq), None)

    def largest_gap(self, start: float, end: float) -> float:
        """The longest time in [start, end] with no advance."""
        times = [start] + [t for t, _ in self.advances if start < t < end] + [end]
        return max(b - a for a, b in zip(times, times[1:]))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class PacedPublisher:
    """Publishes small orders at a steady rate in a thread until stopped; ``published`` is the last seq."""

    def __init__(self, pub, rate: float, topic: str = "/orders") -> None:
        import threading

        self.pub = pub
        self.published = 0
        self._stop = threading.Event()

        def run() -> None:
            while not self._stop.wait(1.0 / rate):
                self.published = pub.publish(topic, json.dumps({"qty": self.published % 300}).encode())

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.published


class AckListener(threading.Thread):
    """A long-lived consumer of ``<instance>.acks`` (librdkafka's or kafka-python's), from its beginning: the
    highest persisted seq it saw per client, and the failure acks. Use as a context manager, or ``start()`` and
    ``stop()``."""

    def __init__(self, kind: str, bootstrap: str, topic: str, security: KafkaSecurity = PLAINTEXT) -> None:
        super().__init__(daemon=True, name=f"acks-{kind}")
        self.kind, self.bootstrap, self.topic, self.security = kind, bootstrap, topic, security
        self.persisted: dict[str, int] = {}
        self.failures: list[dict] = []
        self.ready = threading.Event()
        self._halt = threading.Event()

    def _take(self, value: bytes) -> None:
        ack = json.loads(value)
        if ack.get("status") == "failure":
            self.failures.append(ack)
        elif not ack.get("logon"):
            self.persisted[ack["client"]] = max(self.persisted.get(ack["client"], 0), int(ack["seq"]))

    def run(self) -> None:
        if self.kind == "librdkafka":
            from confluent_kafka import Consumer as RdConsumer

            consumer = RdConsumer({"bootstrap.servers": self.bootstrap, "group.id": f"acks-{time.time_ns()}",
                                   "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                   **self.security.librdkafka()})
            consumer.subscribe([self.topic], on_assign=lambda *_: self.ready.set())
            try:
                while not self._halt.is_set():
                    message = consumer.poll(0.1)
                    if message is not None and message.error() is None:
                        self._take(message.value())
            finally:
                consumer.close()
        else:
            from kafka import KafkaConsumer, TopicPartition

            consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                     **self.security.kafka_python())
            consumer.assign([TopicPartition(self.topic, 0)])
            consumer.seek_to_beginning()
            self.ready.set()
            try:
                while not self._halt.is_set():
                    for records in consumer.poll(timeout_ms=100).values():
                        for record in records:
                            self._take(record.value)
            finally:
                consumer.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)


    def __enter__(self) -> AckListener:
        self.start()
        assert self.ready.wait(60), f"the {self.kind} consumer was not assigned {self.topic}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
