"""Benchmark: an instance's ingest (Kafka -> txlog) against two baselines, side by side.

One run prints (issue 2, "Performance"):

1. ingest rate of an instance for N (default 1M) ~200-byte JSON messages,
   pre-published with zstd by several raw producers (DESIGN §7 headers); the
   clock runs from the start of the ingest query to the last row committed;
2. baseline (a): the same Spark source and rows, ``foreachBatch(toArrow +
   write_deltalake)``, no dedupe, seq or acks, same trigger;
3. baseline (b): one kafka-python consumer -> deltalake loop, no Spark;
   baseline (c): Spark's own Kafka source (``format("kafka")``, headers) ->
   Delta sink (delta-spark), no dedupe: the pipeline a Databricks user
   writes by hand (``bench/baselines.py``);
4. publish -> persisted-ack latency (p50/p99) at a steady rate with
   ``replication.client.Publisher``;
5. the time to ingest a 100k-message batch into a txlog of 100k rows and into
   one of 5M rows (built directly with deltalake, recovered by the instance);

and where the ingest driver's time goes (toArrow, classify, Delta append,
state snapshot, acks, Spark). Uses a Kafka broker of its own (KRaft) unless
``--bootstrap`` is given::

    .venv/bin/python bench/ingest.py --quick          # ~2 minutes
    .venv/bin/python bench/ingest.py                  # 1M messages, ~6 minutes
    .venv/bin/python bench/ingest.py --quick --only ingest,latency --py-spy /tmp/spy
    .venv/bin/python bench/ingest.py --repeat 2 --storage local,s3 --only ingest,a,c   # S3 beside local disk

``--storage s3`` puts every contender's tables and checkpoints in a bucket of
the project's local S3 server (started for the run); ``local,s3`` runs each
contender on both, side by side, and prints each ratio on S3 over the same
ratio on local disk (issue 36: >= 0.8).
"""

from __future__ import annotations

import argparse
import bisect
import json
import multiprocessing
import os
import sys
import time
import uuid
from pathlib import Path

os.environ.setdefault("REPLICATION_SPARK_LOG_LEVEL", "ERROR")  # stop() of an idle query logs harmless warnings
sys.path.insert(0, str(Path(__file__).resolve().parent))

from baselines import Run, plain_baseline, spark_baseline, spark_batch_seconds, spark_kafka_delta_baseline  # noqa: E402
from common import (  # noqa: E402
    add_kafka_arguments,
    add_storage_argument,
    build_txlog,
    data_batches,
    feeds,
    format_table,
    instance_config,
    kafka_security,
    offsets_moved,
    percentile,
    prepublish,
    run_benchmark,
    steady_publisher,
    tables_in,
    use_kafka_security,
    wait_until,
)
from timing import PhaseTimer, PySpy, tree_cpu_seconds  # noqa: E402

from replication.config.model import DEFAULT_BATCH_ROWS  # noqa: E402

PHASES = ("ingest", "a", "b", "c", "latency", "txlog")


# -- instance ingest ---------------------------------------------------------------


def ingest_timer_targets() -> dict[str, tuple[object, str]]:
    """The driver-side steps of an ingest batch, in the order they run (see IngestWriter)."""
    from pyspark.sql.utils import ForeachBatchFunction

    from replication.connectors.delta.tables import IdempotentAppender
    from replication.durability import Durability
    from replication.ingest import writer
    from replication.txlog.publishers import PublisherState

    return {
        "Spark's callback": (ForeachBatchFunction, "call"),
        "foreachBatch": (writer.IngestWriter, "__call__"),
        "commit wait": (writer.IngestWriter, "wait_for_commit"),
        "after toArrow": (writer.IngestWriter, "write_arrow"),
        "classify": (writer, "classify"),
        "Delta append": (IdempotentAppender, "append"),
        "state snapshot": (PublisherState, "save"),
        "acks": (Durability, "on_commit"),
    }


#: The rows of :func:`breakdown` that run on the ingest's commit thread, beside Spark's work and the read.
COMMIT_THREAD = ("classify", "Delta append (txlog commit)", "state snapshot (publishers.json)", "acks (send + flush)",
                 "other logic")


