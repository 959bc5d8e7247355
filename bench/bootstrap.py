"""Benchmark: bootstrap and backfill, each side by side with a plain copy of the same data.

One run prints (issue 13, "Performance"):

1. bootstrap of a txlog of N (default 2M) rows into an empty instance, vs a
   baseline copy of the same Delta table: Spark reads its Parquet files,
   deltalake writes the copy; ratio = baseline time / bootstrap time;
2. backfill of M (default 1M) rows from Parquet files into a running
   instance, until the instance has stored them all, vs the same baseline on
   the same files; after a first backfill of the application (reported: it
   starts Spark's Python workers), backfill and baseline take turns
   ``--rounds`` times and ratio = the fastest baseline / the fastest
   backfill; and the CPU seconds each spent (this process, its JVM, Python
   workers and broker): both keep the cores busy, so the ratio of their work
   bounds the ratio of their speeds;
3. the backfill driver's peak memory (the ``replication backfill`` process,
   ``VmHWM``) with 1M and with 4M input rows: it must not grow with the input;
4. the ``replication backfill`` command's own time (its JVM's start included) for
   M rows into a stopped instance, as it runs (its short-lived JVM compiles with
   C1 alone) vs with the JVM's default C2 put back (``_JAVA_OPTIONS``), in turn,
   best of three each.

    .venv/bin/python bench/bootstrap.py --quick    # 400k / 200k rows, memory at 200k and 800k
    .venv/bin/python bench/bootstrap.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

os.environ.setdefault("REPLICATION_SPARK_LOG_LEVEL", "ERROR")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    add_kafka_arguments,
    build_txlog,
    format_table,
    run_benchmark,
    use_kafka_security,
    wait_until,
)
from timing import tree_cpu_seconds  # noqa: E402

PHASES = ("bootstrap", "backfill", "memory", "command")


def write_config(workdir: Path, name: str, bootstrap: str, extra: str = "") -> Path:
    path = workdir / f"{name}.xml"
    path.write_text(f"""<AMPSConfig><Name>{name}</Name><Storage>{workdir / name}</Storage>
  <Transports>
    <Transport><Name>k</Name><Type>kafka</Type><InetAddr>{bootstrap}</InetAddr><Topic>{name}.publish</Topic>
      <MessageType>json</MessageType></Transport>
    <Transport><Name>r</Name><Type>amps-replication</Type></Transport>
  </Transports>
  <TransactionLog><Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
  {extra}</AMPSConfig>""")
    return path


def baseline_copy(spark, files: list[str], target: Path) -> tuple[float, float]:
    """Spark reads the Parquet files (its tasks), deltalake writes the copy (one collect to the driver):
    (seconds, CPU seconds of this process and its children)."""
    from deltalake import write_deltalake

    started, cpu = time.perf_counter(), tree_cpu_seconds()
    write_deltalake(str(target), spark.read.parquet(*files).toArrow(), mode="append")
    return time.perf_counter() - started, tree_cpu_seconds() - cpu


def bootstrap_phase(spark, workdir: Path, bootstrap: str, args) -> list[str]:
    from deltalake import DeltaTable

    from replication import bootstrap as boot
    from replication import config
    from replication.storage.control import write_instance_config
    from replication.storage.layout import StorageLayout

    source = config.load(str(write_config(workdir, "source", bootstrap)))
    build_txlog(source, args.rows, 4, 200_000)
    write_instance_config(source, StorageLayout.of(source.storage).instance_json)  # what a started instance has
    files = [uri.removeprefix("file://") for uri in DeltaTable(str(StorageLayout.of(source.storage).txlog)).file_uris()]
    baseline, _ = baseline_copy(spark, files, workdir / "baseline-txlog")
    target = config.load(str(write_config(
        workdir, "target", bootstrap,
        f"<Bootstrap><Topic><Name>.*</Name><MessageType>json</MessageType></Topic><Transport>"
        f"<Type>amps-replication</Type><InetAddr>{workdir / 'source'}</InetAddr></Transport></Bootstrap>")))
    layout = StorageLayout.of(target.storage)
    started = time.perf_counter()
    result = boot.run(target, layout)
    seconds = time.perf_counter() - started
    assert result.rows == args.rows, result
    return [f"bootstrap of {args.rows:,} txlog rows:",
            format_table(["", "seconds", "rows/s"], [
                ("bootstrap", f"{seconds:.1f}", f"{args.rows / seconds:,.0f}"),
                ("baseline: Spark read + deltalake write", f"{baseline:.1f}", f"{args.rows / baseline:,.0f}")]),
            f"bootstrap / baseline (speed): {baseline / seconds:.2f} (target >= 0.7)"]


def input_files(directory: Path, rows: int, per_file: int = 250_000) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for n, first in enumerate(range(0, rows, per_file)):
        ids = pa.array(range(first, min(rows, first + per_file)), pa.int64())
        table = pa.table({"id": ids, "symbol": pa.repeat(pa.scalar("ACME"), len(ids)),
                          "qty": pa.compute.add(ids, 7), "desk": pa.repeat(pa.scalar("equities-nyc"), len(ids)),
                          "note": pa.repeat(pa.scalar("backfilled order flow with a body of about 200 bytes"),
                                            len(ids))})
        path = directory / f"part-{n:04d}.parquet"
        pq.write_table(table, path)
        out.append(str(path))
    return out


def backfill_once(spark, workdir: Path, bootstrap: str, files: list[str], rows: int) -> tuple[float, float, float]:
    """Backfill ``files`` into a new running instance: (seconds until it stored every row, until the inbox held
    them, CPU seconds of this process and its children until it stored every row)."""
    from replication import backfill, config
    from replication.destination.resync import stored_per_publisher
    from replication.instance import Instance
    from replication.storage.layout import StorageLayout

    cfg = config.load(str(write_config(workdir, f"running-{uuid.uuid4().hex[:5]}", bootstrap)))
    inst = Instance(cfg, spark).start()
    layout = StorageLayout.of(cfg.storage)
    try:
        # a running instance: its ingest query has planned a first trigger (sources open, planners started)
        wait_until(lambda: bool(inst.query.recentProgress), timeout=300, interval=0.05,
                   what="the instance's ingest query to run")
        started, cpu = time.perf_counter(), tree_cpu_seconds()
        result = backfill.run(spark, cfg, files, backfill.Options("bench", "parquet", topic="/orders"))
        written = time.perf_counter() - started
        wait_until(lambda: stored_per_publisher(layout).get("bench", 0) >= rows, timeout=1800,
                   interval=0.02, what="the instance to store every backfilled row")
        seconds, cpu = time.perf_counter() - started, tree_cpu_seconds() - cpu
    finally:
        inst.stop()
    assert result.stored == rows, result
    return seconds, written, cpu


def backfill_phase(spark, workdir: Path, bootstrap: str, args) -> list[str]:
    files = input_files(workdir / "backfill-input", args.backfill_rows)
    # The first backfill of a Spark application also starts its Python workers (the baseline has none):
    # reported on its own. Then backfill and baseline take turns, ``--rounds`` times; each side's fastest run
    # counts (this machine's timings swing by tens of percent from one minute to the next, and the JIT keeps
    # speeding up both for several runs). The baseline runs once before everything: its first pays the
    # process's Spark warm-up.
    warm_up = baseline_copy(spark, files, workdir / "baseline-backfill-0")
    first, first_written, _ = backfill_once(spark, workdir, bootstrap, files, args.backfill_rows)
    runs, baselines = [], []
    for n in range(1, args.rounds + 1):
        runs.append(backfill_once(spark, workdir, bootstrap, files, args.backfill_rows))
        baselines.append(baseline_copy(spark, files, workdir / f"baseline-backfill-{n}"))
    baseline, baseline_cpu = min(baselines)
    second, written, cpu = min(runs)
    n = args.backfill_rows
    return [f"backfill of {n:,} Parquet rows into a running instance (stored in its txlog):",
            format_table(["", "seconds", "rows/s"], [
                ("first backfill of the application", f"{first:.2f}", f"{n / first:,.0f}"),
                ("  of which writing the parts", f"{first_written:.2f}", ""),
                (f"backfill (files -> staged parts -> txlog), best of {args.rounds}", f"{second:.2f}",
                 f"{n / second:,.0f}"),
                ("  of which writing the parts", f"{written:.2f}", ""),
                (f"baseline: Spark read + deltalake write, best of {args.rounds}", f"{baseline:.2f}",
                 f"{n / baseline:,.0f}")]),
            "backfill runs, in order (s): " + ", ".join(f"{r:.2f}" for r, _, _ in runs),
            f"baseline runs, in order (s): {warm_up[0]:.2f} (warm-up), " + ", ".join(f"{b:.2f}" for b, _ in baselines),
            f"CPU seconds (this process, its JVM, Python workers and broker): fastest backfill {cpu:.2f}, fastest "
            f"baseline {baseline_cpu:.2f} (work: {cpu / baseline_cpu:.1f}x the baseline's)",
            f"backfill / baseline (speed): {baseline / second:.2f} (first of the application: "
            f"{baseline / first:.2f}; target >= 0.7)"]


def peak_rss_mb(cmd: list[str]) -> tuple[float, int]:
    """Run ``cmd``; the peak resident memory of its own process (``VmHWM``, MB, not its JVM's) and exit code."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0.0
    while proc.poll() is None:
        try:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]) / 1024)
        except FileNotFoundError:
            break
        time.sleep(0.1)
    return peak, proc.wait()


