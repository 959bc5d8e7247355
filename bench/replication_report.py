"""``bench/replicate.py``'s report: rates, ratios against the baselines and targets, latency by step,
CPU by process, where the time goes."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from common import format_table, offsets_moved, percentile
from replication_probes import BROKER, INSTANCE_KINDS, LATENCY_STEPS

from replication.config.model import DEFAULT_BATCH_ROWS

if TYPE_CHECKING:
    from mirror_maker import MirrorRun
    from replicate import Latency, Run

# -- report ----------------------------------------------------------------------------

#: Stage groups in the order a message meets them.
GROUPS = ("A ingest", "A ingest commit", "A->B replicator", "B ingest", "B ingest commit", "A->B ack watch",
          "B durability release", "A durability release", "A link", "B link")
SPARK_STEPS = ("triggerExecution", "addBatch", "latestOffset", "queryPlanning", "getBatch", "walCommit",
               "commitOffsets")


def report(args, runs: dict[str, dict[str, Run]], lat: Latency | None, mirrored: MirrorRun | None = None) -> str:
    where_latency = f" (latency on {args.storage[0]})" if lat and len(args.storage) > 1 else ""
    out = [f"\n== bench/replicate.py: {args.messages:,} msgs, {args.partitions} partitions, "
           f"{args.publishers} publishers, "
           f"MaxOffsetsPerTrigger={args.max_offsets or f'{DEFAULT_BATCH_ROWS:,} (default)'}, trigger {args.trigger}, "
           f"storage {','.join(args.storage)}{where_latency}, "
           f"best of {args.repeat}; {os.cpu_count()} cores, "
           f"load average {os.getloadavg()[0]:.1f} =="]
    if args.conf:
        out.append(f"Spark settings tried: {', '.join(args.conf)}")
    every = [run for by_key in runs.values() for run in by_key.values()]
    checks = []
    if every or mirrored is not None:
        rows = [[r.label + restarted(r.restarts), f"{r.rows:,}", f"{r.seconds:.2f}", f"{r.rate:,.0f}",
                 f"{r.cpu_seconds:.1f}", f"{r.rows / r.cpu_seconds:,.0f}"] for r in every]
        if mirrored is not None:
            rows.append(["MirrorMaker 2, source -> target broker (from its start)", f"{mirrored.rows:,}",
                         f"{mirrored.seconds:.2f}", f"{mirrored.rate:,.0f}", f"{mirrored.cpu_seconds:.1f}",
                         f"{mirrored.rows / mirrored.cpu_seconds:,.0f}"])
            rows.append(["MirrorMaker 2, copying (first record -> last)", f"{mirrored.rows:,}",
                         f"{mirrored.copy_seconds:.2f}", f"{mirrored.copy_rate:,.0f}", "", ""])
        out.append(format_table(["throughput", "rows", "seconds", "rows/s", "CPU s", "rows/CPU-s"], rows))
        for by_key in runs.values():
            if "replicate" in by_key:
                out.append("")
                out.append(format_table([f"{by_key['replicate'].label}: all rows in ...", "s after A's start"],
                                        [[k, f"{v:.2f}"] for k, v in by_key["replicate"].marks.items()]))
    for kind, by_key in runs.items():
        checks.extend(throughput_checks(by_key, mirrored, f" [{kind}]" if len(runs) > 1 else ""))
    if {"local", "s3"} <= runs.keys():
        checks.extend(storage_checks(runs["local"], runs["s3"], mirrored))
    if lat:
        checks.extend(latency_checks(lat))
    if checks:
        out.append("")
        out.append(format_table(["measure", "value", "target", ""], checks))
    if lat:
        out.append("")
        out.append(latency_table(lat.measured()))
        out.append("")
        out.append(latency_over_time(lat))
    cpu_columns = {f"{run.label} ({run.seconds:.0f}s)": (run.cpu_kinds, run.seconds) for run in every}
    if mirrored is not None:
        cpu_columns[f"MirrorMaker 2 ({mirrored.seconds:.0f}s)"] = (mirrored.cpu_kinds, mirrored.seconds)
    if lat:
        cpu_columns[f"pair not started ({lat.unstarted_seconds:.0f}s)"] = (lat.unstarted_cpu_kinds,
                                                                            lat.unstarted_seconds)
        cpu_columns[f"idle pair, just started ({lat.idle_seconds:.0f}s)"] = (lat.idle_cpu_kinds, lat.idle_seconds)
        cpu_columns[f"latency run ({lat.wall:.0f}s)"] = (lat.cpu_kinds, lat.wall)
        cpu_columns[f"idle pair after it ({lat.settled_seconds:.0f}s)"] = (lat.settled_cpu_kinds, lat.settled_seconds)
    if cpu_columns:
        out.append("")
        out.append(cpu_table(cpu_columns))
    for run in every:
        out.append("")
        out.append(stage_table(f"where time goes: {run.label} ({run.seconds:.1f}s)", run.stages, run.seconds))
        out.append("")
        out.append(spark_table(f"Spark per query: {run.label}", run.queries))
    if lat:
        out.append("")
        out.append(stage_table(f"where time goes: latency run ({lat.seconds:.1f}s of publishing)",
                               lat.stages, lat.seconds))
        out.append("")
        out.append(spark_table("Spark per query: latency run", lat.queries))
    return "\n".join(out)


def latency_checks(lat: Latency) -> list[list[str]]:
    """Issue 3's latency targets and issue 40's tighter ones, on the messages published after the warm-up."""
    ms = lat.measured()
    after = f", after {lat.warmup:.0f} s of warm-up" if lat.warmup else ""
    what = f"{lat.count:,} msgs at {lat.rate:,.0f}/s{after}{restarted(lat.restarts)}"
    a50 = pct(ms["A txlog commit"], 50)
    p50, p99 = pct(ms["B txlog commit"], 50), pct(ms["B txlog commit"], 99)
    ack50 = pct(ms["publisher ack"], 50)
    def pair(kinds: dict[str, float], seconds: float) -> float:
        return sum(kinds.get(kind, 0.0) for kind in INSTANCE_KINDS) / seconds

    pair_idle, pair_started = pair(lat.settled_cpu_kinds, lat.settled_seconds), pair(lat.idle_cpu_kinds,
                                                                                      lat.idle_seconds)
    broker_idle = lat.settled_cpu_kinds.get(BROKER, 0.0) / lat.settled_seconds
    broker_alone = lat.unstarted_cpu_kinds.get(BROKER, 0.0) / lat.unstarted_seconds
    return [["idle pair after the run: the instances' processes (driver, JVM, source runners), cores",
             f"{pair_idle:.2f}", "<= 0.2", verdict(pair_idle <= 0.2)],
            ["idle pair just started (the JIT still compiling its poll), cores", f"{pair_started:.2f}", "", ""],
            ["idle pair after the run: the broker beside it / before the pair started, cores",
             f"{broker_idle:.2f} / {broker_alone:.2f}", "", "(the broker is the user's, not the pair's)"],
            [f"publish -> A txlog p50 ({what})", f"{a50:,.0f} ms", "<= 120 ms", verdict(a50 <= 120)],
            ["publish -> B txlog p50", f"{p50:,.0f} ms", "<= 700 / 300 ms", verdict(p50 <= 700, p50 <= 300)],
            ["publish -> B txlog p99", f"{p99:,.0f} ms", "<= 2000 / 800 ms", verdict(p99 <= 2000, p99 <= 800)],
            ["publish -> persisted ack p50 (sync B)", f"{ack50:,.0f} ms", "<= 1000 / 350 ms",
             verdict(ack50 <= 1000, ack50 <= 350)]]


def throughput_checks(runs: dict[str, Run], mirrored: MirrorRun | None, where: str) -> list[list[str]]:
    """Replication against ingest only, signed against unsigned and against MirrorMaker 2, on one storage."""
    checks = []
    if "ingest" in runs and "replicate" in runs:
        ing, rep = runs["ingest"], runs["replicate"]
        ratio = rep.rate / ing.rate
        checks.append([f"replication / ingest only{where}, rows/s", f"{ratio:.2f}", ">= 0.7", verdict(ratio >= 0.7)])
        checks.append([f"replication / ingest only{where}, rows per CPU-s",
                       f"{(rep.rows / rep.cpu_seconds) / (ing.rows / ing.cpu_seconds):.2f}", "",
                       "(less load-sensitive)"])
    if "signed" in runs and "replicate" in runs:
        rep, signed = runs["replicate"], runs["signed"]
        ratio = signed.rate / rep.rate
        checks.append([f"signed / unsigned replication{where}, rows/s", f"{ratio:.2f}", ">= 0.95",
                       verdict(ratio >= 0.95)])
        checks.append([f"signed / unsigned replication{where}, rows per CPU-s",
                       f"{(signed.rows / signed.cpu_seconds) / (rep.rows / rep.cpu_seconds):.2f}", "", ""])
    if mirrored is not None and "replicate" in runs:
        rep = runs["replicate"]
        checks.append([f"replication / MirrorMaker 2 (from its start){where}, rows/s",
                       f"{rep.rate / mirrored.rate:.2f}", "", "(the anchor of the next targets)"])
        checks.append([f"replication / MirrorMaker 2 (copying){where}, rows/s",
                       f"{rep.rate / mirrored.copy_rate:.2f}", "", ""])
        checks.append([f"replication / MirrorMaker 2{where}, rows per CPU-s",
                       f"{(rep.rows / rep.cpu_seconds) / (mirrored.rows / mirrored.cpu_seconds):.2f}", "", ""])
    return checks


def storage_checks(local: dict[str, Run], s3: dict[str, Run], mirrored: MirrorRun | None) -> list[list[str]]:
    """Issue 36's target: replication's ratios to its baselines on S3 within 0.8x of the same ratios on local
    disk, measured in the same run."""
    baselines = {"ingest only": lambda runs: runs["ingest"].rate if "ingest" in runs else None}
    if mirrored is not None:
        baselines["MirrorMaker 2 (from its start)"] = lambda _runs: mirrored.rate
    checks = []
    for name, baseline in baselines.items():
        if "replicate" not in local or "replicate" not in s3 or baseline(local) is None or baseline(s3) is None:
            continue
        on_local = local["replicate"].rate / baseline(local)
        on_s3 = s3["replicate"].rate / baseline(s3)
        checks.append([f"replication / {name}: on S3 / on local disk",
                       f"{on_s3:.2f} / {on_local:.2f} = {on_s3 / on_local:.2f}", ">= 0.8",
                       verdict(on_s3 / on_local >= 0.8)])
    return checks


def cpu_table(columns: dict[str, tuple[dict[str, float], float]]) -> str:
    """CPU by process kind for each run, as cores in use on average (CPU-s per wall second)."""
    kinds = sorted({k for figures, _ in columns.values() for k in figures},
                   key=lambda k: -sum(f.get(k, 0.0) / w for f, w in columns.values()))
    rows = [[kind] + [f"{figures.get(kind, 0.0) / wall:.2f}" for figures, wall in columns.values()] for kind in kinds]
    rows.append(["total"] + [f"{sum(figures.values()) / wall:.2f}" for figures, wall in columns.values()])
    return format_table(["CPU cores in use, by process"] + list(columns), rows)


def latency_table(ms: dict) -> str:
    """Cumulative percentiles from the publish to each step, and the median time spent in each step."""
    import numpy as np

    rows, previous = [], None
    for step, meaning in LATENCY_STEPS:
        values = ms[step]
        step_ms = values - previous if previous is not None else values
        previous = values
        missing = int(np.isnan(values).sum())
        rows.append([step, f"{pct(values, 50):,.0f}", f"{pct(values, 99):,.0f}", f"{np.nanmax(values):,.0f}",
                     f"{pct(step_ms, 50):,.0f}", meaning + (f" ({missing} never seen)" if missing else "")])
    return format_table(["publish -> ...", "p50 ms", "p99 ms", "max ms", "step p50 ms", "(step)"], rows)


def latency_over_time(lat: Latency, windows: int = 6) -> str:
    """p50 of the main steps in equal slices of the publishing time, warm-up included: a falling p50 means
    the pair was still warming up (the JVM's JIT compiles Spark's planning code for about a minute), a
    rising one that work was piling up."""
    import numpy as np

    steps = ("A txlog commit", "B txlog commit", "publisher ack")
    elapsed = lat.sent_at - lat.sent_at[0]
    edges = np.linspace(0.0, elapsed[-1], windows + 1)
    rows = []
    for index, (start, end) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        inside = (elapsed >= start) & ((elapsed < end) | (index == windows - 1))
        rows.append([f"{start:.0f}-{end:.0f}", f"{int(inside.sum()):,}"]
                    + [f"{pct(lat.ms[step][inside], 50):,.0f}" for step in steps])
    return format_table(["seconds of publishing", "msgs"] + [f"-> {step} p50 ms" for step in steps], rows)


def pct(values, q: float) -> float:
    """:func:`percentile` of the values that were seen (NaN: a step never recorded for that message)."""
    import numpy as np

    values = np.asarray(values, dtype=float)
    return percentile(values[~np.isnan(values)].tolist(), q)


def stage_table(title: str, stages: dict[str, tuple[float, int]], wall: float) -> str:
    """Each group's total then its steps; "read" is the group total minus the steps after it."""
    derived = dict(stages)
    for group in {k.split(" / ")[0] for k in stages}:
        if group.endswith(" ingest") and group in stages:
            total, calls = stages[group]
            waited = stages.get(f"{group} / waiting for the last batch's commit", (0.0, 0))[0]
            derived[f"{group} / read (small batch: here; else Spark job + collect)"] = (total - waited, calls)
        if group.endswith(" replicator") and group in stages:
            total, calls = stages[group]
            after = sum(v[0] for k, v in stages.items() if k.startswith(f"{group} / "))
            derived[f"{group} / read + route (small batch: here; else Spark job)"] = (total - after, calls)
    groups = sorted({k.split(" / ")[0] for k in derived}, key=lambda g: (GROUPS.index(g) if g in GROUPS else 99, g))
    rows = []
    for group in groups:
        rows.append(stage_row(group, derived.get(group), wall))
        steps = [k for k in derived if k.startswith(f"{group} / ")]
        for label in sorted(steps, key=lambda k: -derived[k][0]):
            rows.append(stage_row("  " + label.split(" / ", 1)[1], derived[label], wall))
    return format_table([title, "calls", "seconds", "ms/call", "of wall"], rows)