def breakdown(timer: PhaseTimer, wall: float) -> dict[str, float]:
    """Seconds per step of the ingest driver; ``Spark`` is everything outside foreachBatch. The writer commits
    each batch on a thread while Spark reads the next (:class:`IngestWriter`): the :data:`COMMIT_THREAD` rows
    overlap the first three, whose sum is the wall time."""
    s = timer.seconds
    named = s["classify"] + s["Delta append"] + s["state snapshot"] + s["acks"]
    return {
        "Spark (plan, offsets, checkpoint)": max(0.0, wall - s["foreachBatch"]),
        "toArrow (Kafka read in workers + collect)": s["foreachBatch"] - s["commit wait"],
        "waiting for the last batch's commit": s["commit wait"],
        "classify": s["classify"],
        "Delta append (txlog commit)": s["Delta append"],
        "state snapshot (publishers.json)": s["state snapshot"],
        "acks (send + flush)": s["acks"],
        "other logic": s["after toArrow"] - named,
    }


def run_instance(spark, cfg, target_seq: int, timer: PhaseTimer, *, label: str) -> Run:
    """Start an instance on a pre-published backlog; time query start -> ``max_seq == target_seq``."""
    from replication.instance import Instance

    timer.reset()
    inst = Instance(cfg, spark).start()
    started, cpu = time.perf_counter(), tree_cpu_seconds()
    try:
        rows = target_seq - inst.status().max_seq
        wait_until(lambda: _committed(inst, target_seq), timeout=120 + rows / 2000, interval=0.05,
                   what=f"{cfg.name} to commit seq {target_seq}")
        seconds, cpu = time.perf_counter() - started, tree_cpu_seconds() - cpu
        batch_seconds = spark_batch_seconds(inst.query, rows)
    finally:
        inst.stop()  # lets the current batch finish, so the counters and timers below are final
    counters = inst.status().counters
    parts = breakdown(timer, seconds)
    if counters.get("rejected") or counters.get("duplicates"):
        raise SystemExit(f"{cfg.name}: unexpected rejects/duplicates {counters}")
    return Run(label, rows, seconds, counters["batches"], parts, batch_seconds, cpu)


def _committed(inst, target_seq: int) -> bool:
    status = inst.status()
    if status.error:
        raise SystemExit(f"{status.instance}: ingest query failed: {status.error}")
    return status.max_seq >= target_seq


# -- latency -------------------------------------------------------------------------


def latency(spark, workdir: Path, bootstrap: str, args, timer: PhaseTimer) -> dict:
    """Publish at ``--latency-rate`` msg/s for ``--latency-seconds``; publish -> persisted-ack ms.

    The Publisher runs in its own process, as a user's would (in this one it
    would share the driver's interpreter lock with the instance). Also returns
    the mean time per micro-batch of each step (Spark's own ``durationMs`` and
    the driver steps timed by ``timer``).
    """
    from replication.connectors.kafka.broker import ensure_topics
    from replication.instance import Instance

    cfg = instance_config(workdir, f"bench-lat-{uuid.uuid4().hex[:6]}", bootstrap, inbox=args.inbox)
    topic = f"{cfg.name}.publish"
    ensure_topics(bootstrap, [topic], security=kafka_security())
    out = workdir / "steady-publisher.json"
    inst = Instance(cfg, spark).start()
    try:
        timer.reset()
        proc = multiprocessing.get_context("spawn").Process(
            target=steady_publisher,
            args=(bootstrap, topic, cfg.name, args.latency_rate, args.latency_seconds,
                  str(workdir / "lat-pub.store"), str(out)),
        )
        proc.start()
        proc.join(timeout=args.latency_seconds + 300)
        if proc.exitcode != 0:
            proc.kill()
            raise SystemExit(f"the steady publisher failed (exit code {proc.exitcode})")
        per_batch = _per_batch_ms(inst.query.recentProgress, timer)
    finally:
        inst.stop()
    published = json.loads(out.read_text())
    acks = [tuple(a) for a in published["acks"]]  # (persisted seq, wall time), in order
    lat = []
    for seq, t in published["sent"]:
        i = bisect.bisect_left(acks, (seq, float("-inf")))
        if i == len(acks):
            raise SystemExit(f"latency run: message {seq} was never acknowledged as persisted")
        lat.append((acks[i][1] - t) * 1000)
    times = [t for _, t in published["sent"]]
    return {"p50": percentile(lat, 50), "p99": percentile(lat, 99), "max": max(lat),
            "count": len(lat), "rate": len(times) / (max(times) - min(times)), "per_batch": per_batch}


