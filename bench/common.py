"""Helpers shared by the benchmarks: message bodies, fast pre-publishing, configs, timers, tables."""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

#: The environment variable naming the ``--kafka-security`` file (children started with ``spawn`` read it too).
SECURITY_FILE_VARIABLE = "REPLICATION_BENCH_KAFKA_SECURITY"
#: The environment variable holding the bucket of ``--storage s3`` (children read it too); unset: local disk.
TABLES_VARIABLE = "REPLICATION_BENCH_TABLES"
#: The bucket ``--storage s3`` keeps every table, instance storage and checkpoint in.
BENCH_BUCKET = "bench"


def add_kafka_arguments(parser, help_bootstrap: str = "use this Kafka instead of a broker started by the "
                        "benchmark") -> None:
    """``--bootstrap`` and ``--kafka-security`` (a file holding a ``<Security>`` element, as in a Kafka
    transport of a config: TLS and SASL toward that Kafka)."""
    parser.add_argument("--bootstrap", help=help_bootstrap)
    parser.add_argument("--kafka-security", metavar="FILE",
                        help="with --bootstrap: a file holding the <Security> element of a Kafka <Transport> "
                             "(TLS, SASL) used by every client of the benchmark and by its instances")


def use_kafka_security(parser, args) -> None:
    """Check ``--kafka-security`` and hand it to this process and its children (by the environment)."""
    import os

    if not getattr(args, "kafka_security", None):
        return
    if not args.bootstrap:
        parser.error("--kafka-security goes with --bootstrap (the benchmark's own broker is plain text)")
    from replication.config.security import load_security_file
    from replication.errors import ConfigError

    try:
        load_security_file(args.kafka_security).check()
    except (ConfigError, ValueError) as exc:
        parser.error(f"--kafka-security: {exc}")
    os.environ[SECURITY_FILE_VARIABLE] = str(Path(args.kafka_security).resolve())
    kafka_security.cache_clear()


def add_storage_argument(parser) -> None:
    """``--storage``: where instances, baselines and their checkpoints keep their tables."""
    parser.add_argument("--storage", type=storages, default=("local",), metavar="local|s3|local,s3",
                        help="s3: tables and checkpoints in a bucket of the project's local S3 server "
                             "(replication/connectors/s3/server.py), started for the run; local,s3: the "
                             "throughput passes on both, side by side, and the ratios compared")


def storages(text: str) -> tuple[str, ...]:
    """``--storage``'s value: ``local``, ``s3`` or both, comma-separated."""
    import argparse

    kinds = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    if not kinds or any(k not in ("local", "s3") for k in kinds):
        raise argparse.ArgumentTypeError(f"{text!r}: give local, s3 or local,s3")
    return kinds


@contextlib.contextmanager
def tables_in(kind: str) -> Iterator[None]:
    """Within the block, :func:`table_location` places tables on ``kind`` (``local`` or ``s3``)."""
    import os

    saved = os.environ.pop(TABLES_VARIABLE, None)
    if kind == "s3":
        os.environ[TABLES_VARIABLE] = BENCH_BUCKET
    try:
        yield
    finally:
        os.environ.pop(TABLES_VARIABLE, None)
        if saved is not None:
            os.environ[TABLES_VARIABLE] = saved


def table_location(workdir: Path, name: str) -> str:
    """Where table (or instance storage) ``name`` goes: ``workdir/name``, or under ``--storage s3``
    ``s3://bench/<workdir's name>/name``."""
    import os

    bucket = os.environ.get(TABLES_VARIABLE)
    return f"s3://{bucket}/{workdir.name}/{name}" if bucket else str(workdir / name)


def spark_table_location(workdir: Path, name: str) -> str:
    """:func:`table_location` as Spark names it (``s3a://`` for a bucket)."""
    location = table_location(workdir, name)
    return "s3a://" + location.removeprefix("s3://") if location.startswith("s3://") else location