def stage_row(name: str, figures: tuple[float, int] | None, wall: float) -> list:
    if figures is None:  # a group of separate calls, with no call of its own around them
        return [name, "", "", "", ""]
    seconds, calls = figures
    return [name, calls, f"{seconds:.2f}", f"{1000 * seconds / max(calls, 1):,.1f}", f"{100 * seconds / wall:.0f}%"]


def spark_table(title: str, queries: dict[str, list[dict]]) -> str:
    """Per query: batches with data, offsets moved per batch (rows; inbox: versions), Spark's steps (mean ms)."""
    rows = []
    for name, batches in queries.items():
        if not batches:
            rows.append([name, 0, "-"] + ["-"] * len(SPARK_STEPS))
            continue
        n = len(batches)
        mean = [sum(p["durationMs"].get(s, 0) for p in batches) / n for s in SPARK_STEPS]
        moved = sum(offsets_moved(p) for p in batches) / n
        rows.append([name, n, f"{moved:,.0f}"] + [f"{m:,.0f}" for m in mean])
    return format_table([title, "batches", "rows/batch"] + [f"{s} ms" for s in SPARK_STEPS], rows)


def verdict(ok: bool, *tighter: bool) -> str:
    """One word per target, "ok" or "MISSED": ``ok`` for issue 3's, ``tighter`` for issue 40's beside it."""
    return " / ".join("ok" if met else "MISSED" for met in (ok, *tighter))


def restarted(count: int) -> str:
    return f" [{count} ingest query restart(s): figures suspect]" if count else ""


def print_memory_reads(label: str, a, b) -> None:
    """How many of the replicator's txlog ranges were the ingest's rows held in memory (replication.txlog.recent)."""
    if b is not None and a.recent_txlog is not None:
        held = a.recent_txlog
        print(f"{label}: A's replicator took {held.hits} of {held.hits + held.misses} txlog ranges from memory "
              "(the others from the txlog's files)", flush=True)
