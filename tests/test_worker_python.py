"""Spark's Python processes import the installed, compiled PySpark, not the zip Spark puts first on their path."""

from __future__ import annotations

import os
import subprocess
import sys

from replication.connectors.spark import worker_python

PRINT_PATH = "import os; print(repr(os.environ.get('PYTHONPATH')))"


def test_the_launcher_drops_only_pysparks_zip_and_runs_this_interpreter():
    zip_path = worker_python.pyspark_zip()
    assert zip_path is not None  # pip-installed PySpark ships it
    launcher = worker_python.interpreter(sys.executable)
    assert launcher != sys.executable and os.access(launcher, os.X_OK)

    def path_seen(pythonpath: str | None) -> str:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if pythonpath is not None:
            env["PYTHONPATH"] = pythonpath
        return subprocess.run([launcher, "-c", PRINT_PATH], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()

    assert path_seen(f"/opt/a:{zip_path}:/opt/with space") == repr("/opt/a:/opt/with space")
    assert path_seen(str(zip_path)) == "None"
    assert path_seen(None) == "None"
    assert path_seen("/opt/a:/opt/other.zip") == repr("/opt/a:/opt/other.zip")
    prefix = subprocess.run([launcher, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert prefix == sys.prefix  # the same (virtual) environment


def test_the_same_launcher_is_reused_and_rewritten_when_damaged():
    first = worker_python.interpreter(sys.executable)
    assert worker_python.interpreter(sys.executable) == first
    with open(first, "w") as damaged:
        damaged.write("#!/bin/sh\nexit 3\n")
    assert worker_python.interpreter(sys.executable) == first
    assert subprocess.run([first, "-c", "pass"]).returncode == 0


def test_spark_python_workers_import_the_installed_pyspark(spark):
    def where(batches):
        import pyarrow as pa
        import pyspark

        for _ in batches:
            yield pa.RecordBatch.from_pydict({"file": [pyspark.__file__]})

    files = {row.file for row in spark.range(1).mapInArrow(where, "file string").collect()}
    assert files and not any(".zip" in f for f in files), files
