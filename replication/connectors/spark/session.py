"""One place that builds the SparkSession the instances share."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from replication.connectors import jvm
from replication.connectors.spark import class_archive, local_fs
from replication.connectors.spark.worker_python import interpreter

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

T = TypeVar("T")

#: Settings that suit a streaming job of many small micro-batches on few cores.
DEFAULT_CONF: dict[str, str] = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    # delta-spark rebuilds a table's state (its log replayed) in this many tasks, 50 by default: on a
    # small table each task is mostly scheduling. A user's OPTIMIZE of a txlog beside a running pair took
    # ~50 s at 50 and ~30 s at 2; the delta-spark tests ran in 90 s instead of 140.
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
    "spark.python.worker.reuse": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.memory": "4g",
    # Offset and commit logs through Hadoop FileSystem rename rather than
    # FileContext: the same write-then-rename, without .crc side files; the two
    # checkpoint writes of a micro-batch take ~35 ms instead of ~100 ms here.
    "spark.sql.streaming.checkpointFileManagerClass":
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
    # An idle query asks its sources for new data every pollingDelay. At the
    # default 10 ms an idle pair used 0.52 of 2 cores, at 50 ms 0.21; a busy
    # query never waits for it, so latency under load is unchanged
    # (bench/replicate.py, idle pair column).
    "spark.sql.streaming.pollingDelay": "50ms",
}

#: JVM options of a Spark application that lives for one command (``replication backfill``). Its rows
#: are handled in Python tasks and its JVM only schedules them, so C2's compilations of Spark's own
#: code are CPU it never earns back: C1 alone takes a 1M-row backfill command from ~6.5 to ~5.7 s
#: (bench/bootstrap.py, command). Instances keep C2: their Kafka reads pass through the JVM, and with
#: C1 alone their ingest fell from 140k to 93k rows/s (bench/ingest.py).
SHORT_LIVED_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"


def _launches_jvm() -> bool:
    """True when building a session here starts Spark's JVM (not under spark-submit, no context yet)."""
    from pyspark import SparkContext

    return SparkContext._gateway is None and "PYSPARK_GATEWAY_PORT" not in os.environ


def _without_sigterm(launch: Callable[[], T]) -> T:
    """Run ``launch`` (which starts Spark's JVM) with SIGTERM ignored, so that the JVM and every process
    it starts (Python workers, source runners) keep ignoring it.

    A supervisor stopping a service signals the whole process group (systemd: the whole cgroup). The
    driver must stop the streaming queries first and let the JVM go last; a JVM that took the signal
    itself would stop under running queries, and the driver would log py4j tracebacks. An ignored
    signal stays ignored across ``exec`` and HotSpot keeps it so (as PySpark does for Ctrl-C, SIGINT);
    the driver's own handler (:mod:`replication.runner`) is put back at once. Off the main thread
    Python cannot change handlers: the JVM is then started as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        return launch()
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        return launch()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _with_java_options(options: str, launch: Callable[[], T]) -> T:
    """Run ``launch`` with ``options`` added to ``SPARK_SUBMIT_OPTS``, which Spark's launcher puts on the
    command line of a client-mode driver's JVM. Unlike ``spark.driver.extraJavaOptions`` it replaces no
    options the user gave (in spark-defaults.conf or ``PYSPARK_SUBMIT_ARGS``)."""
    given = os.environ.get("SPARK_SUBMIT_OPTS")
    os.environ["SPARK_SUBMIT_OPTS"] = f"{given or ''} {options}".strip()
    try:
        return launch()
    finally:
        if given is None:
            del os.environ["SPARK_SUBMIT_OPTS"]
        else:
            os.environ["SPARK_SUBMIT_OPTS"] = given


def session(app_name: str = "replication", *, master: str | None = None,
            short_lived: bool = False, object_storage: bool = False) -> SparkSession:
    """Return the active SparkSession, or build one with :data:`DEFAULT_CONF`.

    A session this builds (its JVM started here) also has delta-spark and Spark's Kafka source on its
    classpath, with Delta's SQL extension and catalog (:func:`replication.connectors.jvm.spark_conf`).
    Settings given by ``spark-submit`` (``--master``, ``--conf``) win: defaults only fill gaps.
    ``short_lived``: the session serves one command and ends with it, so a JVM started here gets
    :data:`SHORT_LIVED_JAVA_OPTIONS`. ``object_storage``: an instance of the session keeps its storage on
    S3, so Hadoop's S3A filesystem is added (``jvm/lib/s3a``) with this process's endpoint and region.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    # Python workers (data sources, foreachBatch helpers) must run the same
    # interpreter as the driver, or they will not find this package; the
    # launcher also spares each of them compiling PySpark (see worker_python).
    if "PYSPARK_PYTHON" not in os.environ:
        os.environ["PYSPARK_PYTHON"] = interpreter(sys.executable)
    from pyspark import SparkConf, SparkContext

    if not _launches_jvm():
        # under spark-submit: connect to its JVM first, or SparkConf() is an empty dict that knows nothing of
        # --master and --conf, and every default below would override what the user gave
        SparkContext._ensure_initialized()
    given = SparkConf()  # under spark-submit: its --master and --conf values
    builder = SparkSession.builder.appName(app_name)
    if master or not given.contains("spark.master"):
        master = master or os.environ.get("REPLICATION_SPARK_MASTER", "local[2]")
        builder = builder.master(master)
    for key, value in DEFAULT_CONF.items():
        if not given.contains(key):
            builder = builder.config(key, value)
    if _launches_jvm():
        # delta-spark and Spark's Kafka source (jvm/pom.xml): jars can only be added before the JVM
        # starts; under spark-submit, spark-submit.sh passes them (python -m replication.launch).
        for key, value in jvm.spark_conf(object_storage=object_storage).items():
            if key == "spark.jars" and given.contains(key):
                value = f"{given.get(key)},{value}"
            if key == "spark.jars" or not given.contains(key):
                builder = builder.config(key, value)
    driver_master = master or given.get("spark.master", "")
    driver_class_path = given.get("spark.driver.extraClassPath", None)
    if _launches_jvm() and not given.contains("spark.hadoop.fs.file.impl"):
        # Checkpoint files without a forked chmod each (local_fs); the class
        # path can only be set here, before this process starts the JVM.
        for key, value in local_fs.spark_conf(driver_master, driver_class_path).items():
            builder = builder.config(key, value)
            if key == "spark.driver.extraClassPath":
                driver_class_path = value
    if not _launches_jvm():
        spark = builder.getOrCreate()
    else:
        # the class archive (when the install built it) and, for one command, C1 alone
        archive = class_archive.java_options(driver_master, driver_class_path)
        options = " ".join(o for o in (archive, SHORT_LIVED_JAVA_OPTIONS if short_lived else "") if o)
        spark = _without_sigterm(lambda: _with_java_options(options, builder.getOrCreate))
    spark.sparkContext.setLogLevel(os.environ.get("REPLICATION_SPARK_LOG_LEVEL", "WARN"))
    return spark
