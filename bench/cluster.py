"""Benchmark: one instance's ingest on a Spark standalone cluster against the same on ``local[2]`` (issue 40, 5).

Both contenders are instance processes (``replication run``) started alike,
in turn, each on fresh storage, reading the same pre-published topic
(``--messages``, 2 partitions, 4 publishers, zstd) from its start: one with
``local[2]``, one with ``REPLICATION_SPARK_MASTER=spark://...`` on a
cluster of a master and two workers of one core each (separate JVMs, started
here from the installed pyspark). Batches are large (everything waits in
Kafka), so the cluster instance's Kafka reads run as Spark tasks on the
workers' executors; the report counts them from the executors' logs.

The rate is taken from the txlog, as a user would see it: rows stored after
the first commit over the time from the first commit to the last
(``persist_time``; batches of the default 200k rows, so at least three),
so start-up (session, executors) is not in it; the start-up (process start
to the first commit) is reported beside it. CPU is the instance's process
tree and, on the cluster, the workers' trees (their executors), from the
first commit to the last (the batches after the first: start-up's CPU is
not in it)::

    .venv/bin/python bench/cluster.py --quick       # 600k messages, ~3 minutes
    .venv/bin/python bench/cluster.py --repeat 2    # 1M messages, best of 2 per contender
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import format_table, prepublished_broker, wait_until, write_instance_config  # noqa: E402
from instance_processes import first_commit, persist_times, start_instance, stop_instance, stored_rows  # noqa: E402
from timing import tree_cpu_seconds  # noqa: E402

from replication.config.model import DEFAULT_BATCH_ROWS  # noqa: E402

#: Partitions of the topic: one per worker, so each worker's executor reads one.
PARTITIONS = 2
PUBLISHERS = 4


@dataclass
class Result:
    """One contender's pass."""

    label: str
    rows: int  # the txlog's rows
    measured: int  # rows after the first commit: the rate and the CPU cover these
    rate: float  # rows/s from the first commit to the last
    startup_s: float  # process start -> first commit
    instance_cpu_s: float
    executor_cpu_s: float
    worker_tasks: int

    @property
    def per_cpu_s(self) -> float:
        return self.measured / max(self.instance_cpu_s + self.executor_cpu_s, 1e-9)


def commit_rate(txlog: Path) -> tuple[int, int, float, float]:
    """(rows, rows after the first commit, their rows/s, time of the first commit), from ``persist_time``."""
    times = persist_times(txlog)
    first, first_rows = first_commit(times)
    span = (pc.max(times).as_py() - first).total_seconds()
    after_first = len(times) - first_rows
    return len(times), after_first, (after_first / span if span > 0 else float("nan")), first.timestamp()


def executor_tasks(cluster) -> int:
    """Tasks the workers' executors finished, from their logs."""
    logs = [p for w in range(cluster.workers) for p in cluster.worker_dir(w).glob("app-*/*/stderr")]
    return sum(len(re.findall(r"Finished task", p.read_text(errors="replace"))) for p in logs)


def run_instance(label: str, workdir: Path, bootstrap: str, topic: str, messages: int, cluster=None) -> Result:
    name = f"{label.split('[')[0].replace(':', '')}{uuid.uuid4().hex[:6]}"
    cfg = write_instance_config(workdir, name, bootstrap, topic=topic, inbox=False)
    worker_pids = cluster.pids[1:] if cluster else []
    workers_before = sum(tree_cpu_seconds(pid) for pid in worker_pids)
    tasks_before = executor_tasks(cluster) if cluster else 0
    started = time.time()
    proc = start_instance(workdir, cfg, cluster.master_url if cluster else "local[2]")
    txlog = workdir / name / "txlog"

    def cpu() -> tuple[float, float]:
        return tree_cpu_seconds(proc.pid), sum(tree_cpu_seconds(pid) for pid in worker_pids) - workers_before

    samples = []  # CPU at the first commit and at the last: what lies between is the ingest's, not start-up's
    try:
        for goal in (1, messages):
            wait_until(lambda goal=goal: stored_rows(txlog) >= goal or proc.poll() is not None, timeout=1800,
                       interval=0.2, what=f"{label} to store {goal} messages")
            if proc.poll() is not None:
                raise SystemExit(f"{label}: the instance stopped (exit {proc.returncode}); see {name}.log")
            samples.append(cpu())
    finally:
        stop_instance(proc)
    rows, measured, rate, first_commit_at = commit_rate(txlog)
    if rows != messages:
        raise SystemExit(f"{label}: the txlog holds {rows} rows, not the {messages} published")
    time.sleep(1.0)  # the executors' logs of this application are flushed as it ends
    tasks = executor_tasks(cluster) - tasks_before if cluster else 0
    (instance_at_first, executors_at_first), (instance_at_last, executors_at_last) = samples
    return Result(label, rows, measured, rate, first_commit_at - started, instance_at_last - instance_at_first,
                  executors_at_last - executors_at_first, tasks)


def report(args, results: list[Result]) -> str:
    best: dict[str, Result] = {}
    for r in results:
        if r.label not in best or r.rate > best[r.label].rate:
            best[r.label] = r
    rows = [[r.label, f"{r.rate:,.0f}", f"{r.startup_s:.1f}", f"{r.instance_cpu_s:.1f}", f"{r.executor_cpu_s:.1f}",
             f"{r.per_cpu_s:,.0f}", r.worker_tasks] for r in results]
    local, cluster = best["local[2]"], best["cluster"]
    lines = [
        f"# Ingest on a Spark standalone cluster (2 workers x 1 core) against local[2], same machine "
        f"({os.cpu_count()} cores), {args.messages:,} messages, best of {args.repeat}",
        "",
        format_table(["pass", "rows/s", "start-up s", "instance CPU-s", "executors CPU-s", "rows/CPU-s",
                      "worker tasks"], rows),
        "",
        f"cluster / local[2]: {cluster.rate / local.rate:.2f}x rows/s, "
        f"{cluster.per_cpu_s / local.per_cpu_s:.2f}x rows per CPU-second",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--messages", type=int, default=None, help="messages pre-published (1M)")
    parser.add_argument("--quick", action="store_true", help="600k messages")
    parser.add_argument("--repeat", type=int, default=1, help="passes per contender, in turn; the best is kept")
    parser.add_argument("--workdir", help="keep tables and logs here (default: a temporary directory, removed)")
    args = parser.parse_args(argv)
    if args.messages is None:
        args.messages = 600_000 if args.quick else 1_000_000
    if args.messages < 3 * DEFAULT_BATCH_ROWS or args.repeat < 1:
        parser.error(f"--messages must be at least {3 * DEFAULT_BATCH_ROWS} (three batches: the rate is taken "
                     "after the first) and --repeat at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    from replication.connectors.spark.cluster import StandaloneCluster

    args = parse_args(argv)
    topic = "bench-cluster.publish"
    with prepublished_broker(topic, args.messages, publishers=PUBLISHERS, partitions=PARTITIONS,
                             workdir=args.workdir, prefix="bench-cluster-") as (bootstrap, workdir):
        results = []
        with StandaloneCluster(workers=2, cores=1, memory="2g", home=workdir / "cluster") as cluster:
            for _ in range(args.repeat):
                for label in ("local[2]", "cluster"):
                    result = run_instance(label, workdir, bootstrap, topic, args.messages,
                                          cluster if label == "cluster" else None)
                    print(f"{label}: {result.rate:,.0f} rows/s", file=sys.stderr, flush=True)
                    results.append(result)
        print(report(args, results), flush=True)


if __name__ == "__main__":
    main()
