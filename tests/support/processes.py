"""Instances as separate OS processes, for tests that kill -9 them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from replication.destination.resync import heartbeat_fresh
from replication.storage.layout import StorageLayout

#: JVM options of the instance processes tests start: C1 alone. Such an instance lives for seconds to a minute,
#: too short for C2's compilations of Spark's own code to pay back the CPU they take from the other processes on
#: 2 cores (tests/faults/test_crashes.py, same hour: 201 s with C2, 141 s without). What these tests check
#: does not depend on the JIT tier; instances users run keep C2 (``session.SHORT_LIVED_JAVA_OPTIONS`` says why).
TEST_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"


def with_test_java_options(env: dict[str, str]) -> dict[str, str]:
    """``env`` with :data:`TEST_JAVA_OPTIONS` added to ``SPARK_SUBMIT_OPTS`` (which Spark's launcher puts on the
    driver JVM's command line), after whatever options it holds."""
    return {**env, "SPARK_SUBMIT_OPTS": f"{env.get('SPARK_SUBMIT_OPTS', '')} {TEST_JAVA_OPTIONS}".strip()}


#: Instance processes started and not yet stopped or seen dead (see :func:`kill_leftovers`).
_RUNNING: set[InstanceProcess] = set()


def kill_leftovers() -> int:
    """kill -9 every instance process a test left running (it failed before its own ``finally``); how many.

    They run in sessions of their own, so nothing else ends them: left alone they would use the cores of
    every later test."""
    left = list(_RUNNING)
    alive = sum(p.proc.poll() is None for p in left)
    try:
        for proc in left:
            proc.kill9()  # (the whole group: a driver that died can leave its JVM)
    finally:
        _RUNNING.clear()
    return alive


class InstanceProcess:
    """``replication run CONFIG`` in its own process group (so kill -9 takes its JVM too)."""

    def __init__(self, config_path: Path | list[Path], log_path: Path, *, failpoints: str | None = None,
                 command: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        """``command``: what runs the configs (default ``replication run ... --log-level INFO``); ``env``: more
        environment variables."""
        env = with_test_java_options(dict(os.environ, **(env or {})))
        env.pop("REPLICATION_FAILPOINTS", None)
        if failpoints:
            env["REPLICATION_FAILPOINTS"] = failpoints
        self.log_path = log_path
        self._log = open(log_path, "ab")
        configs = [str(p) for p in (config_path if isinstance(config_path, list) else [config_path])]
        argv = [*command, *configs] if command else [sys.executable, "-m", "replication.cli", "run", *configs,
                                                    "--log-level", "INFO"]
        self.proc = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        _RUNNING.add(self)

    def wait_killed(self, timeout: float = 300) -> int:
        code = self.proc.wait(timeout=timeout)
        self._log.close()
        _RUNNING.discard(self)
        return code

    def kill9(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.wait_killed()

    def terminate_group(self) -> None:
        """SIGTERM to the whole process group, as systemd or a supervisor stopping a service does."""
        os.killpg(self.proc.pid, signal.SIGTERM)

    def stop(self, timeout: float = 60) -> int:
        """Ctrl-C, as a user would; kill -9 if it does not stop in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill9()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # leftovers of the group (the JVM)
        except ProcessLookupError:
            pass
        self._log.close()
        _RUNNING.discard(self)
        return self.proc.returncode

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def running(storage) -> bool:
    """Whether the instance whose storage is ``storage`` runs: its heartbeat is fresh."""
    return heartbeat_fresh(StorageLayout.of(str(storage)))
