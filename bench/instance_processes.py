"""Instances run as users run them, each its own ``replication run`` process, and what their txlogs say of it.

Shared by ``bench/cluster.py`` and ``bench/replicate_processes.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc


def start_instance(workdir: Path, cfg: Path, master: str = "local[2]", cpus: set[int] | None = None
                   ) -> subprocess.Popen:
    """``replication run cfg`` in a session of its own on Spark ``master``; its output in
    ``<workdir>/<config name>.log``. ``cpus``: the cores it may run on (its JVM and Python workers inherit
    them), as if those were its machine's; default every core."""
    env = dict(os.environ, REPLICATION_SPARK_LOG_LEVEL="ERROR", REPLICATION_SPARK_MASTER=master)
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    with open(workdir / f"{cfg.stem}.log", "ab") as log:  # (the process has its own copy of the file)
        return subprocess.Popen([sys.executable, "-m", "replication.cli", "run", str(cfg), "--log-level",
                                 "WARNING"], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=pin)


def stop_instance(proc: subprocess.Popen) -> None:
    """Ctrl-C, as an operator stops it; killed with its session after 60 s."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def stored_rows(txlog: Path) -> int:
    """Rows in the txlog's current snapshot (0 before its first commit), from the Delta log alone."""
    from deltalake import DeltaTable

    if not (txlog / "_delta_log").exists():
        return 0
    return sum(DeltaTable(str(txlog)).get_add_actions(flatten=True).column("num_records").to_pylist())


def persist_times(txlog: Path) -> pa.ChunkedArray:
    """Every row's ``persist_time``: one value per commit."""
    from deltalake import DeltaTable

    return DeltaTable(str(txlog)).to_pyarrow_table(columns=["persist_time"])["persist_time"]


def first_commit(times: pa.ChunkedArray) -> tuple[datetime, int]:
    """When the first commit of a txlog with these ``persist_time`` values was made, and its rows."""
    first = pc.min(times)
    return first.as_py(), pc.sum(pc.equal(times, first)).as_py()
