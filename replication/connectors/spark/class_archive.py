"""A class-data sharing archive of the Spark driver's classes: an instance's JVM starts ~3 s sooner.

A driver JVM loads and verifies some 17,000 classes (Spark, Delta, Hadoop) before its first micro-batch;
on 2 cores that is most of the 9 s from ``session()`` to a first Spark job. HotSpot can map them from an
archive instead (class-data sharing, ``-XX:SharedArchiveFile``): measured here, session start 6.4 → 4.3 s
and session + first job 9.1 → 6.0 s. A restarted or failed-over instance is back that much sooner.

The README's install command builds it once (``python -m replication.connectors.spark.class_archive``,
about a minute): a session of this package lists the classes it loads, then a JVM of its own dumps them
with the same class path and options. The archive is named after what HotSpot checks before it maps one:
the ``java``, and each jar of the driver's class path (pyspark's and the extra class path) with its size and
modification time. Anything else (an upgrade, a reinstall, another ``spark.driver.extraClassPath``) names
another archive, not built yet: the JVM starts without one, and the command builds it again. Only drivers
of local masters use it: elsewhere the driver runs on another machine or with another class path.
The file is synced and renamed into place only once the dump succeeded: a torn archive would crash the JVM
that maps it. ``REPLICATION_CLASS_ARCHIVE=off`` starts JVMs without it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from replication.connectors import jvm
from replication.connectors.jvm import JvmArtifactsMissing, lib_dir

#: ``off``: never use the archive.
SWITCH_ENV = "REPLICATION_CLASS_ARCHIVE"

#: What the listing session runs: the classes an instance loads at start (a session with Delta, a Spark job,
#: a Delta write and read, a streaming query), then the class path and JVM options to dump them with.
_LISTING = """
import json, sys
from replication.connectors.spark.class_archive import archive_path
from replication.connectors.spark.session import session
spark = session("class-archive", master="local[2]")
table = sys.argv[1]
spark.range(100).write.format("delta").mode("overwrite").save(table + "/batch")
spark.read.format("delta").load(table + "/batch").count()
query = (spark.readStream.format("delta").load(table + "/batch").writeStream.format("delta")
         .option("checkpointLocation", table + "/checkpoint").trigger(availableNow=True).start(table + "/stream"))
