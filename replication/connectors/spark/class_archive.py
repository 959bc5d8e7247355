"""A class-data sharing archive of the Spark driver's classes: an instance's JVM starts ~3 s sooner.

A driver JVM loads and verifies some 17,000 classes (Spark, Delta, Hadoop) before its first micro-batch;
on 2 cores that is most of the 9 s from ``session()`` to a first Spark job. HotSpot can map them from an
archive instead (class-data sharing, ``-XX:SharedArchiveFile``): measured here, session start 6.4 → 4.3 s
and session + first job 9.1 → 6.0 s. A restarted or failed-over instance is back that much sooner.

The README's install command builds it once (``python -m replication.connectors.spark.class_archive``,
about a minute): a session of this package lists the classes it loads, then a JVM of its own dumps them
with the same class path and options. The archive is named after the ``java`` and the pyspark it was made
for, so an upgrade of either simply leaves it unused (run the command again). A JVM whose class path no
longer matches the archive's (another ``spark.driver.extraClassPath``) starts without it, as before.
The file is renamed into place only once the dump succeeded: a torn archive would crash the JVM that maps it.
``REPLICATION_CLASS_ARCHIVE=off`` starts JVMs without it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from replication.connectors.jvm import lib_dir

#: ``off``: never use the archive.
SWITCH_ENV = "REPLICATION_CLASS_ARCHIVE"

#: What the listing session runs: the classes an instance loads at start (a session with Delta, a Spark job,
#: a Delta write and read, a streaming query), then the class path and JVM options to dump them with.
_LISTING = """
import json, sys
from replication.connectors.spark.session import session
spark = session("class-archive")
table = sys.argv[1]
spark.range(100).write.format("delta").mode("overwrite").save(table + "/batch")
spark.read.format("delta").load(table + "/batch").count()
query = (spark.readStream.format("delta").load(table + "/batch").writeStream.format("delta")
         .option("checkpointLocation", table + "/checkpoint").trigger(availableNow=True).start(table + "/stream"))
query.awaitTermination()
system = spark._jvm.java.lang.System
options = list(spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
print("CLASS-ARCHIVE " + json.dumps({"classpath": system.getProperty("java.class.path"),
                                     "java": system.getProperty("java.home"), "options": options}))
"""


def java_binary() -> Path | None:
    """The ``java`` Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def archive_path() -> Path | None:
    """Where the archive for this ``java`` and this pyspark is (or would be); None without a ``java``."""
    import pyspark

    java = java_binary()
    if java is None:
        return None
    stat = java.stat()
    key = hashlib.sha1(f"{java}|{stat.st_size}|{stat.st_mtime_ns}|{pyspark.__version__}|"
                       f"{Path(pyspark.__file__).parent}".encode()).hexdigest()[:16]
    return lib_dir() / "class-archive" / f"spark-{pyspark.__version__}-{key}.jsa"


def java_options() -> str:
    """The driver JVM option that maps the archive, or "" (none built, or switched off)."""
    if os.environ.get(SWITCH_ENV, "").lower() == "off":
        return ""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path}" if path is not None and path.is_file() else ""


def build(*, log=print) -> Path:
    """List the classes a session loads, dump them into the archive, and rename it into place."""
    target = archive_path()
    if target is None:
        raise RuntimeError("no java found (JAVA_HOME or PATH): Spark needs Java 17 or newer")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="class-archive-") as scratch:
        classes = Path(scratch) / "classes.lst"
        env = dict(os.environ, SPARK_SUBMIT_OPTS=f"-XX:DumpLoadedClassList={classes}",
                   REPLICATION_SPARK_LOG_LEVEL="ERROR")
        env[SWITCH_ENV] = "off"
        started = time.monotonic()
        log("class archive: listing the classes a session loads ...")
        listing = subprocess.run([sys.executable, "-c", _LISTING, str(Path(scratch) / "tables")], env=env,
                                 capture_output=True, text=True, timeout=600)
        found = [line for line in listing.stdout.splitlines() if line.startswith("CLASS-ARCHIVE ")]
        if listing.returncode != 0 or not found:
            raise RuntimeError(f"the session listing the classes failed: {listing.stderr.strip()[-2000:]}")
        jvm = json.loads(found[-1].removeprefix("CLASS-ARCHIVE "))
        options = [o for o in jvm["options"] if not o.startswith(("-XX:DumpLoadedClassList", "-XX:SharedArchiveFile"))]
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        log(f"class archive: dumping {sum(1 for _ in classes.open())} classes ...")
        dump = subprocess.run([str(Path(jvm["java"]) / "bin" / "java"), "-Xshare:dump",
                               f"-XX:SharedClassListFile={classes}", f"-XX:SharedArchiveFile={partial}",
                               "-cp", jvm["classpath"], *options], capture_output=True, text=True, timeout=900)
        if dump.returncode != 0 or not partial.is_file():
            partial.unlink(missing_ok=True)
            raise RuntimeError(f"the JVM could not dump the archive: {dump.stderr.strip()[-2000:]}")
        os.replace(partial, target)
    log(f"class archive: {target} ({target.stat().st_size >> 20} MiB) in {time.monotonic() - started:.0f} s")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replication.connectors.spark.class_archive",
                                     description="Build the class-data sharing archive Spark driver JVMs start "
                                                 "from (once per java and pyspark).")
    parser.add_argument("--if-missing", action="store_true", help="do nothing when it is built already")
    parser.add_argument("--java-options", action="store_true",
                        help="print the driver JVM option that maps the archive (nothing when none is built)")
    args = parser.parse_args(argv)
    if args.java_options:
        print(java_options())
        return 0
    path = archive_path()
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
