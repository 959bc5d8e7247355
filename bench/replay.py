"""Benchmark: replay of a txlog against bare reads of the same files, side by side (issue 12, "Performance").

One run builds txlogs of synthetic ~200-byte JSON orders (as an instance
stores them, one Delta commit per ``--chunk`` rows) and prints:

1. a full replay of the 1M-row txlog, ``count()`` with a content filter on a
   JSON field (``/id > N/2``), through ``replay.txlog`` vs a bare
   ``spark.read.parquet`` of the same files with the same filter column
   (``expressions.to_spark_column``); and, for reference, with a hand-written
   ``get_json_object`` filter. Ratio = bare time / replay time (target >= 0.8),
   in wall time and in CPU time of the benchmark's processes (steadier on a
   machine shared with other work);
2. seeking: the last 1,000 messages by bookmark from a 5M-row and a 100k-row
   txlog, without Spark (what ``replication replay`` does: open the log,
   find the bookmark from the file statistics, read and filter) and through
   ``replay.txlog``. Ratio = 5M time / 100k time (target <= 2);
3. ``replication replay`` (a new process, no Spark) time to its first message
   on the 1M-row txlog, from the beginning and from a bookmark near the end
   (target <= 2 s).

Each contender runs ``--repeat`` times, alternating; the best time is kept::

    .venv/bin/python bench/replay.py --quick     # 200k / 1M rows, ~3 minutes
    .venv/bin/python bench/replay.py             # 1M / 5M rows
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("REPLICATION_SPARK_LOG_LEVEL", "ERROR")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import build_txlog, format_table, instance_config  # noqa: E402
from timing import tree_cpu_seconds  # noqa: E402

FILTER = "/id > {half}"
SEEK_ROWS = 1000


def built(workdir: Path, name: str, rows: int, args) -> object:
    """An instance config whose txlog holds ``rows`` synthetic rows (built once per workdir)."""
    cfg = instance_config(workdir, name, "localhost:9092", inbox=False)  # the broker is never contacted
    if not (workdir / name / "txlog").exists():
        started = time.perf_counter()
        build_txlog(cfg, rows, args.publishers, args.chunk)
        print(f"  built a txlog of {rows:,} rows in {time.perf_counter() - started:.1f}s", flush=True)
    return cfg


def best(runs: dict[str, callable], repeat: int) -> dict[str, float]:
    """Best wall time of each contender over ``repeat`` rounds, contenders alternating within a round;
    also ``<name> cpu``: the best CPU time of the benchmark's processes (driver, JVM, Python workers),
    which other work on the machine disturbs much less than wall time."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(repeat):
        order = list(runs) if r % 2 == 0 else list(runs)[::-1]
        for name in order:
            started, cpu_before = time.perf_counter(), tree_cpu_seconds()
            runs[name]()
            times[name].append(time.perf_counter() - started)
            cpu[name].append(tree_cpu_seconds() - cpu_before)
    return {**{name: min(values) for name, values in times.items()},
            **{f"{name} cpu": min(values) for name, values in cpu.items()}}