def _per_batch_ms(progress: list[dict], timer: PhaseTimer) -> dict[str, float]:
    """Mean milliseconds per micro-batch with rows: Spark's ``durationMs`` steps, then the driver's."""
    batches = data_batches(progress)
    if not batches:
        return {}
    out = {"batches": len(batches), "rows per batch": sum(offsets_moved(p) for p in batches) / len(batches)}
    for step in ("triggerExecution", "latestOffset", "queryPlanning", "getBatch", "addBatch", "walCommit",
                 "commitOffsets"):
        out[f"spark {step}"] = sum(p["durationMs"].get(step, 0) for p in batches) / len(batches)
    calls = max(1, timer.calls["foreachBatch"])
    s = timer.seconds
    out["  Spark's Python callback"] = 1000 * s["Spark's callback"] / calls
    out["  foreachBatch function (Python)"] = 1000 * s["foreachBatch"] / calls
    out["    read (here, or Spark job + collect)"] = 1000 * (s["foreachBatch"] - s["commit wait"]) / calls
    out["    waiting for the last batch's commit"] = 1000 * s["commit wait"] / calls
    out["  on the commit thread, beside Spark's next batch"] = 1000 * s["after toArrow"] / calls
    for label in ("classify", "Delta append", "state snapshot", "acks"):
        out[f"    {label}"] = 1000 * s[label] / calls
    return out


# -- txlog size ----------------------------------------------------------------------

