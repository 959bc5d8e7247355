"""A Spark standalone cluster on this machine: one master and N workers, from the installed pyspark.

For the tests, the benchmarks and a user trying an instance on a cluster before they have one: each
part is its own JVM (``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``), as on
real machines, with its folders under one home removed when the cluster stops. An instance reaches it with
``--master spark://...`` under spark-submit, or ``REPLICATION_SPARK_MASTER`` under ``replication run``.

::

    with StandaloneCluster(workers=2) as cluster:
        env = {**os.environ, "REPLICATION_SPARK_MASTER": cluster.master_url}
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from replication.connectors.ports import free_loopback_port
from replication.errors import ReplicationError


class ClusterError(ReplicationError):
    """The cluster could not be started."""


def spark_home() -> Path:
    """The installed pyspark's folder: a Spark distribution (``bin/spark-class``, ``jars/``)."""
    import pyspark

    return Path(pyspark.__file__).parent


class StandaloneCluster:
    """A master and ``workers`` workers of ``cores`` cores and ``memory`` each, on free loopback ports."""

    def __init__(self, workers: int = 2, *, cores: int = 1, memory: str = "2g", home: Path | None = None,
                 startup_timeout: float = 120.0) -> None:
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self._own_home = home is None
        self.home = Path(home) if home is not None else Path(tempfile.mkdtemp(prefix="spark-cluster-"))
        self.startup_timeout = startup_timeout
        self.port = self.ui_port = 0
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def pids(self) -> list[int]:
        """Process ids of the master, then of each worker (whose children are its executors)."""
        return [proc.pid for proc in self._procs]

    def worker_dir(self, index: int) -> Path:
        """Where worker ``index`` runs its executors: ``app-*/<executor id>/stderr`` are their logs."""
        return self.home / f"worker-{index}"

    def start(self) -> StandaloneCluster:
        self.home.mkdir(parents=True, exist_ok=True)  # (a home given by the caller may not exist yet)
        self.port, self.ui_port = free_loopback_port(), free_loopback_port()
        self._launch("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                     "--port", str(self.port), "--webui-port", str(self.ui_port))
        for index in range(self.workers):
            self.worker_dir(index).mkdir(parents=True, exist_ok=True)
            self._launch(f"worker-{index}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                         "--cores", str(self.cores), "--memory", self.memory, "--work-dir",
                         str(self.worker_dir(index)), "--webui-port", str(free_loopback_port()), self.master_url)
        deadline = time.monotonic() + self.startup_timeout
        while self.alive_workers() < self.workers:
            failed = [p for p in self._procs if p.poll() is not None]
            if failed or time.monotonic() > deadline:
                self.stop()
                raise ClusterError(
                    f"the Spark standalone cluster did not start ({self.alive_workers()} of {self.workers} "
                    f"workers alive after {self.startup_timeout:.0f}s); see the logs in {self.home}")
            time.sleep(0.5)
        return self

    def alive_workers(self) -> int:
        """Workers the master lists as alive (0 while it does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as answer:
                state = json.load(answer)
        except (OSError, ValueError):
            return 0
        return sum(1 for worker in state.get("workers", []) if worker.get("state") == "ALIVE")

    def _launch(self, name: str, main_class: str, *args: str) -> None:
        env = dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_LOG_DIR=str(self.home / "logs"), SPARK_NO_DAEMONIZE="1")
        log = open(self.home / f"{name}.log", "ab")  # noqa: SIM115 (the process writes it until it stops)
        self._procs.append(subprocess.Popen([str(spark_home() / "bin" / "spark-class"), main_class, *args],
                                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        log.close()

    def stop(self) -> None:
        """Stop the workers (and the executors they run), then the master; remove the home made here."""
        for proc in reversed(self._procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._procs.clear()
        if self._own_home:
            shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

