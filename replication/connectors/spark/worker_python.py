"""The Python Spark starts for its Python processes: the driver's, without ``pyspark.zip`` in front.

Spark puts ``<SPARK_HOME>/python/lib/pyspark.zip`` first on the ``PYTHONPATH``
of every Python process it starts: Python workers and, at every query start,
one planner process per Python streaming source. Python cannot cache the
bytecode of modules imported from a zip, so each of those processes compiles
PySpark again: 0.78 CPU-s to import what a source runner needs, against 0.28 s
from the installed package (measured here). With a pip-installed PySpark the
zip holds the same code as the package it sits in, so leaving it out of the
path changes nothing but the start-up cost. On 2 cores that is the difference
between an ingest query (re)starting in well under a second or in several.

:func:`interpreter` writes a small POSIX ``sh`` launcher that drops exactly
that zip from ``PYTHONPATH`` and ``exec``\\ s the interpreter; the SparkSession
is built with it as ``PYSPARK_PYTHON``. When PySpark comes from elsewhere (a
Spark distribution, Databricks) there is no such zip to skip and the
interpreter is used as it is.

Run ``python -m replication.connectors.spark.worker_python`` to print the launcher's path
(``spark-submit.sh`` does, for ``PYSPARK_PYTHON``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

_LAUNCHER = """#!/bin/sh
# Written by replication.connectors.spark.worker_python: runs {python} without PySpark's zip
# on PYTHONPATH; the same PySpark is installed, compiled, beside it.
skip_a={zip}
skip_b={real_zip}
kept=
sep=
old_ifs=$IFS
IFS=:
set -f
for entry in ${{PYTHONPATH-}}; do
  if [ "$entry" != "$skip_a" ] && [ "$entry" != "$skip_b" ]; then
    kept="$kept$sep$entry"
    sep=:
  fi
done
set +f
IFS=$old_ifs
if [ -n "$kept" ]; then
  PYTHONPATH=$kept
  export PYTHONPATH
else
  unset PYTHONPATH
fi
exec {python} "$@"
"""


def pyspark_zip() -> Path | None:
    """The ``pyspark.zip`` shipped inside the installed PySpark package, if there is one."""
    try:
        import pyspark
    except ImportError:
        return None
    candidate = Path(pyspark.__file__).resolve().parent / "python" / "lib" / "pyspark.zip"
    return candidate if candidate.is_file() else None


def launcher_text(python: str, zip_path: Path) -> str:
    return _LAUNCHER.format(
        python=shlex.quote(python),
        zip=shlex.quote(str(zip_path)),
        real_zip=shlex.quote(os.path.realpath(zip_path)),
    )


def interpreter(python: str | None = None) -> str:
    """What to give Spark as ``PYSPARK_PYTHON``: a launcher for ``python`` (default: this one), or ``python``."""
    python = python or sys.executable
    zip_path = pyspark_zip()
    if zip_path is None or os.name != "posix":
        return python
    text = launcher_text(python, zip_path)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    try:
        target = cache_dir() / f"python-{digest}"
        if not target.is_file() or target.read_text() != text:
            _write_executable(target, text)
    except OSError as exc:  # e.g. a read-only home and temp dir: slower starts, nothing worse
        log.warning("cannot write the Python worker launcher (%s); Spark's Python processes start slower", exc)
        return python
    return str(target)


def cache_dir() -> Path:
    for base in (os.environ.get("XDG_CACHE_HOME"), str(Path.home() / ".cache"), tempfile.gettempdir()):
        if not base:
            continue
        directory = Path(base) / "replication"
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(directory, os.W_OK):
            return directory
    raise OSError("no writable cache or temporary directory")


def _write_executable(target: Path, text: str) -> None:
    # Write then rename: instances starting at once never run a half-written file.
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


if __name__ == "__main__":
    print(interpreter())
