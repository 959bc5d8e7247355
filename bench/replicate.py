"""Benchmark: A->B replication against the ingest-only rate of the same instance, side by side.

One run prints (issue 3, "Performance"):

1. throughput: N (default 1M) ~200-byte JSON messages pre-published once by
   raw producers (DESIGN §7 headers, zstd); instance A with no destination
   reads them (ingest only), then a fresh A with one sync destination B reads
   the same topic; the clock runs from A's query start until B's txlog holds
   all N rows. Target: replication >= 0.7 x ingest only. A timeline shows
   when A's txlog, B's inbox, B's txlog and A's view of B's ack were complete;
   MirrorMaker 2 (``bench/mirror_maker.py``) copies the same topic from the
   benchmark's broker to a second broker it starts: what a Kafka user would
   run instead, with its CPU seconds beside the instance's (phase ``mm2``);
   the same pair with signed inbox commits (A's destination has an
   ``<Authenticator>``, B verifies each commit) against the unsigned pair
   (phase ``signed``; target: >= 0.95 x unsigned);
2. latency: a ``replication.client.Publisher`` in its own process publishes
   to A at a steady rate (2,000 msg/s) while A replicates to its sync
   destination B; each message is followed by (client, seq) through every
   step: A's txlog, B's inbox, B's txlog, B's ack file, A reading that ack,
   the persisted ack at the publisher (wall clocks of one machine). The
   first ``--latency-warmup`` seconds (60) of publishing are not measured:
   for about a minute the JVM's JIT is still compiling Spark's per-batch
   planning code and every batch is slower (the report's over-time table
   shows it, warm-up included). Targets: publish -> B's txlog p50 <= 700 ms,
   p99 <= 2 s; publish -> persisted ack p50 <= 1 s (issue 3); issue 40's:
   A's txlog p50 <= 120 ms, B's p50 <= 300 ms, p99 <= 800 ms, ack p50 <= 350 ms.
   Before it, CPU is watched 15 s with the pair not started, then 15 s with
   the started pair idle; after it, 15 s with the pair idle again. The
   target, its own processes (driver, JVM, source runners) <= 0.2 cores, is
   checked on that last watch: just after the start the JIT is still
   compiling the idle poll's code (~0.08 cores of the JVM's compiler
   threads), a one-off a service lives past. The broker's share is shown
   beside them;
3. where the time goes: CPU by process (JVM, Spark's Python source runners
   and workers, driver, broker, publisher), the engine's driver steps per
   instance (ingest at A, replicator batches, ingest at B, ack polling,
   durability release, control files) and Spark's per-query batch figures.

Both instances run in this process's Spark application, as ``replication run
a.xml b.xml`` runs them, with the engine's default trigger (``0 seconds``).
``--trigger``, ``--max-offsets`` and ``--conf`` try other settings. Uses an
Kafka broker of its own (KRaft) unless ``--bootstrap`` is given::

    .venv/bin/python bench/replicate.py --quick        # 100k messages, 10 s of latency, ~3 minutes
    .venv/bin/python bench/replicate.py                # 1M messages, 60 + 30 s of latency, ~6 minutes
    .venv/bin/python bench/replicate.py --quick --only latency --py-spy /tmp/spy
    .venv/bin/python bench/replicate.py --only throughput --max-offsets 100000
    .venv/bin/python bench/replicate.py --repeat 2 --storage local,s3 --only throughput,mm2

``--storage s3`` keeps both instances (storage, inboxes, checkpoints) in a
bucket of the project's local S3 server; ``local,s3`` runs each pair on both,
side by side, and prints each ratio on S3 over the same ratio on local disk.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import secrets
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

os.environ.setdefault("REPLICATION_SPARK_LOG_LEVEL", "ERROR")  # stop() of an idle query logs harmless warnings
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    STEADY_CLIENT,
    add_kafka_arguments,
    add_storage_argument,
    data_batches,
    feeds,
    kafka_security,
    prepublish,
    run_benchmark,
    steady_publisher,
    table_location,
    tables_in,
    use_kafka_security,
    wait_until,
    write_instance_config,
)
from mirror_maker import MirrorRun, mirror  # noqa: E402
from replication_probes import LATENCY_STEPS, Milestones, StageTimer, cpu_by_kind, cpu_since, stage_targets  # noqa: E402
from replication_report import print_memory_reads, report, restarted  # noqa: E402
from timing import PySpy  # noqa: E402

PHASES = ("throughput", "signed", "mm2", "latency")
#: The environment variable the signed run's link key is read from (set by the benchmark).
LINK_KEY_VARIABLE = "BENCH_REPLICATION_LINK_KEY"
#: Seconds the machine is watched with the pair not yet started, then with the started pair and nothing
#: published, before the latency run, and with the pair idle again after it.
IDLE_SECONDS = 15.0
#: Seconds between the end of the latency run and the idle watch after it.
SETTLE_SECONDS = 5.0

#: Destination topics of a one-way link: B does not replicate back, so the
#: checks that expect a symmetric pair are excluded (as in the tests' one-way links).
ONE_WAY_TOPICS = ("<Topic><Name>.*</Name><MessageType>json</MessageType>"
                  "<ExcludeValidation>replicate,cascade</ExcludeValidation></Topic>")


# -- configs -----------------------------------------------------------------------


@dataclass(frozen=True)
class Pair:
    """Config files of one measured setup: instance ``a`` (reads ``topic``) and its destination ``b`` (or none)."""

    a: Path
    b: Path | None
    topic: str


def write_instance(workdir: Path, name: str, bootstrap: str, *, topic: str, max_offsets: int | None,
                   destination: str | None = None, signed: bool = False, upstream: str | None = None) -> Path:
    """An instance config as a fabric member has it: Kafka ingress, an inbox, every JSON topic recorded.

    ``destination``: the name of one downstream instance under ``workdir``,
    replicated to synchronously (everything, one way). ``signed``: that link's
    commits are signed (``<Authenticator>``), or, with ``upstream``, this
    instance takes only commits signed by it (``<Authentication>``).
    """
    replication = inbox_auth = ""
    key = f"<Key>${{{LINK_KEY_VARIABLE}}}</Key>"
    if destination:
        authenticator = f"<Authenticator><Module>replication-hmac-authenticator</Module>{key}</Authenticator>" \
            if signed else ""
        replication = (
            f"<Replication><Destination><Name>{destination}</Name><SyncType>sync</SyncType>"
            f"<PassThrough>.*</PassThrough>{ONE_WAY_TOPICS}<Transport><Type>amps-replication</Type>"
            f"<InetAddr>{table_location(workdir, destination)}</InetAddr>{authenticator}</Transport>"
            "</Destination></Replication>"
        )
    if signed and upstream:
        inbox_auth = (f"<Authentication><Module>replication-hmac-authentication</Module>"
                      f"<Upstream><Name>{upstream}</Name>{key}</Upstream></Authentication>")
    return write_instance_config(workdir, name, bootstrap, topic=topic, max_offsets=max_offsets,
                                 replication=replication, inbox_auth=inbox_auth)


def make_pair(workdir: Path, bootstrap: str, label: str, *, topic: str | None, max_offsets: int | None,
              replicate: bool, timer: StageTimer, signed: bool = False) -> Pair:
    """Configs of A (and B when ``replicate``) with unique names; ``timer`` learns their roles."""
    from replication.connectors.kafka.broker import ensure_topics

    tag = uuid.uuid4().hex[:6]
    a, b = f"{label}-a-{tag}", f"{label}-b-{tag}"
    timer.roles.update({a: "A", b: "B"})
    topic = topic or f"{a}.publish"
    ensure_topics(bootstrap, [topic, f"{b}.publish"], security=kafka_security())
    b_path = write_instance(workdir, b, bootstrap, topic=f"{b}.publish", max_offsets=max_offsets, signed=signed,
                            upstream=a) if replicate else None
    a_path = write_instance(workdir, a, bootstrap, topic=topic, max_offsets=max_offsets,
                            destination=b if replicate else None, signed=signed)
    return Pair(a_path, b_path, topic)


# -- throughput ----------------------------------------------------------------------


@dataclass
class Run:
    """One measured pass over the pre-published messages."""

    label: str
    rows: int
    seconds: float
    marks: dict[str, float] = field(default_factory=dict)
    """Seconds from the query start until each milestone (A's txlog, B's inbox, B's txlog, acks)."""
    stages: dict[str, tuple[float, int]] = field(default_factory=dict)
    """label -> (seconds, calls) of the timed engine steps."""
    queries: dict[str, list[dict]] = field(default_factory=dict)
    """query role -> Spark progress of its batches with rows."""
    restarts: int = 0
    """Ingest queries the engine had to restart during the run (a failed Python worker start...)."""
    cpu_kinds: dict[str, float] = field(default_factory=dict)
    """CPU seconds of the run by process kind (see :func:`cpu_by_kind`)."""

    @property
    def rate(self) -> float:
        return self.rows / self.seconds

    @property
    def cpu_seconds(self) -> float:
        """CPU of every process of the benchmark (driver, JVM, Python workers, broker) during the run."""
        return sum(self.cpu_kinds.values())


def start_instances(spark, pair: Pair, trigger: str) -> tuple:
    """Start B (if any) then A, as an operator would (the downstream first)."""
    from replication import config
    from replication.instance import Instance

    b = Instance(config.load(str(pair.b)), spark, trigger_interval=trigger).start() if pair.b else None
    try:
        a = Instance(config.load(str(pair.a)), spark, trigger_interval=trigger).start()
    except BaseException:
        if b:
            b.stop()
        raise
    return a, b


def wait_until_idle(*instances, settle: float = 2.0) -> None:
    """Wait until every ingest query of ``instances`` has polled its sources and every replicator runs.

    A steady-state measurement must not include the queries' start-up (each
    Python source starts a process that imports PySpark).
    """
    running = [inst for inst in instances if inst is not None]

    def polling(q) -> bool:
        return q is not None and q.isActive and (
            q.lastProgress is not None or q.status.get("message") == "Waiting for data to arrive")

    def replicating(inst) -> bool:
        return all(m.replicator is not None and m.replicator.is_active for m in inst.managers)

    wait_until(lambda: all(polling(inst.query) and replicating(inst) for inst in running), timeout=300,
               interval=0.1, what="every query and replicator to start")
    time.sleep(settle)


def stop_instances(a, b) -> None:
    a.stop()
    if b is not None:
        b.stop()


def restarts(*instances) -> int:
    """Ingest-query restarts so far (the engine restarts a failed query; a measurement with one is suspect)."""
    return sum(inst.restarts for inst in instances if inst is not None)


def positions(a, b) -> dict[str, int]:
    """How far each step has got: rows in A's txlog, sent to B's inbox, in B's txlog, acknowledged by B."""
    out = {"A txlog": a.writer.state.max_seq}
    if b is not None:
        link = next(iter(a.links.values())).snapshot()
        out.update({"B inbox (sent)": link.sent_seq, "B txlog": b.writer.state.max_seq,
                    "B ack seen by A": link.acked_seq})
    return out


def throughput_run(spark, pair: Pair, rows: int, timer: StageTimer, *, label: str, trigger: str,
                   spy: str | None = None) -> Run:
    """Start the instances on the pre-published backlog; time A's query start -> ``rows`` rows in the last txlog.

    The ack of the last row is waited for too (not part of the time), so the
    timeline shows it.
    """
    timer.reset()
    a, b = start_instances(spark, pair, trigger)
    last = "A txlog" if b is None else "B txlog"
    marks: dict[str, float] = {}
    timeout = 120 + rows / 1000
    with PySpy(spy):
        started, cpu_at_start, cpu = time.perf_counter(), cpu_by_kind(), None
        try:
            while True:
                now = time.perf_counter() - started
                reached = positions(a, b)
                for mark, seq in reached.items():
                    if seq >= rows:
                        marks.setdefault(mark, now)
                if last in marks and cpu is None:
                    cpu = cpu_since(cpu_at_start)
                if len(marks) == len(reached) or (last in marks and now > marks[last] + 30):  # acks: 30 s
                    break
                if now > timeout:
                    errors = [inst.status().error for inst in (a, b) if inst is not None]
                    raise SystemExit(f"{label}: timed out after {now:.0f}s at {reached} (query errors: {errors})")
                time.sleep(0.02)
            queries = {"A ingest": a.query}  # now: the engine may have restarted a failed one
            if b is not None:
                queries["B ingest"] = b.query
            queries = {k: q for k, q in queries.items() if q is not None}
            wait_for_progress(queries.values())
        finally:
            stop_instances(a, b)  # lets the current batches finish, so counters and timers are final
    for inst in (a, b):
        if inst is not None:
            counters = inst.status().counters
            if counters.get("rejected") or counters.get("duplicates"):
                raise SystemExit(f"{inst.name}: unexpected rejects/duplicates {counters}")
    print_memory_reads(label, a, b)
    seconds_by, calls_by = timer.snapshot()
    stages = {k: (seconds_by[k], calls_by[k]) for k in seconds_by}
    return Run(label, rows, marks[last], marks, stages, {k: batches_with_rows(q) for k, q in queries.items()},
               restarts(a, b), cpu)


def wait_for_progress(queries, timeout: float = 10.0) -> None:
    """Let each query finish its current batch, so its progress is reported (stopping sooner loses it)."""
    deadline = time.monotonic() + timeout
    for query in queries:
        while query.status.get("isTriggerActive") and time.monotonic() < deadline:
            time.sleep(0.02)


def batches_with_rows(query) -> list[dict]:
    return data_batches(query.recentProgress)


def throughput(spark, workdir: Path, bootstrap: str, args, timer: StageTimer,
               phases: set[str]) -> tuple[dict[str, dict[str, Run]], MirrorRun | None]:
    """Pre-publish once; ingest-only, replication and MirrorMaker 2 read the same topic, ``--repeat`` times in turn
    (the best of each kept); the instances' runs on each ``--storage``, by storage."""
    from replication.connectors.kafka.broker import EmbeddedBroker, ensure_topics

    topic = f"bench-repl-{uuid.uuid4().hex[:6]}.publish"
    ensure_topics(bootstrap, [topic], partitions=args.partitions, security=kafka_security())
    rate = prepublish(bootstrap, topic, feeds(args.messages, args.publishers, args.partitions))
    print(f"published {args.messages:,} messages ({args.publishers} producers, {args.partitions} partitions, "
          f"zstd): {rate:,.0f} msg/s", flush=True)
    best: dict[str, dict[str, Run]] = {kind: {} for kind in args.storage}
    best_mirror: MirrorRun | None = None
    keys = [k for k in ("ingest", "replicate", "signed", "mm2") if k in ("mm2", "signed") and k in phases
            or k in ("ingest", "replicate") and "throughput" in phases]
    target = EmbeddedBroker().start() if "mm2" in keys else None  # MM2's target cluster
    try:
        for rep in range(args.repeat):
            for key in keys[rep % len(keys):] + keys[:rep % len(keys)]:  # each goes first in turn
                if key == "mm2":
                    assert target is not None
                    mirrored = mirror(bootstrap, target.bootstrap, topic, args.messages, args.partitions,
                                      workdir / f"mm2-{rep}", cpu_by_kind=cpu_by_kind,
                                      source_security=kafka_security())
                    target_topic_cleanup(target.bootstrap, topic)
                    print(f"  MirrorMaker 2: {mirrored.rate:,.0f} rows/s in {mirrored.seconds:.1f}s from its start, "
                          f"{mirrored.copy_rate:,.0f} rows/s copying, {mirrored.cpu_seconds:.0f} CPU-s "
                          f"(load average {os.getloadavg()[0]:.1f})", flush=True)
                    if best_mirror is None or mirrored.copy_seconds < best_mirror.copy_seconds:
                        best_mirror = mirrored
                    continue
                for kind in args.storage:  # each storage in turn, side by side
                    with tables_in(kind):
                        pair = make_pair(workdir, bootstrap, f"t{rep}{key[0]}", topic=topic,
                                         max_offsets=args.max_offsets, replicate=key != "ingest", timer=timer,
                                         signed=key == "signed")
                        label = {"ingest": "A ingest only (no destination)", "replicate": "A -> B replication (sync)",
                                 "signed": "A -> B replication (sync, signed commits)"}[key]
                        run = throughput_run(spark, pair, args.messages, timer, label=f"{label} [{kind}]",
                                             trigger=args.trigger, spy=spy_file(args, f"{key}-{kind}"))
                    print(f"  {run.label}: {run.rate:,.0f} rows/s in {run.seconds:.1f}s, {run.cpu_seconds:.0f} "
                          f"CPU-s ({', '.join(f'{k} {v:.1f}s' for k, v in run.marks.items())}; "
                          f"load average {os.getloadavg()[0]:.1f})" + restarted(run.restarts), flush=True)
                    if key not in best[kind] or run.seconds < best[kind][key].seconds:
                        best[kind][key] = run
    finally:
        if target is not None:
            target.close()
    return best, best_mirror


def target_topic_cleanup(bootstrap: str, topic: str) -> None:
    """Delete MM2's copy of ``topic`` and its internal topics on the target, so the next pass copies anew."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        doomed = [t for t in admin.list_topics() if t == topic or t.startswith("mm2-") or ".internal" in t]
        if doomed:
            admin.delete_topics(doomed)
        deadline = time.monotonic() + 60
        while set(doomed) & set(admin.list_topics()) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        admin.close()


# -- latency -------------------------------------------------------------------------


@dataclass
class Latency:
    """The steady-publishing run: per message and step, milliseconds from the publish."""

    ms: dict[str, np.ndarray]
    """Step (:data:`LATENCY_STEPS`) -> one value per message (NaN: never seen)."""
    sent_at: np.ndarray
    """Each message's publish time, seconds (same order as :attr:`ms`)."""
    warmup: float
    """Seconds of publishing at the start that the percentiles leave out."""
    seconds: float
    """From the first publish to the last."""
    wall: float
    """The publisher process's life (logon, publishing, flush): the CPU window."""
    stages: dict[str, tuple[float, int]]
    queries: dict[str, list[dict]]
    cpu_kinds: dict[str, float]
    restarts: int
    idle_cpu_kinds: dict[str, float]
    """CPU by process kind while the started pair waited, with nothing published."""
    idle_seconds: float
    unstarted_cpu_kinds: dict[str, float]
    """CPU by process kind just before the pair started (the broker and Spark's JVM with no query)."""
    unstarted_seconds: float
    settled_cpu_kinds: dict[str, float]
    """CPU by process kind while the pair waited after the run, its JIT warm, with nothing published."""
    settled_seconds: float

    def _after_warmup(self) -> np.ndarray:
        return self.sent_at >= self.sent_at[0] + self.warmup

    def measured(self) -> dict[str, np.ndarray]:
        """:attr:`ms` of the messages published after the warm-up."""
        after = self._after_warmup()
        return {step: values[after] for step, values in self.ms.items()}

    @property
    def count(self) -> int:
        """Messages measured (published after the warm-up)."""
        return int(self._after_warmup().sum())

    @property
    def rate(self) -> float:
        """Achieved publishing rate of the measured messages, msg/s."""
        measured = self.sent_at[self._after_warmup()]
        return len(measured) / float(measured[-1] - measured[0])


def latency(spark, workdir: Path, bootstrap: str, args, timer: StageTimer) -> Latency:
    """Steady publishing to A (sync destination B); per message, wall time from publish to each step."""
    pair = make_pair(workdir, bootstrap, "lat", topic=None, max_offsets=args.max_offsets, replicate=True, timer=timer)
    unstarted_kinds, unstarted_seconds = cpu_while_waiting(IDLE_SECONDS)
    a, b = start_instances(spark, pair, args.trigger)
    wait_until_idle(a, b)
    idle_kinds, idle_seconds = cpu_while_waiting(IDLE_SECONDS)
    marks = Milestones()
    marks.hook(a.writer, "on_commit", after="A txlog commit", seq=lambda last, _result: last)
    marks.hook(b.writer, "on_commit", before="B txlog commit", after="B ack file", seq=lambda last, _result: last)
    link = next(iter(a.links.values()))
    marks.hook(link, "on_sent", after="B inbox commit", seq=lambda _runs, through: through)
    marks.hook(link, "on_ack", after="A reads ack", seq=lambda ack, _runs=(): ack)
    out = workdir / "steady-publisher.json"
    timer.reset()
    try:
        with PySpy(spy_file(args, "latency")):
            proc = multiprocessing.get_context("spawn").Process(
                target=steady_publisher,
                args=(bootstrap, pair.topic, a.name, args.latency_rate, args.latency_warmup + args.latency_seconds,
                      str(workdir / "steady-publisher.store"), str(out), args.linger_ms),
            )
            kinds, started = cpu_by_kind(), time.perf_counter()
            proc.start()
            proc.join(timeout=args.latency_warmup + args.latency_seconds + 300)
            kinds, wall = cpu_since(kinds), time.perf_counter() - started
            if proc.exitcode != 0:
                proc.kill()
                raise SystemExit(f"the steady publisher failed (exit code {proc.exitcode})")
        queries = {k: batches_with_rows(q) for k, q in
                   (("A ingest", a.query), ("B ingest", b.query))
                   if q is not None}
        restart_count = restarts(a, b)
        seconds_by, calls_by = timer.snapshot()  # (the run's steps, not the idle watch's)
        time.sleep(SETTLE_SECONDS)  # the last acks and heartbeats of the run
        settled_kinds, settled_seconds = cpu_while_waiting(IDLE_SECONDS)
    finally:
        stop_instances(a, b)
    print_memory_reads("latency", a, b)
    published = json.loads(out.read_text())
    marks.events["publisher ack"] = [tuple(e) for e in published["acks"]]
    ms, pub_time = follow_messages(marks, published["sent"], a, b)
    stages = {k: (seconds_by[k], calls_by[k]) for k in seconds_by}
    return Latency(ms, pub_time, args.latency_warmup, float(pub_time[-1] - pub_time[0]), wall, stages, queries,
                   kinds, restart_count, idle_kinds, idle_seconds, unstarted_kinds, unstarted_seconds,
                   settled_kinds, settled_seconds)


def cpu_while_waiting(seconds: float) -> tuple[dict[str, float], float]:
    """CPU seconds by process kind over ``seconds`` of this process sleeping, and the seconds measured."""
    before, started = cpu_by_kind(), time.perf_counter()
    time.sleep(seconds)
    return cpu_since(before), time.perf_counter() - started


def follow_messages(marks: Milestones, sent: list, a, b) -> tuple[dict, np.ndarray]:
    """Milliseconds from each publish to each step, and the publish times.

    A message is found at A and B by (client, publisher seq) in their txlogs;
    A's steps are recorded in A's seq space, B's in B's.
    """
    import numpy as np
    import pyarrow.compute as pc

    from replication.connectors.delta.tables import open_table

    sent_at = np.array(sent)
    pub_seq, pub_time = sent_at[:, 0].astype(np.int64), sent_at[:, 1]

    def local_seqs(inst) -> np.ndarray:
        rows = open_table(str(inst.layout.txlog)).to_pyarrow_table(columns=["seq", "publisher", "publisher_seq"])
        mine = rows.filter(pc.equal(rows["publisher"], STEADY_CLIENT))
        by_pub = dict(zip(mine["publisher_seq"].to_pylist(), mine["seq"].to_pylist(), strict=True))
        return np.array([by_pub.get(int(s), -1) for s in pub_seq], dtype=np.int64)

    a_seq, b_seq = local_seqs(a), local_seqs(b)
    if (a_seq < 0).any() or (b_seq < 0).any():
        raise SystemExit(f"latency run: {(a_seq < 0).sum()} messages missing at A, {(b_seq < 0).sum()} at B")
    seqs = {"A txlog commit": a_seq, "B inbox commit": a_seq, "B txlog commit": b_seq, "B ack file": b_seq,
            "A reads ack": a_seq, "publisher ack": pub_seq}
    return {step: (marks.reached(step, seqs[step]) - pub_time) * 1000 for step, _ in LATENCY_STEPS}, pub_time


# -- orchestration ---------------------------------------------------------------------


def spy_file(args, phase: str) -> str | None:
    """Where py-spy writes the collapsed stacks of ``phase`` (None: not asked for)."""
    if not args.py_spy:
        return None
    Path(args.py_spy).mkdir(parents=True, exist_ok=True)
    return str(Path(args.py_spy) / f"{phase}.txt")


def warm_up(spark, workdir: Path, bootstrap: str, args, timer: StageTimer) -> None:
    """Run every code path once (Kafka and inbox sources, replicator, acks), so no measurement pays for it."""
    from replication.connectors.kafka.broker import ensure_topics

    topic = f"bench-warm-{uuid.uuid4().hex[:6]}.publish"
    ensure_topics(bootstrap, [topic], partitions=args.partitions, security=kafka_security())
    prepublish(bootstrap, topic, feeds(5000, args.publishers, args.partitions))
    for kind in args.storage:
        with tables_in(kind):
            pair = make_pair(workdir, bootstrap, f"warm-{kind}", topic=topic, max_offsets=args.max_offsets,
                             replicate=True, timer=timer)
            throughput_run(spark, pair, 5000, timer, label="warm-up", trigger=args.trigger)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--messages", type=int, default=None, help="messages for the throughput runs (1M)")
    parser.add_argument("--quick", action="store_true", help="100k messages, 10 s of steady publishing")
    parser.add_argument("--partitions", type=int, default=2, help="partitions of the publish topic")
    parser.add_argument("--publishers", type=int, default=4, help="publishers (one producer process each)")
    parser.add_argument("--repeat", type=int, default=1, help="throughput passes, in turn; the best of each is kept")
    parser.add_argument("--max-offsets", type=int, default=None, help="<MaxOffsetsPerTrigger> of the instances")
    parser.add_argument("--trigger", default="0 seconds", help="trigger interval of every query (engine default)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark SQL setting for the measured queries, to try a change (repeatable)")
    parser.add_argument("--latency-rate", type=float, default=2000.0, help="msg/s of the steady publisher")
    parser.add_argument("--latency-seconds", type=float, default=None, help="measured seconds (30; --quick: 10)")
    parser.add_argument("--linger-ms", type=int, default=None,
                        help="the steady publisher's linger (default: the Publisher's, LINGER_MS)")
    parser.add_argument("--latency-warmup", type=float, default=None,
                        help="seconds of the same publishing before the measured ones (60; --quick: 0)")
    parser.add_argument("--only", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}")
    add_kafka_arguments(parser)
    add_storage_argument(parser)
    parser.add_argument("--workdir", help="keep tables here (default: a temporary directory, removed)")
    parser.add_argument("--py-spy", metavar="DIR", help="py-spy the measured runs into DIR/<run>.txt "
                        "(collapsed stacks of the driver and Spark's Python workers)")
    args = parser.parse_args(argv)
    use_kafka_security(parser, args)
    args.messages = args.messages or (100_000 if args.quick else 1_000_000)
    args.latency_seconds = args.latency_seconds or (10.0 if args.quick else 30.0)
    if args.latency_warmup is None:
        args.latency_warmup = 0.0 if args.quick else 60.0
    bad = [c for c in args.conf if "=" not in c]
    if bad:
        parser.error(f"--conf takes KEY=VALUE, got {bad[0]!r}; e.g. --conf spark.sql.adaptive.enabled=false")
    unknown = set(args.only.split(",")) - set(PHASES)
    if unknown:
        parser.error(f"--only: unknown phase(s) {', '.join(sorted(unknown))}; choose from {', '.join(PHASES)}")
    return args


def measure(spark, workdir: Path, bootstrap: str, args) -> str:
    """Run the selected phases with the engine's steps timed; returns the report."""
    phases = set(args.only.split(","))
    os.environ.setdefault(LINK_KEY_VARIABLE, secrets.token_hex(32))
    # Keep every batch's progress: the latency run has hundreds of small batches per query.
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")
    timer = StageTimer()
    with timer.patched(stage_targets(timer)):
        warm_up(spark, workdir, bootstrap, args, timer)
        runs, mirrored = (throughput(spark, workdir, bootstrap, args, timer, phases)
                          if phases & {"throughput", "mm2"} else ({}, None))
        with tables_in(args.storage[0]):  # (throughput runs on each storage; latency on the first listed)
            lat = latency(spark, workdir, bootstrap, args, timer) if "latency" in phases else None
    return report(args, runs, lat, mirrored)


def main(argv: list[str] | None = None) -> None:
    run_benchmark("bench-replicate", parse_args(argv), measure)


if __name__ == "__main__":
    main()
