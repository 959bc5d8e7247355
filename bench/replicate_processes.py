"""Benchmark: A -> B replication with each instance its own process, against A alone (issue 40, target 2).

``bench/replicate.py`` runs both instances of the pair in one Spark
application: one JVM and one Python driver, whose GIL the ingest of A, the
replicator and the ingest of B share. Users run one ``replication run`` per
instance. Here each instance is its own process (``python -m replication.cli
run``, ``local[2]``, as ``bench/cluster.py`` starts them), on the same
machine, in turn, each pass on fresh storage and reading the same
pre-published topic (``--messages``, 2 partitions, 4 publishers, zstd) from
its start:

- *ingest only*: A alone, no destination;
- *A -> B (sync)*: B started first and left idle until its heartbeat, as a
  running fabric has it; then A with one sync destination B (PassThrough
  ``.*``, every topic).

The rate is taken from the txlogs, as a user would see it: the rows after
A's first commit (200k) over the time from that commit to the last commit
of the last txlog (A's alone; B's in the pair, so the replication's tail is
in it), by ``persist_time``; start-up is not. CPU is the instances' process
trees over the same span, per instance and process (Python driver, JVM).
(Two machines cannot be emulated by stopping B while A runs: A replicates
only to a destination whose heartbeat is fresh.)

``--core-each`` gives each instance one core of its own, as if each had its
machine: A on core 0 in both contenders, B on core 1 (``sched_setaffinity``;
the JVM and Python workers inherit it; the broker is not pinned). Then the
question is the one two machines answer: does replicating slow A, and does B
keep up::

    .venv/bin/python bench/replicate_processes.py --repeat 4     # 1M messages, ~8 minutes
    .venv/bin/python bench/replicate_processes.py --repeat 2 --core-each
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import format_table, prepublished_broker, wait_until  # noqa: E402
from instance_processes import first_commit, persist_times, start_instance, stop_instance, stored_rows  # noqa: E402
from replicate import write_instance  # noqa: E402
from timing import process_tree  # noqa: E402

from replication.config.model import DEFAULT_BATCH_ROWS  # noqa: E402

PARTITIONS = 2
PUBLISHERS = 4
INGEST, PAIR = "ingest only", "A -> B (sync)"
CORES = {"A": 0, "B": 1}  # with --core-each


@dataclass
class Pass:
    label: str
    measured: int  # rows after A's first commit
    seconds: float  # A's first commit -> the last txlog's last commit
    cpu: dict[str, float] = field(default_factory=dict)  # "A driver", "A JVM", "B driver", "B JVM" -> CPU-s

    @property
    def rate(self) -> float:
        return self.measured / self.seconds

    @property
    def per_cpu_s(self) -> float:
        return self.measured / max(sum(self.cpu.values()), 1e-9)


def cpu_by_process(pid: int) -> dict[str, float]:
    """CPU seconds of an instance's process tree: its JVM, and the rest (the Python driver, and Spark's Python
    workers while they run: one the JVM has reaped counts in the JVM's; the ingest starts few)."""
    out = {"driver": 0.0, "JVM": 0.0}
    for proc in process_tree(pid, commands=True).values():
        out["JVM" if proc.command.split(" ")[0].endswith("java") else "driver"] += proc.own + proc.ended
    return out


class Instances:
    """The instance processes of one pass, by role, and their CPU."""

    def __init__(self, label: str, workdir: Path, core_each: bool) -> None:
        self.label, self.workdir, self.core_each = label, workdir, core_each
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, role: str, cfg: Path) -> None:
        cpus = {CORES[role]} if self.core_each else None
        self.procs[role] = start_instance(self.workdir, cfg, cpus=cpus)

    def stop_all(self) -> None:
        """Stop every instance, the last started first (each is stopped even if another's stop fails)."""
        if self.procs:
            _role, proc = self.procs.popitem()
            try:
                stop_instance(proc)
            finally:
                self.stop_all()

    def ended(self) -> bool:
        return any(p.poll() is not None for p in self.procs.values())

    def cpu(self) -> dict[str, float]:
        if self.ended():
            raise SystemExit(f"{self.label}: an instance stopped; see the logs under {self.workdir}")
        return {f"{role} {kind}": s for role, p in self.procs.items() for kind, s in cpu_by_process(p.pid).items()}

    def measure(self, first: Path, done: Callable[[], bool]) -> dict[str, float]:
        """CPU from the first commit to ``first`` until ``done`` (an instance that ends stops the wait)."""
        wait_until(lambda: stored_rows(first) >= 1 or self.ended(), timeout=600, interval=0.1,
                   what=f"{self.label}: a first commit")
        before = self.cpu()
        wait_until(lambda: done() or self.ended(), timeout=1800, interval=0.1, what=f"{self.label}: every row")
        return {k: v - before[k] for k, v in self.cpu().items()}