def delta_options(location: str) -> dict[str, str] | None:
    """deltalake's storage options for a table at ``location`` (None on local disk)."""
    from replication.connectors.s3.access import delta_options_for

    return delta_options_for(location)


@contextlib.contextmanager
def benchmark_storage(args) -> Iterator[None]:
    """Under ``--storage`` with ``s3``: the project's local S3 server and its bucket for the ``with`` block,
    the standard AWS variables pointing this process and its children at it, and tables placed there
    (:func:`tables_in` moves a phase elsewhere); else nothing."""
    import os

    if "s3" not in getattr(args, "storage", ()):
        yield
        return
    from replication.connectors.s3.server import LocalS3Server

    with LocalS3Server() as server:
        server.create_bucket(BENCH_BUCKET)
        saved = {k: os.environ.get(k) for k in server.environment()}
        os.environ.update(server.environment())
        try:
            with tables_in("s3"):
                yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@functools.cache
def kafka_security():
    """The benchmark's Kafka security (``--kafka-security``; plain text without it)."""
    import os

    from replication.connectors.kafka.security import PLAINTEXT

    path = os.environ.get(SECURITY_FILE_VARIABLE)
    if not path:
        return PLAINTEXT
    from replication.config.security import load_security_file

    return load_security_file(path)


def kafka_client_kwargs() -> dict[str, Any]:
    """kafka-python keyword arguments for the benchmark's Kafka (``--kafka-security``)."""
    return kafka_security().kafka_python()


#: Producer settings for bulk pre-publishing: big zstd batches, as a real feed would send.
BULK_PRODUCER = dict(compression_type="zstd", linger_ms=20, batch_size=512 * 1024, max_request_size=16 * 1024 * 1024)


def order_body(seq: int) -> bytes:
    """A ~200-byte JSON order, different for every ``seq``."""
    return json.dumps({
        "id": seq, "symbol": "ACME", "side": "buy" if seq % 2 else "sell", "qty": seq % 1000,
        "price": 100.0 + seq % 97 / 10, "trader": f"trader-{seq % 50:04d}", "desk": "equities-nyc",
        "account": f"ACC-{seq % 10007:06d}", "note": "benchmark order flow with a realistic body size of ~200 B",
    }, separators=(",", ":")).encode()


# -- publishing ------------------------------------------------------------------


@dataclass(frozen=True)
class Feed:
    """One publisher's share of a pre-publish: ``count`` messages numbered from ``first_seq``."""

    client: str
    partition: int
    first_seq: int
    count: int