def memory_phase(spark, workdir: Path, bootstrap: str, args) -> list[str]:
    rows = []
    for count in (args.memory_rows, 4 * args.memory_rows):
        directory = workdir / f"memory-{count}"
        input_files(directory, count)
        path = write_config(workdir, f"memory-{count}-{uuid.uuid4().hex[:5]}", bootstrap)
        peak, code = peak_rss_mb([sys.executable, "-m", "replication.cli", "backfill", str(path), "--input",
                                  str(directory), "--format", "parquet", "--client", "mem", "--topic", "/orders"])
        if code:
            raise SystemExit(f"replication backfill exited {code}")
        rows.append((f"{count:,}", f"{peak:,.0f}"))
    return ["peak memory of the `replication backfill` driver process (its JVM aside):",
            format_table(["input rows", "peak RSS MB"], rows)]


def command_phase(spark, workdir: Path, bootstrap: str, args) -> list[str]:
    directory = workdir / "command-input"
    input_files(directory, args.backfill_rows)
    # _JAVA_OPTIONS comes after the command line, so it overrides the command's -XX:TieredStopAtLevel=1
    variants = {"as it runs (C1 alone)": {},
                "with C2 (the JVM's default)": {"_JAVA_OPTIONS": "-XX:TieredStopAtLevel=4"}}
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(3):
        for name, env in variants.items():
            path = write_config(workdir, f"command-{uuid.uuid4().hex[:5]}", bootstrap)
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "replication.cli", "backfill", str(path), "--input", str(directory),
                            "--format", "parquet", "--client", "cmd", "--topic", "/orders"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **env}, check=True)
            seconds[name].append(time.perf_counter() - started)
    ours, c2 = (min(seconds[name]) for name in variants)
    return [f"`replication backfill` of {args.backfill_rows:,} rows into a stopped instance (the command's wall time):",
            format_table(["", "best s", "runs s"], [
                (name, f"{min(runs):.1f}", ", ".join(f"{s:.1f}" for s in runs)) for name, runs in seconds.items()]),
            f"with C2 / as it runs (time): {c2 / ours:.2f}"]


def measure(spark, workdir: Path, bootstrap: str, args) -> str:
    report = []
    for phase, fn in (("bootstrap", bootstrap_phase), ("backfill", backfill_phase), ("memory", memory_phase),
                      ("command", command_phase)):
        if phase in args.only.split(","):
            report += ["", f"== {phase}"] + fn(spark, workdir, bootstrap, args)
    return "\n".join(report)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows of the bootstrapped txlog")
    parser.add_argument("--backfill-rows", type=int, default=1_000_000)
    parser.add_argument("--memory-rows", type=int, default=1_000_000, help="the smaller input (the larger is 4x)")
    parser.add_argument("--rounds", type=int, default=4, help="backfills and baselines taking turns")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default=",".join(PHASES))
    add_kafka_arguments(parser)
    parser.add_argument("--workdir")
    args = parser.parse_args(argv)
    use_kafka_security(parser, args)
    if args.quick:
        args.rows, args.backfill_rows, args.memory_rows = 400_000, 200_000, 200_000
    args.conf = []
    run_benchmark("bootstrap", args, measure)


if __name__ == "__main__":
    main()
