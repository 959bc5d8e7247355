"""Benchmark: queue deliveries against the same instance's plain ingest rate, side by side in one run.

1. ingest: N ~200-byte JSON messages pre-published by raw producers; an instance with no queue stores them
   in micro-batches of N/10; rows/s from its first commit to its last;
2. deliveries: the same N pre-published for an instance with an at-least-once queue on ``/orders``, four
   ``QueueConsumer`` processes (``max_backlog`` 1,000, each acknowledging what it takes); deliveries/s from
   the first delivery to the last, every message delivered once. Target: >= 0.5 x ingest. CPU by process
   over the same window (sampled every 0.2 s), as cores in use and as CPU-ms per 1,000 deliveries: where
   the two shared cores went;
3. latency: a ``Publisher`` in its own process publishes at 2,000 msg/s for ``--seconds`` to the queue
   instance while the four consumers take and acknowledge; publish -> delivered (wall clocks of one
   machine). Target: p50 <= 500 ms.

Best of ``--passes`` (default 2) for each rate::

    .venv/bin/python bench/queues.py --quick      # 20k messages, 8 s of latency
    .venv/bin/python bench/queues.py              # 100k messages, 15 s of latency
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import NamedTuple

os.environ.setdefault("REPLICATION_SPARK_LOG_LEVEL", "ERROR")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    STEADY_CLIENT,
    add_kafka_arguments,
    feeds,
    format_table,
    percentile,
    prepublish,
    run_benchmark,
    steady_publisher,
    use_kafka_security,
    wait_until,
    write_instance_config,
)
from replication_probes import DRIVER, PUBLISHER, cpu_by_kind  # noqa: E402

CONSUMERS = 4
CONSUMERS_KIND = f"{CONSUMERS} consumer processes"
BACKLOG = 1000
QUEUE = ("<SOW><Queue><Name>/work</Name><MessageType>json</MessageType><UnderlyingTopic>/orders</UnderlyingTopic>"
         "<Semantics>at-least-once</Semantics><LeasePeriod>60s</LeasePeriod></Queue></SOW>")


def consume(bootstrap: str, topic: str, instance: str, name: str, out: str, idle: float) -> None:
    """(Own process.) Take and acknowledge deliveries until none comes for ``idle`` seconds (after the first);
    write ``[[message id, received at], ...]`` to ``out``."""
    from replication.client import QueueConsumer

    got: list[tuple[int, float]] = []
    with QueueConsumer(name, bootstrap=bootstrap, topic=topic, instance=instance, queue="/work",
                       max_backlog=BACKLOG) as consumer:
        Path(out + ".ready").write_text("")
        first = consumer.receive(timeout=600)
        while first is not None:
            got.append((json.loads(first.data)["id"], time.time()))
            first.ack()
            first = consumer.receive(timeout=idle)
        consumer.flush(timeout=120)
    Path(out).write_text(json.dumps(got))


def start_consumers(bootstrap: str, topic: str, instance: str, workdir: Path, idle: float) -> list:
    ctx = multiprocessing.get_context("spawn")
    procs = []
    for k in range(CONSUMERS):
        out = str(workdir / f"{instance}-c{k}.json")
        proc = ctx.Process(target=consume, args=(bootstrap, topic, instance, f"c{k}-{instance}", out, idle))
        proc.start()
        procs.append((proc, out))
    wait_until(lambda: all(Path(out + ".ready").exists() for _, out in procs), timeout=120, what="consumers")
    return procs


def collect(procs: list) -> list[tuple[int, float]]:
    got = []
    for proc, out in procs:
        proc.join(900)
        if proc.exitcode:
            raise SystemExit(f"a consumer failed (exit code {proc.exitcode})")
        got.extend(tuple(x) for x in json.loads(Path(out).read_text()))
    return got


def ingest_rate(spark, workdir: Path, bootstrap: str, n: int) -> float:
    """Rows/s of an instance with no queue, from its first commit to its last, in micro-batches of a tenth of
    the messages (its steady rate: the start of its query is not counted, as the deliveries' is not)."""
    from replication import config
    from replication.instance import Instance

    name = f"plain-{uuid.uuid4().hex[:6]}"
    cfg = config.load(str(write_instance_config(workdir, name, bootstrap, inbox=False, max_offsets=n // 10)))
    prepublish(bootstrap, f"{name}.publish", feeds(n, 4, 1))
    inst = Instance(cfg, spark).start()
    try:
        first = wait_until(lambda: inst.writer.state.max_seq and (inst.writer.state.max_seq, time.time()),
                           timeout=300, interval=0.005, what="first commit")
        wait_until(lambda: inst.writer.state.max_seq >= n, timeout=600, interval=0.005, what="ingest")
        return (n - first[0]) / (time.time() - first[1])
    finally:
        inst.stop()


class Deliveries(NamedTuple):
    rate: float
    """Deliveries/s, first delivery to last."""
    cpu: dict[str, float]
    """CPU seconds by process kind from the first delivery to the last (from samples every 0.2 s)."""
    seconds: float
    """Wall seconds between those samples."""
    count: int
    """Deliveries in that window."""


def delivery_rate(spark, workdir: Path, bootstrap: str, n: int) -> Deliveries:
    """Deliveries/s of a queue instance with four consumers, first delivery to last; each message once."""
    from replication import config
    from replication.instance import Instance

    name = f"queue-{uuid.uuid4().hex[:6]}"
    path = write_instance_config(workdir, name, bootstrap, inbox=False)
    path.write_text(path.read_text().replace("</TransactionLog>", "</TransactionLog>" + QUEUE))
    prepublish(bootstrap, f"{name}.publish", feeds(n, 4, 1))
    inst = Instance(config.load(str(path)), spark).start()
    try:
        with CpuSampler() as samples:
            got = collect(start_consumers(bootstrap, f"{name}.publish", name, workdir, idle=5.0))
    finally:
        inst.stop()
    ids = sorted(i for i, _ in got)
    expected = sorted(i for feed in feeds(n, 4, 1) for i in range(feed.first_seq, feed.first_seq + feed.count))
    if ids != expected:
        raise SystemExit(f"deliveries: {len(ids)} for {n} messages ({len(set(ids))} distinct)")
    times = sorted(t for _, t in got)
    cpu, seconds, count = samples.between(times)
    return Deliveries((len(times) - 1) / max(times[-1] - times[0], 1e-9), cpu, seconds, count)


class CpuSampler:
    """CPU seconds by process kind every 0.2 s on a thread, so the delivery window alone can be measured
    (the phase around it starts the instance's query and the consumers, and waits for the last of them)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, dict[str, float], float]] = []
        """(wall time, CPU seconds by kind, CPU seconds of this sampling so far)"""
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            # (reading /proc for every process is ~0.05 cores of this process: kept out of the driver's figure)
            self.samples.append((time.time(), cpu_by_kind(), time.thread_time()))
            if self._done.wait(0.2):
                return

    def between(self, times: list[float]) -> tuple[dict[str, float], float, int]:
        """CPU by kind from the last sample at or before ``times[0]`` to the first at or after ``times[-1]``,
        the seconds between them, and how many of ``times`` fall inside."""
        start = max((s for s in self.samples if s[0] <= times[0]), key=lambda s: s[0], default=self.samples[0])
        end = min((s for s in self.samples if s[0] >= times[-1]), key=lambda s: s[0], default=self.samples[-1])
        cpu = {kind: end[1].get(kind, 0.0) - start[1].get(kind, 0.0) for kind in end[1]}
        cpu[DRIVER] = cpu.get(DRIVER, 0.0) - (end[2] - start[2])
        # the consumers are this process's children: while they run, their kind is "publisher process"
        cpu = {CONSUMERS_KIND if kind == PUBLISHER else kind: spent for kind, spent in cpu.items() if spent > 0.005}
        return cpu, end[0] - start[0], sum(start[0] <= t <= end[0] for t in times)


def cpu_table(run: Deliveries) -> str:
    """Where the cores went while the queue delivered, first delivery to last."""
    kinds = sorted(run.cpu, key=lambda kind: -run.cpu[kind])
    rows = [[kind, f"{run.cpu[kind] / run.seconds:.2f}", f"{1000 * 1000 * run.cpu[kind] / run.count:,.0f}"]
            for kind in kinds]
    total = sum(run.cpu.values())
    rows.append(["total", f"{total / run.seconds:.2f}", f"{1000 * 1000 * total / run.count:,.0f}"])
    return format_table([f"deliveries ({run.seconds:.0f} s), by process", "cores", "CPU-ms per 1k"], rows)


def latency(spark, workdir: Path, bootstrap: str, seconds: float, rate: float) -> dict:
    """Publish -> delivered at ``rate`` msg/s through a queue instance with four consumers."""
    from replication import config
    from replication.instance import Instance

    name = f"lat-{uuid.uuid4().hex[:6]}"
    path = write_instance_config(workdir, name, bootstrap, inbox=False)
    path.write_text(path.read_text().replace("</TransactionLog>", "</TransactionLog>" + QUEUE))
    inst = Instance(config.load(str(path)), spark).start()
    try:
        procs = start_consumers(bootstrap, f"{name}.publish", name, workdir, idle=5.0)
        out = workdir / f"{name}-pub.json"
        ctx = multiprocessing.get_context("spawn")
        pub = ctx.Process(target=steady_publisher, args=(bootstrap, f"{name}.publish", name, rate, seconds,
                                                         str(workdir / f"{name}.store"), str(out)))
        pub.start()
        pub.join(600)
        got = collect(procs)
    finally:
        inst.stop()
    sent = {seq: t for seq, t in json.loads(out.read_text())["sent"]}
    delays = [(t - sent[i]) * 1000 for i, t in got if i in sent]
    return {"messages": len(delays), "p50": percentile(delays, 50), "p99": percentile(delays, 99),
            "client": STEADY_CLIENT}


def measure(spark, workdir: Path, bootstrap: str, args) -> str:
    if args.only == "deliveries":  # (for a profiler: the delivery phase alone)
        run = delivery_rate(spark, workdir, bootstrap, args.messages)
        return f"deliveries: {run.rate:,.0f} msg/s\n" + cpu_table(run)
    ingest = max(ingest_rate(spark, workdir, bootstrap, args.messages) for _ in range(args.passes))
    best = max((delivery_rate(spark, workdir, bootstrap, args.messages) for _ in range(args.passes)),
               key=lambda run: run.rate)
    deliveries = best.rate
    lat = latency(spark, workdir, bootstrap, args.seconds, args.rate)
    rows = [["plain ingest (rows/s)", f"{ingest:,.0f}", "", ""],
            [f"queue deliveries, {CONSUMERS} consumers (msg/s)", f"{deliveries:,.0f}",
             f"{deliveries / ingest:.2f}x ingest", "target >= 0.5x"],
            [f"publish -> delivered p50 at {args.rate:,.0f} msg/s (ms)", f"{lat['p50']:.0f}", "",
             "target <= 500"],
            [f"publish -> delivered p99 at {args.rate:,.0f} msg/s (ms)", f"{lat['p99']:.0f}", "", ""]]
    return (f"bench/queues.py: {args.messages:,} messages, best of {args.passes} passes; latency over "
            f"{lat['messages']:,} messages\n" + format_table(["measure", "value", "ratio", "target"], rows)
            + "\n\n" + cpu_table(best))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=15.0, help="latency phase length")
    parser.add_argument("--rate", type=float, default=2000.0, help="latency phase publish rate (msg/s)")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="20k messages, 8 s of latency")
    parser.add_argument("--only", choices=("deliveries",), help="run one phase (e.g. under py-spy)")
    parser.add_argument("--workdir")
    add_kafka_arguments(parser)
    args = parser.parse_args(argv)
    use_kafka_security(parser, args)
    if args.quick:
        args.messages, args.seconds = 20_000, 8.0
    run_benchmark("queue", args, measure)


if __name__ == "__main__":
    main()