def run_pass(label: str, workdir: Path, bootstrap: str, topic: str, messages: int, core_each: bool) -> Pass:
    from replication.connectors.kafka.broker import ensure_topics

    tag = uuid.uuid4().hex[:6]
    a, b = f"proc-a-{tag}", f"proc-b-{tag}"
    txlog_a, txlog_b = workdir / a / "txlog", workdir / b / "txlog"
    last = txlog_b if label == PAIR else txlog_a
    instances = Instances(label, workdir, core_each)
    try:
        if label == PAIR:
            ensure_topics(bootstrap, [f"{b}.publish"])
            instances.start("B", write_instance(workdir, b, bootstrap, topic=f"{b}.publish", max_offsets=None))
            wait_until(lambda: (workdir / b / "_control" / "heartbeat.json").exists() or instances.ended(),
                       timeout=600, interval=0.2, what="B to start")
        instances.start("A", write_instance(workdir, a, bootstrap, topic=topic, max_offsets=None,
                                            destination=b if label == PAIR else None))
        cpu = instances.measure(txlog_a, lambda: stored_rows(last) >= messages)
    finally:
        instances.stop_all()
    last_times = persist_times(last)
    if len(last_times) != messages:
        raise SystemExit(f"{label}: {last} holds {len(last_times)} rows, not the {messages} published")
    first, first_rows = first_commit(last_times if last == txlog_a else persist_times(txlog_a))
    seconds = (pc.max(last_times).as_py() - first).total_seconds()
    if seconds <= 0:
        raise SystemExit(f"{label}: every row came in A's first commit; publish more (--messages)")
    return Pass(label, messages - first_rows, seconds, cpu)


def report(args, passes: list[Pass]) -> str:
    best = {label: max((p for p in passes if p.label == label), key=lambda p: p.rate) for label in (INGEST, PAIR)}
    kinds = ["A driver", "A JVM", "B driver", "B JVM"]
    rows = [[p.label, f"{p.measured:,}", f"{p.seconds:.2f}", f"{p.rate:,.0f}",
             *(f"{p.cpu[k]:.1f}" if k in p.cpu else "" for k in kinds), f"{p.per_cpu_s:,.0f}"] for p in passes]
    ingest, pair = best[INGEST], best[PAIR]
    b_cpu = pair.cpu["B driver"] + pair.cpu["B JVM"]
    return "\n".join([
        f"# A -> B replication, one process per instance, against A alone: {args.messages:,} messages, "
        f"{os.cpu_count()} cores, " + ("one core each (A on core 0, B on core 1), " if args.core_each else "")
        + f"best of {args.repeat}",
        "",
        format_table(["pass", "rows", "seconds", "rows/s", *(f"{k} CPU-s" for k in kinds), "rows/CPU-s"], rows),
        "",
        f"replication / ingest only: {pair.rate / ingest.rate:.2f}x rows/s (target >= 0.9), "
        f"{pair.per_cpu_s / ingest.per_cpu_s:.2f}x rows per CPU-second",
        *([f"B used {b_cpu:.1f} CPU-s in {pair.seconds:.1f} s: {b_cpu / pair.seconds:.2f} of its core"]
          if args.core_each else []),
    ])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--messages", type=int, default=1_000_000, help="messages pre-published (1M)")
    parser.add_argument("--repeat", type=int, default=2, help="passes per contender, in turn; the best is kept")
    parser.add_argument("--core-each", action="store_true",
                        help="each instance on one core of its own (A on core 0, B on core 1), as if on its machine")
    parser.add_argument("--workdir", help="keep tables and logs here (default: a temporary directory, removed)")
    args = parser.parse_args(argv)
    if args.messages < 3 * DEFAULT_BATCH_ROWS or args.repeat < 1:
        parser.error(f"--messages must be at least {3 * DEFAULT_BATCH_ROWS} (the rate is taken after the first "
                     "batch) and --repeat at least 1")
    if args.core_each and not set(CORES.values()) <= os.sched_getaffinity(0):
        parser.error(f"--core-each needs cores {sorted(CORES.values())}; this process may use "
                     f"{sorted(os.sched_getaffinity(0))}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    topic = "bench-processes.publish"
    with prepublished_broker(topic, args.messages, publishers=PUBLISHERS, partitions=PARTITIONS,
                             workdir=args.workdir, prefix="bench-replicate-processes-") as (bootstrap, workdir):
        passes = []
        for i in range(args.repeat):
            for label in (INGEST, PAIR) if i % 2 == 0 else (PAIR, INGEST):  # (in turn: neither always goes first)
                passes.append(run_pass(label, workdir, bootstrap, topic, args.messages, args.core_each))
                print(f"{label}: {passes[-1].rate:,.0f} rows/s", file=sys.stderr, flush=True)
                time.sleep(1.0)
        print(report(args, passes), flush=True)


if __name__ == "__main__":
    main()