query.awaitTermination()
system = spark._jvm.java.lang.System
options = list(spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
extra = spark.sparkContext.getConf().get("spark.driver.extraClassPath", None)
print("CLASS-ARCHIVE " + json.dumps({"classpath": system.getProperty("java.class.path"),
                                     "java": system.getProperty("java.home"), "options": options,
                                     "archive": str(archive_path(extra))}))
"""


def java_binary() -> Path | None:
    """The ``java`` JVMs start with (:func:`replication.connectors.jvm.java`), resolved; None without one."""
    try:
        return Path(jvm.java()).resolve()
    except JvmArtifactsMissing:
        return None


def _class_path_stamp(extra_class_path: str | None) -> str:
    """Each jar of a local driver's class path with its size and modification time (HotSpot checks them)."""
    import pyspark

    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    entries = [*jars, *(Path(p) for p in (extra_class_path or "").split(os.pathsep) if p)]
    stamps = []
    for entry in entries:
        try:
            stat = entry.stat()
            stamps.append(f"{entry}|{stat.st_size}|{stat.st_mtime_ns}")
        except OSError:
            stamps.append(f"{entry}|missing")
    return "\n".join(stamps)


def archive_path(extra_class_path: str | None = None) -> Path | None:
    """Where the archive for this ``java`` and a local driver with ``extra_class_path`` (its
    ``spark.driver.extraClassPath``) is, or would be; None without a ``java``."""
    import pyspark

    java = java_binary()
    if java is None:
        return None
    stat = java.stat()
    key = hashlib.sha1(f"{java}|{stat.st_size}|{stat.st_mtime_ns}|{pyspark.__version__}\n"
                       f"{_class_path_stamp(extra_class_path)}".encode()).hexdigest()[:16]
    return lib_dir() / "class-archive" / f"spark-{pyspark.__version__}-{key}.jsa"


def java_options(master: str, extra_class_path: str | None = None) -> str:
    """The option that maps the archive into the JVM of a driver on ``master`` with ``extra_class_path``, or ""
    (not a local master, not built for that class path, or switched off)."""
    if os.environ.get(SWITCH_ENV, "").lower() == "off" or not master.startswith("local"):
        return ""
    path = archive_path(extra_class_path)
    return f"-XX:SharedArchiveFile={path}" if path is not None and path.is_file() else ""


def local_driver_class_path() -> str | None:
    """The extra class path a session of this package gets on a local master (the local filesystem's jar)."""
    from replication.connectors.spark import local_fs

    return local_fs.spark_conf("local[2]").get("spark.driver.extraClassPath")


def build(*, log=print) -> Path:
    """List the classes a session loads, dump them into the archive, and rename it into place."""
    if java_binary() is None:
        raise RuntimeError("no java found (JAVA_HOME or PATH): Spark needs Java 17 or newer")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="class-archive-") as scratch:
        classes = Path(scratch) / "classes.lst"
        env = dict(os.environ, SPARK_SUBMIT_OPTS=f"-XX:DumpLoadedClassList={classes}",
                   REPLICATION_SPARK_LOG_LEVEL="ERROR")
        env[SWITCH_ENV] = "off"
        log("class archive: listing the classes a session loads ...")
        listing = subprocess.run([sys.executable, "-c", _LISTING, str(Path(scratch) / "tables")], env=env,
                                 capture_output=True, text=True, timeout=600)
        found = [line for line in listing.stdout.splitlines() if line.startswith("CLASS-ARCHIVE ")]
        if listing.returncode != 0 or not found:
            raise RuntimeError(f"the session listing the classes failed: {listing.stderr.strip()[-2000:]}")
        listed = json.loads(found[-1].removeprefix("CLASS-ARCHIVE "))
        target = Path(listed["archive"])
        target.parent.mkdir(parents=True, exist_ok=True)
        options = [o for o in listed["options"]
                   if not o.startswith(("-XX:DumpLoadedClassList", "-XX:SharedArchiveFile"))]
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        log(f"class archive: dumping {sum(1 for _ in classes.open())} classes ...")
        try:
            dump = subprocess.run([str(Path(listed["java"]) / "bin" / "java"), "-Xshare:dump",
                                   f"-XX:SharedClassListFile={classes}", f"-XX:SharedArchiveFile={partial}",
                                   "-cp", listed["classpath"], *options], capture_output=True, text=True, timeout=900)
            if dump.returncode != 0 or not partial.is_file():
                raise RuntimeError(f"the JVM could not dump the archive: {dump.stderr.strip()[-2000:]}")
            with open(partial, "rb") as written:
                os.fsync(written.fileno())  # (on disk before its name is: a torn archive crashes the JVM)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    folder = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    log(f"class archive: {target} ({target.stat().st_size >> 20} MiB) in {time.monotonic() - started:.0f} s")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replication.connectors.spark.class_archive",
                                     description="Build the class-data sharing archive Spark driver JVMs start "
                                                 "from (once per java and pyspark).")
    parser.add_argument("--if-missing", action="store_true", help="do nothing when it is built already")
    parser.add_argument("--java-options", metavar="'MASTER [EXTRA_CLASS_PATH]'",
                        help="print the option that maps the archive into a driver on MASTER with that extra class "
                             "path (nothing when it does not apply or is not built)")
    args = parser.parse_args(argv)
    if args.java_options is not None:
        master, _, extra = args.java_options.partition(" ")
        print(java_options(master, extra or None))
        return 0
    path = archive_path(local_driver_class_path())
    if args.if_missing and path is not None and path.is_file():
        print(f"class archive: {path} is built", file=sys.stderr)
        return 0
    try:
        build(log=lambda line: print(line, file=sys.stderr))
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"class archive: not built ({exc}); Spark sessions start without it", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