def full_replay(spark, cfg, rows: int, args) -> list[list[str]]:
    from deltalake import DeltaTable
    from pyspark.sql import functions as F

    from replication import expressions, replay
    from replication.storage.layout import StorageLayout

    text = FILTER.format(half=rows // 2)
    expected = rows - rows // 2
    files = DeltaTable(str(StorageLayout.of(cfg.storage).txlog)).file_uris()
    same_filter = expressions.to_spark_column(expressions.parse(text))
    by_hand = F.get_json_object(F.col("data").cast("string"), "$.id").cast("long") > rows // 2

    def through_replay() -> None:
        assert replay.txlog(cfg, filter=text, spark=spark).count() == expected

    def bare(condition):
        def run() -> None:
            assert spark.read.parquet(*files).where(condition).count() == expected
        return run

    through_replay()  # warm: Spark's code paths, the files in the page cache
    t = best({"replay": through_replay, "bare": bare(same_filter), "by hand": bare(by_hand)}, args.repeat)
    def row(label: str, key: str, ratio: str) -> list[str]:
        return [label, f"{t[key]:.2f} s", f"{t[key + ' cpu']:.2f} s", f"{rows / t[key]:,.0f} rows/s", ratio]

    return [
        row(f"replay.txlog, count where {text}", "replay", ""),
        row("bare spark.read.parquet, same filter column", "bare",
            f"{t['bare'] / t['replay']:.2f} (CPU {t['bare cpu'] / t['replay cpu']:.2f}), target >= 0.8"),
        row("bare, get_json_object by hand (reference)", "by hand",
            f"{t['by hand'] / t['replay']:.2f} (CPU {t['by hand cpu'] / t['replay cpu']:.2f})"),
    ]


def seeking(spark, small, big, sizes: tuple[int, int], args) -> list[list[str]]:
    from replication import replay

    def bookmark_before_last(cfg) -> str:
        log = replay.open_txlog(cfg)
        end = log.committed_seq()
        [rows] = list(log.read(end - SEEK_ROWS - 1, end - SEEK_ROWS))
        return rows.column("bookmark")[0].as_py()

    def python(cfg, mark):
        def run() -> None:
            log = replay.open_txlog(cfg)  # a fresh open each time: what a new `replication replay` pays
            start, _ = log.range(mark)
            selection = replay.Selection.of(".*", None)
            got = sum(int(selection.mask(rows).sum()) for rows in log.read(start, log.committed_seq()))
            assert got == SEEK_ROWS
        return run

    def spark_run(cfg, mark):
        def run() -> None:
            assert replay.txlog(cfg, bookmark=mark, spark=spark).count() == SEEK_ROWS
        return run

    marks = {"small": bookmark_before_last(small), "big": bookmark_before_last(big)}
    t = best({"py small": python(small, marks["small"]), "py big": python(big, marks["big"]),
              "spark small": spark_run(small, marks["small"]), "spark big": spark_run(big, marks["big"])},
             args.repeat)
    out = []
    for kind, label in (("py", "without Spark (replication replay)"), ("spark", "replay.txlog(...).count()")):
        small_s, big_s = t[f"{kind} small"], t[f"{kind} big"]
        out.append([f"last {SEEK_ROWS:,} by bookmark, {label}", f"{sizes[0]:,} rows: {small_s * 1e3:.0f} ms",
                    f"{sizes[1]:,} rows: {big_s * 1e3:.0f} ms", f"{big_s / small_s:.2f}x (target <= 2)"])
    return out


def first_message(cfg, args) -> list[list[str]]:
    from replication import replay

    log = replay.open_txlog(cfg)
    end = log.committed_seq()
    [rows] = list(log.read(end - 10, end - 9))
    near_end = rows.column("bookmark")[0].as_py()
    out = []
    starts = (("from the beginning", []), ("from a bookmark 10 rows before the end", ["--bookmark", near_end]))
    for label, extra in starts:
        times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "-m", "replication.cli", "replay", str(cfg.source.file),
                                     "--topic", ".*", *extra], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            line = proc.stdout.readline()
            times.append(time.perf_counter() - started)
            proc.kill()
            proc.wait()
            assert line.startswith(b"{"), line
        out.append([f"replication replay, first message {label}", f"best {min(times):.2f} s",
                    f"worst {max(times):.2f} s", "target <= 2 s"])
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="200k-row full replay, 1M-row big txlog")
    parser.add_argument("--rows", type=int, default=None, help="rows of the full-replay txlog (1M)")
    parser.add_argument("--small", type=int, default=100_000, help="rows of the small seek txlog")
    parser.add_argument("--big", type=int, default=None, help="rows of the big seek txlog (5M)")
    parser.add_argument("--chunk", type=int, default=20_000, help="rows per Delta commit (one file each)")
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3, help="rounds per contender (best kept)")
    parser.add_argument("--only", default="full,seek,cli", help="comma-separated subset of full,seek,cli")
    parser.add_argument("--workdir", help="keep the txlogs here and reuse them (default: a temporary directory)")
    args = parser.parse_args(argv)
    args.rows = args.rows or (200_000 if args.quick else 1_000_000)
    args.big = args.big or (1_000_000 if args.quick else 5_000_000)
    return args


def main(argv: list[str] | None = None) -> None:
    from replication.connectors.spark.session import session

    args = parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-replay-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        full = built(workdir, f"replay-{args.rows}", args.rows, args)
        small = built(workdir, f"replay-{args.small}", args.small, args)
        big = full if args.big == args.rows else built(workdir, f"replay-{args.big}", args.big, args)
        spark = session("bench-replay")
        phases = set(args.only.split(","))
        report = []
        if "full" in phases:
            report.append(format_table(["full replay", "wall", "CPU", "rate (wall)", "bare / replay"],
                                       full_replay(spark, full, args.rows, args)))
        if "seek" in phases:
            report.append(format_table(["seek", "small", "big", "big / small"],
                                       seeking(spark, small, big, (args.small, args.big), args)))
        if "cli" in phases:
            report.append(format_table(["CLI", "time", "", ""], first_message(full, args)))
        print("\n\n".join(report), flush=True)
        spark.stop()
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