def feeds(count: int, publishers: int, partitions: int, *, first_seq: int = 1) -> list[Feed]:
    """Split ``count`` messages over publishers ``pub-0..`` (publisher k on partition k mod partitions)."""
    shares = [count // publishers + (1 if k < count % publishers else 0) for k in range(publishers)]
    return [Feed(f"pub-{k}", k % partitions, first_seq, n) for k, n in enumerate(shares) if n]


def prepublish(bootstrap: str, topic: str, plan: Sequence[Feed]) -> float:
    """Publish every feed with its own raw KafkaProducer in its own process; returns msg/s."""
    started = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")  # never fork a process that runs a JVM gateway
    procs = [ctx.Process(target=_publish_feed, args=(bootstrap, topic, feed)) for feed in plan]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    failed = [p.exitcode for p in procs if p.exitcode]
    if failed:
        raise SystemExit(f"a publishing process failed (exit codes {failed})")
    return sum(f.count for f in plan) / (time.perf_counter() - started)


@contextlib.contextmanager
def prepublished_broker(topic: str, messages: int, *, publishers: int, partitions: int, workdir: str | None,
                        prefix: str) -> Iterator[tuple[str, Path]]:
    """A broker started here with ``messages`` pre-published to ``topic``: (its bootstrap, the work directory),
    ``workdir`` or a temporary one (removed after). The broker is stopped after."""
    from replication.connectors.kafka.broker import EmbeddedBroker, ensure_topics

    where = Path(workdir or tempfile.mkdtemp(prefix=prefix))
    where.mkdir(parents=True, exist_ok=True)
    broker = EmbeddedBroker().start()
    try:
        ensure_topics(broker.bootstrap, [topic], partitions=partitions)
        rate = prepublish(broker.bootstrap, topic, feeds(messages, publishers, partitions))
        print(f"pre-published {messages:,} messages at {rate:,.0f} msg/s", file=sys.stderr, flush=True)
        yield broker.bootstrap, where
    finally:
        broker.stop()
        if not workdir:
            shutil.rmtree(where, ignore_errors=True)


def _publish_feed(bootstrap: str, topic: str, feed: Feed) -> None:
    """DESIGN §7 wire format: key and amps-client = client, amps-seq, amps-topic."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, **BULK_PRODUCER, **kafka_client_kwargs())
    client = feed.client.encode()
    for seq in range(feed.first_seq, feed.first_seq + feed.count):
        producer.send(
            topic, key=client, value=order_body(seq), partition=feed.partition,
            headers=[("amps-client", client), ("amps-seq", str(seq).encode()), ("amps-topic", b"/orders")],
        )
    producer.flush()
    producer.close()


# -- instances -------------------------------------------------------------------


def instance_config(workdir: Path, name: str, bootstrap: str, *, topic: str | None = None,
                    max_offsets: int | None = None, inbox: bool = True):
    """Write and load an instance config (see :func:`write_instance_config`)."""
    from replication import config

    return config.load(str(write_instance_config(workdir, name, bootstrap, topic=topic, max_offsets=max_offsets,
                                                 inbox=inbox)))


def write_instance_config(workdir: Path, name: str, bootstrap: str, *, topic: str | None = None,
                          max_offsets: int | None = None, inbox: bool = True, replication: str = "",
                          inbox_auth: str = "") -> Path:
    """Write ``<workdir>/<name>.xml``: Kafka ``topic`` (default ``<name>.publish``), every JSON topic recorded.

    ``inbox``: also the incoming replication transport, as every instance of a
    fabric has (DESIGN §4); the ingest query then reads Kafka and the inbox.
    ``replication``: a ``<Replication>`` element, as XML text. ``inbox_auth``: the incoming transport's
    ``<Authentication>``, as XML text.
    """
    from replication.config.security import security_xml

    topic = topic or f"{name}.publish"
    limit = f"<MaxOffsetsPerTrigger>{max_offsets}</MaxOffsetsPerTrigger>" if max_offsets else ""
    storage = table_location(workdir, name)
    incoming = (f"<Transport><Name>amps-replication</Name><Type>amps-replication</Type>"
                f"<InetAddr>{storage}</InetAddr>{inbox_auth}</Transport>") if inbox else ""
    path = workdir / f"{name}.xml"
    path.write_text(f"""<?xml version="1.0"?>
<AMPSConfig>
  <Name>{name}</Name>
  <Storage>{storage}</Storage>
  <Transports>
    <Transport>
      <Name>json-kafka</Name><Type>kafka</Type><InetAddr>{bootstrap}</InetAddr>
      <Topic>{topic}</Topic><MessageType>json</MessageType>{limit}{security_xml(kafka_security())}
    </Transport>
    {incoming}
  </Transports>
  <TransactionLog><Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
  {replication}
</AMPSConfig>
""")
    return path


def poll_for(predicate: Callable[[], Any], *, timeout: float, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns a truthy value (returned), or None after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value or None
        time.sleep(interval)


def wait_until(predicate: Callable[[], Any], *, timeout: float, interval: float = 0.02, what: str) -> Any:
    """:func:`poll_for`, but a timeout ends the benchmark with a message naming ``what``."""
    value = poll_for(predicate, timeout=timeout, interval=interval)
    if value is None:
        raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")
    return value


# -- synthetic txlogs --------------------------------------------------------------

_BODY_HEAD = '{"id":'
_BODY_TAIL = (',"symbol":"ACME","side":"buy","qty":500,"price":101.5,"trader":"trader-0007","desk":"equities-nyc",'
              '"account":"ACC-000123","note":"benchmark order flow with a realistic body size of ~200 B"}')


def synthetic_txlog_rows(instance: str, first: int, count: int, publishers: int, now: datetime):
    """Txlog rows ``first..first+count-1`` (0-based) as the instance would store them.

    Row i belongs to ``pub-(i % publishers)`` with publisher_seq ``i // publishers + 1``.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from replication.messages import publisher_id
    from replication.txlog.schema import TXLOG_SCHEMA

    i = np.arange(first, first + count, dtype=np.int64)
    who = pa.array(i % publishers)
    pub_seq = pa.array(i // publishers + 1)
    names = pa.array([f"pub-{k}" for k in range(publishers)])
    ids = pa.array([str(publisher_id(f"pub-{k}")) for k in range(publishers)])
    now_us = pa.array(np.full(count, int(now.timestamp() * 1e6), dtype=np.int64), pa.timestamp("us", tz="UTC"))
    const = lambda v: pa.array([v] * count, pa.string())  # noqa: E731
    columns = {
        "seq": pa.array(i + 1),
        "bookmark": pc.binary_join_element_wise(ids.take(who), pub_seq.cast(pa.string()), "", "|"),
        "publisher": names.take(who),
        "publisher_seq": pub_seq,
        "topic": const("/orders"),
        "message_type": const("json"),
        "command": const("publish"),
        "sow_key": pa.nulls(count, pa.string()),
        "sow_keys": pa.nulls(count, pa.string()),
        "filter": pa.nulls(count, pa.string()),
        "data": pc.binary_join_element_wise(_BODY_HEAD, pa.array(i + 1).cast(pa.string()), _BODY_TAIL, "")
        .cast(pa.binary()),
        "origin": const(instance),
        "received_from": pa.nulls(count, pa.string()),
        "received_from_group": pa.nulls(count, pa.string()),
        "path": pa.ListArray.from_arrays(pa.array(np.arange(count + 1, dtype=np.int32)), const(instance)),
        "publish_time": now_us,
        "persist_time": now_us,
    }
    return pa.table(columns).cast(TXLOG_SCHEMA)


def build_txlog(cfg, rows: int, publishers: int, chunk: int) -> None:
    """Write ``rows`` txlog rows in commits of ``chunk``, each with the metadata an ingest commit carries.

    No ``ingest`` app transaction is recorded: the instance starts a new query
    (batch ids from 0), as after its checkpoint was reset; it recovers
    ``max_seq`` and the publishers' high-water marks from the snapshot and
    the commit metadata like from any log of its own.
    """
    from deltalake import CommitProperties, write_deltalake

    from replication.connectors.delta.tables import COMMIT_METADATA_KEY, open_or_create
    from replication.storage.layout import StorageLayout
    from replication.txlog.publishers import PublisherState
    from replication.txlog.schema import TXLOG_SCHEMA

    layout = StorageLayout.of(cfg.storage)
    table = open_or_create(layout.txlog, TXLOG_SCHEMA, name=f"{cfg.name} txlog")
    state = PublisherState()
    now = datetime.now(timezone.utc)
    for batch, first in enumerate(range(0, rows, chunk)):
        count = min(chunk, rows - first)
        last = first + count - 1
        metadata = {
            "batch": batch, "first_seq": first + 1, "last_seq": last + 1, "links": {},
            "publishers": {f"pub-{k}": (last - (last - k) % publishers) // publishers + 1
                           for k in range(min(publishers, count))},
        }
        write_deltalake(table, synthetic_txlog_rows(cfg.name, first, count, publishers, now), mode="append",
                        commit_properties=CommitProperties(
                            custom_metadata={COMMIT_METADATA_KEY: json.dumps(metadata, separators=(",", ":"))}))
        state.apply(table.version(), metadata)
    state.save(layout.publishers_json)


# -- reporting -------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, nearest-rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Rows as an aligned text table (first column left-aligned, others right-aligned)."""
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(row: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule] + [line(r) for r in cells[1:]])


def run_benchmark(name: str, args, measure: Callable) -> None:
    """Start a broker (unless ``--bootstrap``), the S3 server (``--storage s3``) and a SparkSession, print
    ``measure(...)``'s report, clean up."""
    from replication.connectors.kafka.broker import EmbeddedBroker
    from replication.connectors.spark.session import session

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix=f"{name}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    broker = None if args.bootstrap else EmbeddedBroker().start()
    try:
        with benchmark_storage(args):
            spark = session(name, object_storage="s3" in getattr(args, "storage", ()))
            for setting in getattr(args, "conf", []):  # --conf KEY=VALUE: settings to try, before any query
                key, _, value = setting.partition("=")
                spark.conf.set(key.strip(), value.strip())
            print(measure(spark, workdir, args.bootstrap or broker.bootstrap, args), flush=True)
            spark.stop()
    finally:
        if broker:
            broker.stop()
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


#: Client name of :func:`steady_publisher`.
STEADY_CLIENT = "steady-pub"


def steady_publisher(bootstrap: str, topic: str, instance: str, rate: float, seconds: float, store: str,
                     out: str, linger_ms: int | None = None) -> None:
    """(Own process.) Publish with a Publisher at ``rate`` msg/s; write publish and persisted-ack times to ``out``.

    Times are wall-clock (``time.time()``), comparable with the instances' on
    this machine. An ack watcher thread waits on the Publisher's own
    ``wait_persisted`` and stamps each advance of ``persisted_seq``. ``linger_ms``: the Publisher's (None:
    its default).
    """
    from replication.client import Publisher

    pub = Publisher(STEADY_CLIENT, bootstrap=bootstrap, topic=topic, instance=instance, store_path=store,
                    security=kafka_security(), **({} if linger_ms is None else {"linger_ms": linger_ms}))
    acks: list[tuple[int, float]] = []
    done = threading.Event()
    total = int(rate * seconds)

    def watch() -> None:
        target = 1
        while target <= total:
            try:
                pub.wait_persisted(target, timeout=0.5)
            except TimeoutError:
                if done.is_set():
                    return
                continue
            persisted = pub.persisted_seq
            acks.append((persisted, time.time()))
            target = persisted + 1

    watcher = threading.Thread(target=watch, name="ack-watch", daemon=True)
    watcher.start()
    sent: list[tuple[int, float]] = []
    started = time.perf_counter()
    for i in range(total):
        delay = started + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t = time.time()
        sent.append((pub.publish("/orders", order_body(i + 1)), t))
    try:
        pub.flush(timeout=120)
    finally:
        done.set()
        watcher.join(timeout=5)
        pub.close()
        Path(out).write_text(json.dumps({"sent": sent, "acks": acks}))


def data_batches(progress: list[dict]) -> list[dict]:
    """The progress entries of micro-batches that moved a source's offsets.

    Not ``numInputRows``: Spark counts only rows its own job read, and the
    engine reads small micro-batches itself (replication/planned_batch.py).
    """
    return [p for p in progress if any(s.get("startOffset") != s.get("endOffset") for s in p.get("sources") or ())]


def offsets_moved(progress: dict) -> int:
    """How far a micro-batch moved its sources: Kafka offsets, txlog seqs or inbox versions, summed."""
    total = 0
    for source in progress.get("sources") or ():
        start, end = _offset(source.get("startOffset")), _offset(source.get("endOffset"))
        for key, value in (end or {}).items():
            before = (start or {}).get(key)
            if isinstance(value, dict):  # Kafka: {topic: {partition: offset}}
                total += sum(int(o) - int((before or {}).get(p, 0)) for p, o in value.items())
            elif isinstance(value, int) and isinstance(before, int):
                total += value - before
    return total


def _offset(value):
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None
