"""Benchmark: what a SOW topic costs an instance's ingest, side by side with the same ingest without one.

One run prints (issue 11, "Performance"):

1. throughput: N (default 1M) ~200-byte JSON messages (zstd) over K (default
   100k) keys, 70% publish, 25% delta_publish, 5% sow_delete (by keys and by
   data, and a handful by filter), pre-published once; an instance whose
   ``/orders`` is a SOW topic and one with no SOW topic ingest the same topic,
   in turn (``--repeat``: best pass of each); ratio = with SOW / without;
2. the SOW work of one 100k-message batch (the ingest's classify with the SOW
   state, then applying its changes, minus the same classify without SOW)
   with 100k records in the SOW and with 1M; and a compaction of that batch's
   changes at both sizes;
3. latency: a publisher at a steady rate (default 2k msg/s) publishes new
   keys; a reader in its own process polls ``replication sow``'s read (``read_current`` by key)
   and stamps when each record is visible: p50 / p99 of publish -> visible;
4. query: ``replication sow`` (the CLI, a fresh process each time) on a SOW
   of ``--query-records`` (1M) records with 1,000 changes in the txlog after
   the table: time to the first record out, and to the last, by key, with a
   filter, and for every record.

    .venv/bin/python bench/sow.py --quick     # 200k messages, ~3 minutes
    .venv/bin/python bench/sow.py             # 1M messages
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("REPLICATION_SPARK_LOG_LEVEL", "ERROR")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    BULK_PRODUCER,
    add_kafka_arguments,
    format_table,
    kafka_client_kwargs,
    kafka_security,
    percentile,
    run_benchmark,
    steady_publisher,
    use_kafka_security,
    wait_until,
)
from timing import tree_cpu_seconds  # noqa: E402

PHASES = ("throughput", "batch", "latency", "query")
SOW = "<SOW><Topic><Name>/orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic></SOW>"


# -- the workload -----------------------------------------------------------------------


def message(rng: random.Random, n: int, keys: int) -> tuple[str, bytes, list[tuple[str, bytes]]]:
    """(command, body, extra headers) of message ``n``: ~200-byte orders over ``keys`` keys."""
    k = rng.randrange(keys)
    roll = rng.random()
    if roll < 0.70:
        return "publish", json.dumps({
            "id": k, "symbol": "ACME", "side": "buy" if n % 2 else "sell", "qty": n % 1000,
            "price": 100.0 + n % 97 / 10, "trader": f"trader-{n % 50:04d}", "desk": "equities-nyc",
            "account": {"id": f"ACC-{n % 10007:06d}", "region": "nyc"}, "note": "benchmark order flow, ~200 B",
        }, separators=(",", ":")).encode(), []
    if roll < 0.95:
        return "delta_publish", json.dumps({"id": k, "qty": n % 1000, "account": {"region": "ldn"},
                                            "fills": [n % 7, n % 11]}, separators=(",", ":")).encode(), []
    if n % 5000 == 0:  # a rare filter delete: it reads every record of the topic
        return "sow_delete", b"", [("amps-filter", f"/qty = {n % 1000} AND /side = 'sell'".encode())]
    if roll < 0.975:
        return "sow_delete", b"", [("amps-sow-keys", f"{k},{rng.randrange(keys)}".encode())]
    return "sow_delete", json.dumps({"id": k}).encode(), []


def _publish_share(bootstrap: str, topic: str, client: str, partition: int, count: int, keys: int, seed: int) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, **BULK_PRODUCER, **kafka_client_kwargs())
    rng = random.Random(seed)
    name = client.encode()
    for seq in range(1, count + 1):
        command, body, extra = message(rng, seq, keys)
        headers = [("amps-client", name), ("amps-seq", str(seq).encode()), ("amps-topic", b"/orders"),
                   ("amps-command", command.encode()), *extra]
        producer.send(topic, key=name, value=body, partition=partition, headers=headers)
    producer.flush()
    producer.close()


def prepublish(bootstrap: str, topic: str, messages: int, keys: int, publishers: int, partitions: int) -> None:
    from replication.connectors.kafka.broker import ensure_topics

    ensure_topics(bootstrap, [topic], partitions=partitions, security=kafka_security())
    ctx = multiprocessing.get_context("spawn")
    share = messages // publishers
    procs = [ctx.Process(target=_publish_share, args=(bootstrap, topic, f"pub-{p}", p % partitions, share, keys, p))
             for p in range(publishers)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    if any(proc.exitcode for proc in procs):
        raise SystemExit("a publishing process failed")


def write_config(workdir: Path, name: str, bootstrap: str, topic: str, *, sow: bool) -> Path:
    from replication.config.security import security_xml

    path = workdir / f"{name}.xml"
    path.write_text(f"""<AMPSConfig><Name>{name}</Name><Storage>{workdir / name}</Storage>
  <Transports><Transport><Name>k</Name><Type>kafka</Type><InetAddr>{bootstrap}</InetAddr><Topic>{topic}</Topic>
    <MessageType>json</MessageType>{security_xml(kafka_security())}</Transport></Transports>
  <TransactionLog><Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
  {SOW if sow else ""}</AMPSConfig>""")
    return path


# -- 1. throughput ------------------------------------------------------------------------


@dataclass
class Pass:
    label: str
    rows: int
    seconds: float
    cpu: float
    records: int | None = None

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


def ingest_pass(spark, workdir: Path, bootstrap: str, topic: str, messages: int, *, sow: bool) -> Pass:
    from replication import config
    from replication.instance import Instance

    name = f"{'sow' if sow else 'plain'}-{uuid.uuid4().hex[:6]}"
    inst = Instance(config.load(str(write_config(workdir, name, bootstrap, topic, sow=sow))), spark).start()
    started, cpu = time.perf_counter(), tree_cpu_seconds()
    try:
        # without a SOW topic the sow_deletes are refused (rejected/); either way every message is handled
        def handled() -> bool:
            status = inst.status()
            return status.max_seq + status.counters.get("rejected", 0) >= messages or bool(status.error)

        wait_until(handled, timeout=600 + messages / 1000, interval=0.05,
                   what=f"{name} to ingest {messages:,} messages")
        seconds, cpu = time.perf_counter() - started, tree_cpu_seconds() - cpu
        if inst.status().error:
            raise SystemExit(f"{name}: {inst.status().error}")
        records = inst.sow.count() if inst.sow is not None else None
    finally:
        inst.stop()
    rejected = inst.status().counters.get("rejected", 0)
    if rejected and sow:
        raise SystemExit(f"{name}: {rejected} messages rejected")
    return Pass("with SOW" if sow else "without SOW", messages, seconds, cpu, records)


def throughput(spark, workdir: Path, bootstrap: str, args) -> list[str]:
    topic = f"bench-sow-{uuid.uuid4().hex[:6]}"
    t0 = time.perf_counter()
    prepublish(bootstrap, topic, args.messages, args.keys, args.publishers, args.partitions)
    out = [f"pre-published {args.messages:,} messages over {args.keys:,} keys in {time.perf_counter() - t0:.1f} s"]
    warm = f"bench-sow-warm-{uuid.uuid4().hex[:6]}"
    prepublish(bootstrap, warm, 40_000, 4_000, args.publishers, args.partitions)
    for sow in (True, False):  # the first passes of a JVM are slower: neither contender measures them
        ingest_pass(spark, workdir, bootstrap, warm, 40_000, sow=sow)
    best: dict[bool, Pass] = {}
    for round_ in range(args.repeat):
        for sow in (True, False) if round_ % 2 == 0 else (False, True):
            run = ingest_pass(spark, workdir, bootstrap, topic, args.messages, sow=sow)
            if sow not in best or run.seconds < best[sow].seconds:
                best[sow] = run
    rows = [(p.label, f"{p.rate:,.0f}", f"{p.seconds:.1f}", f"{p.cpu:.1f}", f"{p.records:,}" if p.records else "")
            for p in (best[True], best[False])]
    out.append(format_table(["ingest", "rows/s", "seconds", "CPU s", "SOW records"], rows))
    out.append(f"with SOW / without: {best[True].rate / best[False].rate:.2f} (target >= 0.6, aim 0.8); "
               f"CPU: {best[False].cpu / best[True].cpu:.2f}")
    return out


# -- 2. one batch at two SOW sizes ---------------------------------------------------------


def candidate_batch(count: int, keys: int, seed: int, first_seq: int):
    """A 100k-message ingest batch as the writer sees it (candidate rows), from one publisher."""
    import pyarrow as pa

    from replication.ingest.classify import CANDIDATE_SCHEMA

    rng = random.Random(seed)
    cols: dict[str, list] = {name: [] for name in CANDIDATE_SCHEMA.names}
    now = datetime.now(timezone.utc)
    for n in range(count):
        command, body, extra = message(rng, n, keys)
        headers = dict((k, v.decode()) for k, v in extra)
        row = {name: None for name in CANDIDATE_SCHEMA.names}
        row.update(source="kafka", publisher="batch", publisher_seq=str(first_seq + n), topic="/orders",
                   message_type="json", command=command, data=body, publish_time=now,
                   sow_keys=headers.get("amps-sow-keys"), filter=headers.get("amps-filter"))
        for name in cols:
            cols[name].append(row[name])
    return pa.table(cols, schema=CANDIDATE_SCHEMA)


def filled_state(cfg, records: int):
    """A SOW state holding ``records`` orders (as the instance would after ingesting them)."""
    from replication.sow.keys import SowTopics
    from replication.sow.state import SowState

    state = SowState(SowTopics.of(cfg))
    body = b'{"id":0,"symbol":"ACME","side":"buy","qty":1,"price":100.0,"account":{"id":"ACC-1","region":"nyc"}}'
    state.records[0]["/orders"] = {str(k): body for k in range(records)}
    state.applied_seq = records
    return state


def batch_cost(spark, workdir: Path, bootstrap: str, args) -> list[str]:
    from replication import config
    from replication.ingest.classify import TopicRecorder, classify
    from replication.txlog.publishers import PublisherState

    cfg = config.load(str(write_config(workdir, "batch", bootstrap, "unused", sow=True)))
    rows = []
    costs = {}
    for size in (args.batch_keys, 10 * args.batch_keys):
        state = filled_state(cfg, size)
        batch = candidate_batch(args.batch, size, 42, first_seq=1)
        publishers = PublisherState(max_seq=size)
        recorded = TopicRecorder(cfg)
        best_with, best_without = float("inf"), float("inf")
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            plain = classify(batch, publishers, instance="batch", recorded=recorded)
            best_without = min(best_without, time.perf_counter() - t0)
            t0 = time.perf_counter()
            result = classify(batch, publishers, instance="batch", recorded=recorded, sow=state)
            changes = result.sow
            best_with = min(best_with, time.perf_counter() - t0)
        t0 = time.perf_counter()
        state.apply(changes)  # once: applying again would see the batch's own changes
        apply_s = time.perf_counter() - t0
        assert plain.rejected_rows.num_rows + plain.txlog_rows.num_rows == result.txlog_rows.num_rows
        costs[size] = best_with - best_without + apply_s
        rows.append((f"{size:,}", f"{best_without * 1000:.0f}", f"{best_with * 1000:.0f}", f"{apply_s * 1000:.0f}",
                     f"{costs[size] * 1000:.0f}"))
    out = [f"one {args.batch:,}-message batch (best of {args.rounds}):",
           format_table(["SOW records", "classify ms", "classify+SOW ms", "apply ms", "SOW cost ms"], rows),
           f"SOW cost, {10 * args.batch_keys:,} / {args.batch_keys:,} records: "
           f"{costs[10 * args.batch_keys] / costs[args.batch_keys]:.2f} (target <= 1.3)"]
    out += compaction_cost(workdir, cfg, args)
    return out


def compaction_cost(workdir: Path, cfg, args) -> list[str]:
    """The compaction of one batch's changes (``--batch`` // 4 updated keys) into a SOW table of each size,
    through the engine's own path: txlog tail -> net changes -> the buckets touched rewritten."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from replication.sow.keys import SowTopics
    from replication.sow.table import SowTable, as_records
    from replication.storage.layout import StorageLayout
    from replication.txlog.files import TxlogFiles
    from replication.txlog.schema import TXLOG_SCHEMA

    body = b'{"id":0,"symbol":"ACME","side":"buy","qty":1,"price":100.0,"account":{"id":"ACC-1","region":"nyc"}}'
    now = datetime.now(timezone.utc)

    def rows(keys: list[int], first_seq: int) -> pa.Table:
        n = len(keys)
        return pa.table({
            "seq": pa.array(range(first_seq, first_seq + n), pa.int64()), "bookmark": [f"1|{s}|" for s in range(n)],
            "publisher": ["p"] * n, "publisher_seq": pa.array(range(first_seq, first_seq + n), pa.int64()),
            "topic": ["/orders"] * n, "message_type": ["json"] * n, "command": ["publish"] * n,
            "sow_key": [str(k) for k in keys], "sow_keys": pa.nulls(n, pa.string()), "filter": pa.nulls(n, pa.string()),
            "data": [body] * n, "origin": ["o"] * n, "received_from": pa.nulls(n, pa.string()),
            "received_from_group": pa.nulls(n, pa.string()), "path": [["o"]] * n, "publish_time": [now] * n,
            "persist_time": [now] * n,
        }).cast(TXLOG_SCHEMA)

    out = []
    for size in (args.batch_keys, 10 * args.batch_keys):
        layout = StorageLayout(workdir / f"compaction-{size}")
        table = SowTable(layout, cfg.sow_topics[0], start_seq=size)  # the base holds seqs 1..size
        write_deltalake(table.table, as_records(rows(list(range(size)), 1), table.buckets), mode="append")
        changed = random.Random(1).sample(range(size), args.batch // 4)
        write_deltalake(str(layout.txlog), rows(changed, size + 1), mode="append")
        txlog = TxlogFiles(str(layout.txlog))
        t0 = time.perf_counter()
        table.compact(txlog, SowTopics.of(cfg), 0, size + len(changed))
        out.append((f"{size:,}", f"{len(changed):,}", f"{time.perf_counter() - t0:.2f}"))
    return ["a compaction of one batch's changes (random keys touch every bucket, so it rewrites the table; it runs "
            "every <CompactionInterval>, not per batch):",
            format_table(["SOW records", "keys changed", "seconds"], out)]


# -- 3. latency --------------------------------------------------------------------------


def poll_visible(config_path: str, total: int, seconds: float, out: str) -> None:
    """(Own process, as ``replication sow`` runs beside an instance.) Read records 1..``total`` of ``/orders``
    as they become visible, the way ``replication sow --key`` reads; write when each was first seen to ``out``."""
    from replication import config
    from replication.sow.table import read_current

    cfg = config.load(config_path)
    visible: dict[int, float] = {}
    following, polls = 1, 0
    deadline = time.monotonic() + seconds
    while following <= total and time.monotonic() < deadline:
        # a window wider than a poll's worth of publishing, so the poller never falls behind the rate
        wanted = [str(i) for i in range(following, min(total, following + 5000) + 1)]
        records = read_current(cfg, "/orders", keys=wanted)
        polls += 1
        seen = time.time()
        for key in records["sow_key"].to_pylist():
            visible.setdefault(int(key), seen)
        while following in visible:
            following += 1
    Path(out).write_text(json.dumps({"visible": list(visible.items()), "polls": polls}))


def latency(spark, workdir: Path, bootstrap: str, args) -> list[str]:
    from replication import config
    from replication.instance import Instance

    name = f"lat-{uuid.uuid4().hex[:6]}"
    topic = f"{name}.publish"
    from replication.connectors.kafka.broker import ensure_topics

    ensure_topics(bootstrap, [topic], security=kafka_security())
    config_path = write_config(workdir, name, bootstrap, topic, sow=True)
    inst = Instance(config.load(str(config_path)), spark).start()
    out_file, seen_file = workdir / f"{name}-sent.json", workdir / f"{name}-seen.json"
    ctx = multiprocessing.get_context("spawn")
    total = int(args.rate * args.seconds)
    publisher = ctx.Process(target=steady_publisher, args=(bootstrap, topic, name, args.rate, args.seconds,
                                                             str(workdir / f"{name}.store"), str(out_file)))
    poller = ctx.Process(target=poll_visible, args=(str(config_path), total, args.seconds + 120, str(seen_file)))
    try:
        poller.start()
        publisher.start()
        publisher.join(timeout=args.seconds + 180)
        poller.join(timeout=180)
    finally:
        inst.stop()
    if poller.exitcode != 0 or publisher.exitcode != 0:
        raise SystemExit(f"latency: the poller exited {poller.exitcode}, the publisher {publisher.exitcode}")
    sent = dict(json.loads(out_file.read_text())["sent"])
    seen = json.loads(seen_file.read_text())
    visible = dict(seen["visible"])
    lat = [(visible[seq] - sent[seq]) * 1000 for seq in sent if seq in visible]  # order_body(seq) has id == seq
    return [f"publish -> visible in `replication sow` at {args.rate:,.0f} msg/s for {args.seconds:.0f} s "
            f"({len(lat):,} records, {seen['polls']:,} reads by another process): p50 "
            f"{percentile(lat, 50):.0f} ms, p99 {percentile(lat, 99):.0f} ms (target p50 <= 500 ms)"]


def query(spark, workdir: Path, bootstrap: str, args) -> list[str]:
    """``replication sow`` on a SOW of ``args.query_records`` records: the table plus 1,000 txlog rows after it."""
    import subprocess

    import pyarrow as pa
    from deltalake import write_deltalake

    from replication import config
    from replication.sow.table import SowTable, as_records
    from replication.storage.layout import StorageLayout
    from replication.txlog.schema import TXLOG_SCHEMA

    size, tail = args.query_records, 1000
    path = write_config(workdir, "query", bootstrap, "unused", sow=True)
    cfg = config.load(str(path))
    layout = StorageLayout.of(cfg.storage)
    table = SowTable(layout, cfg.sow_topics[0], start_seq=size)
    now = datetime.now(timezone.utc)
    rng = random.Random(9)

    def rows(first: int, keys: list[int]) -> pa.Table:
        n = len(keys)
        bodies = [json.dumps({"id": k, "symbol": "ACME", "side": "buy" if k % 2 else "sell", "qty": (k + first) % 1000,
                              "price": 100.0 + k % 97 / 10, "trader": f"trader-{k % 50:04d}", "desk": "equities-nyc",
                              "account": {"id": f"ACC-{k % 10007:06d}", "region": "nyc"}}).encode() for k in keys]
        return pa.table({
            "seq": pa.array(range(first, first + n), pa.int64()),
            "bookmark": [f"1|{s}|" for s in range(first, first + n)],
            "publisher": ["p"] * n, "publisher_seq": pa.array(range(first, first + n), pa.int64()),
            "topic": ["/orders"] * n, "message_type": ["json"] * n, "command": ["publish"] * n,
            "sow_key": [str(k) for k in keys], "sow_keys": pa.nulls(n, pa.string()), "filter": pa.nulls(n, pa.string()),
            "data": bodies, "origin": ["o"] * n, "received_from": pa.nulls(n, pa.string()),
            "received_from_group": pa.nulls(n, pa.string()), "path": [["o"]] * n, "publish_time": [now] * n,
            "persist_time": [now] * n,
        }).cast(TXLOG_SCHEMA)

    for first in range(1, size + 1, 200_000):
        write_deltalake(table.table, as_records(rows(first, list(range(first - 1, min(size, first + 199_999)))),
                                                table.buckets), mode="append")
    write_deltalake(str(layout.txlog), rows(size + 1, rng.sample(range(size), tail)), mode="append")
    out = []
    for label, extra in (("one key", ["--key", "77"]), ("filter /qty = 7", ["--filter", "/qty = 7"]),
                         ("every record", [])):
        cmd = [sys.executable, "-m", "replication.cli", "sow", str(path), "--topic", "/orders", *extra]
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        first_line = proc.stdout.readline()
        first_at = time.perf_counter() - started
        count = 1 + sum(1 for _ in proc.stdout) if first_line else 0
        proc.wait()
        out.append((label, f"{count:,}", f"{first_at:.2f}", f"{time.perf_counter() - started:.2f}"))
    return [f"`replication sow` on {size:,} records (+{tail:,} txlog rows after the table), a new process each:",
            format_table(["query", "records out", "first out s", "all out s"], out)]


def measure(spark, workdir: Path, bootstrap: str, args) -> str:
    report = [f"bench/sow.py: {args.messages:,} messages over {args.keys:,} keys (70% publish, 25% delta_publish, "
              f"5% sow_delete)"]
    only = set(args.only.split(","))
    for phase, fn in (("throughput", throughput), ("batch", batch_cost), ("latency", latency), ("query", query)):
        if phase in only:
            report += ["", f"== {phase}"] + fn(spark, workdir, bootstrap, args)
    return "\n".join(report)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--messages", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="200k messages over 20k keys, 10 s of latency")
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1, help="throughput passes in turn; the best of each kept")
    parser.add_argument("--batch", type=int, default=100_000, help="messages in the measured batch")
    parser.add_argument("--batch-keys", type=int, default=100_000, help="the smaller SOW size (the larger is 10x)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--query-records", type=int, default=1_000_000)
    parser.add_argument("--only", default=",".join(PHASES))
    add_kafka_arguments(parser)
    parser.add_argument("--workdir")
    args = parser.parse_args(argv)
    use_kafka_security(parser, args)
    if args.quick:
        args.messages, args.keys, args.seconds = 200_000, 20_000, 10.0
    args.conf = []
    run_benchmark("sow", args, measure)


if __name__ == "__main__":
    main()