def txlog_scaling(spark, workdir: Path, bootstrap: str, sizes: list[int], args, timer: PhaseTimer) -> list[dict]:
    """Build a txlog of each size, then ingest ``--txlog-batch`` new messages into each, ``--rounds`` times.

    Rounds alternate the order of the sizes (small, big, big, small, ...), so
    neither size always runs first after a quiet period.
    """
    logs = [_prepared_log(workdir, bootstrap, size, args) for size in sizes]
    for r in range(args.rounds):
        for log in (logs if r % 2 == 0 else logs[::-1]):
            base = log["size"] + len(log["runs"]) * args.txlog_batch
            prepublish(bootstrap, log["topic"], feeds(args.txlog_batch, args.publishers, args.partitions,
                                                      first_seq=base // args.publishers + 1))
            run = run_instance(spark, log["cfg"], base + args.txlog_batch, timer, label=f"txlog {base:,}")
            log["runs"].append(run)
            print(f"  txlog of {base:>9,} rows: {args.txlog_batch:,} new messages in {run.seconds:.2f}s "
                  f"({run.batches} batch(es))", flush=True)
    return logs


def _prepared_log(workdir: Path, bootstrap: str, size: int, args) -> dict:
    """An instance config whose txlog already holds ``size`` rows, and its publish topic."""
    from replication.connectors.kafka.broker import ensure_topics

    cfg = instance_config(workdir, f"bench-log{size}-{uuid.uuid4().hex[:6]}", bootstrap, inbox=args.inbox)
    topic = f"{cfg.name}.publish"
    ensure_topics(bootstrap, [topic], partitions=args.partitions, security=kafka_security())
    started = time.perf_counter()
    build_txlog(cfg, size, args.publishers, args.txlog_batch)
    print(f"  built a txlog of {size:,} rows in {time.perf_counter() - started:.1f}s", flush=True)
    return {"size": size, "cfg": cfg, "topic": topic, "runs": []}


# -- orchestration -------------------------------------------------------------------


def warm_up(spark, workdir: Path, bootstrap: str, args, timer: PhaseTimer) -> None:
    """Start the JVM's and the Python workers' code paths once on each storage, so no measurement pays
    for it."""
    from replication.connectors.kafka.broker import ensure_topics

    for kind in args.storage:
        with tables_in(kind):
            cfg = instance_config(workdir, f"bench-warm-{uuid.uuid4().hex[:6]}", bootstrap, inbox=args.inbox)
            ensure_topics(bootstrap, [f"{cfg.name}.publish"], partitions=args.partitions, security=kafka_security())
            prepublish(bootstrap, f"{cfg.name}.publish", feeds(5000, args.publishers, args.partitions))
            run_instance(spark, cfg, 5000, timer, label="warm-up")
            spark_baseline(spark, cfg, 5000, workdir)
            spark_kafka_delta_baseline(spark, bootstrap, f"{cfg.name}.publish", 5000, workdir / f"warm-c-{kind}",
                                       DEFAULT_BATCH_ROWS)


def throughput(spark, workdir: Path, bootstrap: str, args, timer: PhaseTimer,
               phases: set[str]) -> dict[str, dict[str, Run]]:
    """Pre-publish once; the instance and the baselines read the same topic, on each ``--storage``.

    ``--repeat`` passes, the order rotating so that each variant runs first
    once (the machine's load drifts); a variant runs on each storage in turn,
    side by side; the best pass of each is kept, by storage.
    """
    from replication.connectors.kafka.broker import ensure_topics

    topic = f"bench-ingest-{uuid.uuid4().hex[:6]}.publish"
    ensure_topics(bootstrap, [topic], partitions=args.partitions, security=kafka_security())
    rate = prepublish(bootstrap, topic, feeds(args.messages, args.publishers, args.partitions))
    print(f"published {args.messages:,} messages ({args.publishers} producers, {args.partitions} partitions, "
          f"zstd): {rate:,.0f} msg/s", flush=True)
    best: dict[str, dict[str, Run]] = {kind: {} for kind in args.storage}
    for rep in range(args.repeat):
        keys = [k for k in ("ingest", "a", "b", "c") if k in phases]
        for key in keys[rep % len(keys):] + keys[:rep % len(keys)]:  # each goes first in turn
            for kind in args.storage:
                with tables_in(kind):
                    cfg = instance_config(workdir, f"bench-ingest-{rep}-{uuid.uuid4().hex[:6]}", bootstrap,
                                          topic=topic, max_offsets=args.max_offsets, inbox=args.inbox)
                    run = _throughput_run(key, spark, cfg, workdir / f"rep{rep}-{key}", bootstrap, topic, args,
                                          timer)
                run.label += f" [{kind}]"
                print(f"  {run.label}: {run.rate:,.0f} rows/s (load average {os.getloadavg()[0]:.1f})", flush=True)
                if key not in best[kind] or run.seconds < best[kind][key].seconds:
                    best[kind][key] = run
    return best


def _throughput_run(key: str, spark, cfg, workdir: Path, bootstrap: str, topic: str, args, timer) -> Run:
    if key == "ingest":
        with PySpy(_spy_file(args, "ingest")):
            return run_instance(spark, cfg, args.messages, timer, label="instance ingest")
    if key == "a":
        return spark_baseline(spark, cfg, args.messages, workdir)
    if key == "c":
        return spark_kafka_delta_baseline(spark, bootstrap, topic, args.messages, workdir,
                                          args.max_offsets or DEFAULT_BATCH_ROWS)
    return plain_baseline(bootstrap, topic, args.messages, args.partitions, args.plain_batch, workdir)


def _spy_file(args, phase: str) -> str | None:
    """Where py-spy writes the collapsed stacks of ``phase`` (None: not asked for)."""
    if not args.py_spy:
        return None
    Path(args.py_spy).mkdir(parents=True, exist_ok=True)
    return str(Path(args.py_spy) / f"{phase}.txt")


def report(args, runs: dict[str, dict[str, Run]], lat: dict | None, scaling: list[dict]) -> str:
    """The final tables: rates, ratios and targets (by storage), latency, txlog scaling, ingest breakdown."""
    out = [f"\n== bench/ingest.py: {args.messages:,} msgs, {args.partitions} partitions, "
           f"{args.publishers} publishers, MaxOffsetsPerTrigger={_max_offsets(args)}, trigger 0 s, "
           f"inbox {'on' if args.inbox else 'off'}, storage {_storage_label(args)}, "
           f"best of {args.repeat}; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} =="]
    every = [r for by_key in runs.values() for r in by_key.values()]
    if every:
        rows = [[r.label, f"{r.rows:,}", f"{r.seconds:.2f}", f"{r.rate:,.0f}", r.batches, _secs(r.batch_seconds),
                 _secs(r.cpu_seconds), f"{r.rows / r.cpu_seconds:,.0f}"] for r in every]
        out.append(format_table(["throughput", "rows", "seconds", "rows/s", "batches", "in batches s", "CPU s",
                                 "rows/CPU-s"], rows))
    checks = []
    for kind, by_key in runs.items():
        checks.extend(_ratio_checks(by_key, f" [{kind}]" if len(runs) > 1 else ""))
    if {"local", "s3"} <= runs.keys():
        checks.extend(_storage_checks(runs["local"], runs["s3"]))
    if lat:
        checks.append([f"ack latency p50 ({lat['count']:,} msgs at {lat['rate']:,.0f}/s)", f"{lat['p50']:.0f} ms",
                       "<= 300 ms", _verdict(lat["p50"] <= 300)])
        checks.append(["ack latency p99", f"{lat['p99']:.0f} ms", "<= 1000 ms", _verdict(lat["p99"] <= 1000)])
        checks.append(["ack latency max", f"{lat['max']:.0f} ms", "", ""])
    if len(scaling) == 2:
        small, big = (min(_batch_time(r) for r in log["runs"]) for log in scaling)
        ratio = big / small
        checks.append([f"{args.txlog_batch:,}-msg batch, txlog {scaling[0]['size']:,} -> {scaling[1]['size']:,}",
                       f"{small:.2f}s -> {big:.2f}s = {ratio:.2f}", "<= 1.2", _verdict(ratio <= 1.2)])
        small, big = (min(_driver_seconds(r) for r in log["runs"]) for log in scaling)
        checks.append(["  its driver part (classify, append, acks)", f"{small:.2f}s -> {big:.2f}s = {big / small:.2f}",
                       "", "(less load-sensitive)"])
    if checks:
        out.append("")
        out.append(format_table(["measure", "value", "target", ""], checks))
    for run in every:
        if run.parts:
            out.append("")
            out.append(_parts_table(run))
    if lat and lat["per_batch"]:
        out.append("")
        out.append(format_table(["latency run: mean per micro-batch", "ms"],
                                [[k, f"{v:,.0f}"] for k, v in lat["per_batch"].items()]))
    if len(scaling) == 2:
        out.append("")
        out.append(_scaling_table(scaling, args.txlog_batch))
    return "\n".join(out)


def _ratio_checks(runs: dict[str, Run], where: str) -> list[list[str]]:
    """The instance against each baseline on one storage: rows/s and rows per CPU-second."""
    checks = []
    ingest = runs.get("ingest")
    for key, target in (("a", 0.8), ("b", 1.5), ("c", None)):
        if ingest and key in runs:
            ratio = ingest.rate / runs[key].rate
            cpu_ratio = runs[key].cpu_seconds / ingest.cpu_seconds
            checks.append([f"ingest / ({key}){where}, rows/s", f"{ratio:.2f}", f">= {target}" if target else "",
                           _verdict(ratio >= target) if target else "(the anchor of the next targets)"])
            checks.append([f"ingest / ({key}){where}, rows per CPU-second", f"{cpu_ratio:.2f}", "",
                           "(less load-sensitive)"])
    return checks


def _storage_checks(local: dict[str, Run], s3: dict[str, Run]) -> list[list[str]]:
    """Issue 36's target: each ratio of the instance to a baseline on S3 within 0.8x of the same ratio on
    local disk, measured in the same run."""
    checks = []
    for key in ("a", "b", "c"):
        if all(k in runs for runs in (local, s3) for k in ("ingest", key)):
            on_local = local["ingest"].rate / local[key].rate
            on_s3 = s3["ingest"].rate / s3[key].rate
            ratio = on_s3 / on_local
            checks.append([f"ingest / ({key}): on S3 / on local disk", f"{on_s3:.2f} / {on_local:.2f} = {ratio:.2f}",
                           ">= 0.8", _verdict(ratio >= 0.8)])
    return checks


def _storage_label(args) -> str:
    """``--storage`` as the report's header says it: with two, the other phases ran on the first."""
    if len(args.storage) == 1:
        return args.storage[0]
    return f"{','.join(args.storage)} (throughput; latency and txlog on {args.storage[0]})"


def _max_offsets(args) -> str:
    return f"{args.max_offsets:,}" if args.max_offsets else f"{DEFAULT_BATCH_ROWS:,} (default)"


def _batch_time(run: Run) -> float:
    """The batch's own time (Spark's triggerExecution), or the wall time when Spark's progress is gone."""
    return run.batch_seconds if run.batch_seconds is not None else run.seconds


def _driver_seconds(run: Run) -> float:
    """The part of an instance run spent on the commit thread: where the txlog's size could show."""
    return sum(v for k, v in run.parts.items() if k in COMMIT_THREAD)


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _parts_table(run: Run) -> str:
    rows = [[f"  {name} (commit thread)" if name in COMMIT_THREAD else name, f"{sec:.2f}",
             f"{100 * sec / run.seconds:.0f}%"] for name, sec in run.parts.items()]
    return format_table([f"where time goes: {run.label}", "seconds", "share"], rows)


def _scaling_table(scaling: list[dict], batch: int) -> str:
    rows = []
    for log in scaling:
        for r in log["runs"]:
            p = r.parts
            rows.append([r.label, f"{r.seconds:.2f}", _secs(r.batch_seconds),
                         f"{p['Delta append (txlog commit)']:.2f}",
                         f"{p['classify']:.2f}", f"{p['toArrow (Kafka read in workers + collect)']:.2f}",
                         f"{p['Spark (plan, offsets, checkpoint)']:.2f}", r.batches])
    return format_table([f"{batch:,} new msgs into", "total s", "batch s", "append s", "classify s", "toArrow s",
                         "Spark s", "batches"], rows)


def _verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--messages", type=int, default=None, help="messages for the throughput runs (1M)")
    parser.add_argument("--quick", action="store_true", help="100k messages, 8 s of latency, 1M-row big txlog")
    parser.add_argument("--partitions", type=int, default=2, help="partitions of the publish topics")
    parser.add_argument("--publishers", type=int, default=4, help="publishers (one producer process each)")
    parser.add_argument("--repeat", type=int, default=1, help="throughput passes, in turn; the best of each is kept")
    parser.add_argument("--max-offsets", type=int, default=None, help="MaxOffsetsPerTrigger of the instance and (a)")
    parser.add_argument("--no-inbox", dest="inbox", action="store_false",
                        help="instances without the incoming replication transport (Kafka only)")
    parser.add_argument("--plain-batch", type=int, default=100_000, help="rows per Delta append in baseline (b)")
    parser.add_argument("--latency-rate", type=float, default=2000.0)
    parser.add_argument("--latency-seconds", type=float, default=None, help="(25; --quick: 8)")
    parser.add_argument("--big-txlog", type=int, default=None, help="rows of the big txlog (5M; --quick: 1M)")
    parser.add_argument("--txlog-batch", type=int, default=100_000, help="new messages ingested into each txlog")
    parser.add_argument("--rounds", type=int, default=3, help="batches measured per txlog size (best kept)")
    parser.add_argument("--only", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting to try (repeatable)")
    add_kafka_arguments(parser)
    add_storage_argument(parser)
    parser.add_argument("--workdir", help="keep tables here (default: a temporary directory, removed)")
    parser.add_argument("--py-spy", metavar="DIR", help="py-spy the ingest and latency runs into DIR/<phase>.txt "
                        "(collapsed stacks of the driver and Spark's Python workers)")
    args = parser.parse_args(argv)
    use_kafka_security(parser, args)
    args.messages = args.messages or (100_000 if args.quick else 1_000_000)
    args.latency_seconds = args.latency_seconds or (8.0 if args.quick else 25.0)
    args.big_txlog = args.big_txlog or (1_000_000 if args.quick else 5_000_000)
    return args


def measure(spark, workdir: Path, bootstrap: str, args) -> str:
    """Run the selected phases, each with the driver steps timed; returns the report."""
    phases = set(args.only.split(","))
    timer = PhaseTimer()
    with timer.patched(ingest_timer_targets()):
        warm_up(spark, workdir, bootstrap, args, timer)
        runs = throughput(spark, workdir, bootstrap, args, timer, phases) if phases & {"ingest", "a", "b", "c"} else {}
        lat = None
        if "latency" in phases:
            with PySpy(_spy_file(args, "latency")), tables_in(args.storage[0]):  # (the first storage listed)
                lat = latency(spark, workdir, bootstrap, args, timer)
        scaling = []
        if "txlog" in phases:
            with tables_in(args.storage[0]):
                scaling = txlog_scaling(spark, workdir, bootstrap, [args.txlog_batch, args.big_txlog], args, timer)
    return report(args, runs, lat, scaling)


def main(argv: list[str] | None = None) -> None:
    run_benchmark("bench-ingest", parse_args(argv), measure)


if __name__ == "__main__":
    main()
