"""A single-node Apache Kafka broker (KRaft) for the demo, the tests and the benchmarks.

Nothing in the engine depends on this module: instances talk to any Kafka
cluster through bootstrap servers. It starts the real broker from the jars
``jvm/pom.xml`` fetched (``replication.connectors.jvm``), as a Kafka user would
start one node: format the storage, then run ``kafka.Kafka`` with
``process.roles=broker,controller``, a client listener and a controller listener
on free loopback ports, and replication factors of 1 for the internal topics.
Its log directories, config and log file live in a folder of the run, removed
with it.

Example:
    >>> with EmbeddedBroker() as broker:            # doctest: +SKIP
    ...     ensure_topics(broker.bootstrap, ["amps-1.publish"], partitions=2)
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path

from replication.connectors import jvm
from replication.connectors.kafka import tls
from replication.connectors.kafka.security import PLAINTEXT, KafkaSecurity
from replication.connectors.ports import free_loopback_port
from replication.errors import BrokerError

#: How long creating topics waits for a first answer from the brokers.
ADMIN_BOOTSTRAP_TIMEOUT_MS = 10_000

#: How many bytes of the broker's log an error message quotes.
_LOG_TAIL_BYTES = 3000

#: The broker's JVM: a bounded heap, and G1 tuned for short pauses as Kafka's own start script does.
JAVA_OPTIONS = (
    "-Xms256m", "-Xmx1g", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true",
)

_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = {level}
logger.state.name = state.change.logger
logger.state.level = WARN
"""


class EmbeddedBroker:
    """One Apache Kafka node (broker and controller) on free loopback ports.

    Lifecycle: :meth:`start` formats the storage (first start only), launches
    the JVM and returns once a Kafka client can fetch metadata from it;
    :meth:`stop` shuts it down cleanly (SIGTERM, then SIGKILL after a
    timeout); :meth:`restart` starts it again on the same ports and log
    directories (its topics and records are kept); :meth:`kill` is a crash
    (SIGKILL). Leaving the ``with`` block, or :meth:`close`, stops it and
    removes its folder if this object made the folder.

    Args:
        home: the folder for its config, log directories and log (``None``: a
            new temporary folder, removed by :meth:`close`).
        port: the client listener's port; ``None`` picks a free one.
        properties: more ``server.properties`` settings (they win over the defaults).
        startup_timeout: seconds to wait for the broker to answer metadata.
        log_level: the broker log's level (``broker.log`` in ``home``).
        users: SASL users (name -> password): the broker then also listens with ``SASL_SSL`` (SCRAM-SHA-256,
            SCRAM-SHA-512 and PLAIN, :attr:`sasl_ssl_bootstrap`) and with ``SSL`` demanding a client
            certificate (:attr:`mtls_bootstrap`), under a CA of its own (:attr:`ca_file`, :meth:`issue`).
    """

    def __init__(
        self,
        *,
        home: str | os.PathLike[str] | None = None,
        port: int | None = None,
        properties: Mapping[str, str] | None = None,
        startup_timeout: float = 60.0,
        log_level: str = "INFO",
        users: Mapping[str, str] | None = None,
    ) -> None:
        self._own_home = home is None
        self.home = Path(home) if home is not None else Path(tempfile.mkdtemp(prefix="kafka-"))
        self._requested_port = port
        self._properties = dict(properties or {})
        self._startup_timeout = startup_timeout
        self._log_level = log_level
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize | None = None
        self.port: int | None = None
        self.controller_port: int | None = None
        self._users = dict(users or {})
        self._secure_ports: tuple[int, int] | None = None

    @property
    def bootstrap(self) -> str:
        """Bootstrap servers string, ``"127.0.0.1:PORT"``."""
        if self.port is None:
            raise BrokerError("the embedded broker is not started: call start() first")
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_ssl_bootstrap(self) -> str:
        """The ``SASL_SSL`` listener (broker made with ``users``)."""
        return f"127.0.0.1:{self._secure()[0]}"

    @property
    def mtls_bootstrap(self) -> str:
        """The ``SSL`` listener that demands a client certificate signed by :attr:`ca_file`."""
        return f"127.0.0.1:{self._secure()[1]}"

    @property
    def ca_file(self) -> Path:
        """The PEM certificate of the CA that signed the broker's certificate."""
        return self.home / "tls" / "ca.pem"

    def issue(self, name: str) -> tuple[Path, Path]:
        """A client certificate signed by the broker's CA: (certificate PEM, private key PEM)."""
        return tls.issue(self.home / "tls", name)

    def _secure(self) -> tuple[int, int]:
        if self._secure_ports is None:
            raise BrokerError("this broker has no secure listeners: make it with users={name: password}, then start")
        return self._secure_ports

    @property
    def log_path(self) -> Path:
        """The broker's log file."""
        return self.home / "broker.log"

    @property
    def data_dir(self) -> Path:
        """The broker's log directory (its topics' data and the cluster metadata)."""
        return self.home / "data"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc is not None else None

    def start(self) -> EmbeddedBroker:
        """Start the broker and wait until it serves metadata. Returns ``self``."""
        if self.running:
            return self
        # Ports picked free can be taken before the broker binds them: retry with
        # others, unless they are fixed (asked for, or kept for a restart).
        fixed = self._requested_port is not None or self.port is not None
        attempts = 1 if fixed else 3
        for attempt in range(attempts):
            if not fixed:
                self.port, self.controller_port = free_loopback_port(), free_loopback_port()
            elif self.port is None:
                self.port, self.controller_port = self._requested_port, free_loopback_port()
            if self._users and (self._secure_ports is None or not fixed):
                self._secure_ports = (free_loopback_port(), free_loopback_port())
                tls.make_ca(self.home / "tls")
            self._write_config()
            if not (self.data_dir / "meta.properties").exists():
                self._format()
            self._launch()
            try:
                self._wait_ready()
                return self
            except BrokerError:
                exited = self._proc is not None and self._proc.poll() is not None
                self._halt(signal.SIGKILL)
                if not exited or fixed or attempt == attempts - 1:
                    raise
                shutil.rmtree(self.data_dir, ignore_errors=True)  # formatted for the ports that failed
        raise AssertionError("unreachable")

    def stop(self, timeout: float = 30.0) -> None:
        """A clean shutdown (SIGTERM: the broker closes its logs), then SIGKILL after ``timeout`` seconds."""
        self._halt(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """A crash: SIGKILL, nothing flushed or closed."""
        self._halt(signal.SIGKILL)

    def restart(self, timeout: float = 30.0) -> EmbeddedBroker:
        """Stop (if running) and start again on the same ports and log directories."""
        self.stop(timeout)
        return self.start()

    def close(self) -> None:
        """Stop the broker and remove its folder if it made it."""
        self.stop()
        self.port = self.controller_port = None
        if self._own_home:
            shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"running on {self.bootstrap}" if self.running else "stopped"
        return f"EmbeddedBroker({state}, home={self.home})"

    # -- internals ---------------------------------------------------------

    def _server_properties(self) -> dict[str, str]:
        client, controller = f"127.0.0.1:{self.port}", f"127.0.0.1:{self.controller_port}"
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{controller}",
            "listeners": f"PLAINTEXT://{client},CONTROLLER://{controller}",
            "advertised.listeners": f"PLAINTEXT://{client}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
        }
        if self._users:
            props.update(self._secure_properties())
        props.update(self._properties)
        return props

    def _secure_properties(self) -> dict[str, str]:
        sasl_port, mtls_port = self._secure()
        folder = self.home / "tls"
        jaas_users = " ".join(f'user_{name}="{password}"' for name, password in self._users.items())
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        return {
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port},"
                         f"CLIENTS_SASL://127.0.0.1:{sasl_port},CLIENTS_MTLS://127.0.0.1:{mtls_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port},CLIENTS_SASL://127.0.0.1:{sasl_port},"
                                    f"CLIENTS_MTLS://127.0.0.1:{mtls_port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,CLIENTS_SASL:SASL_SSL,"
                                              "CLIENTS_MTLS:SSL",
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
            "listener.name.clients_sasl.scram-sha-256.sasl.jaas.config": scram,
            "listener.name.clients_sasl.scram-sha-512.sasl.jaas.config": scram,
            "listener.name.clients_sasl.plain.sasl.jaas.config":
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {jaas_users};",
            "listener.name.clients_mtls.ssl.client.auth": "required",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(folder / "broker.pem"),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(folder / "ca.pem"),
        }

    def _write_config(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        text = "".join(f"{key}={value}\n" for key, value in self._server_properties().items())
        (self.home / "server.properties").write_text(text, encoding="utf-8")
        (self.home / "log4j2.properties").write_text(
            _LOG4J2.format(log=self.log_path, level=self._log_level), encoding="utf-8")

    def _java(self, main: str, *args: str, options: Iterable[str] = ()) -> list[str]:
        return [jvm.java(), *options, f"-Dlog4j2.configurationFile=file:{self.home / 'log4j2.properties'}",
                "-cp", jvm.kafka_classpath(), main, *args]

    def _format(self) -> None:
        cluster_id = "-"
        while cluster_id.startswith("-"):  # as Kafka's own random ids: one that reads as an option is drawn again
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        scram = [f"--add-scram=SCRAM-SHA-{bits}=[name={name},password={password}]"
                 for name, password in self._users.items() for bits in (256, 512)]
        cmd = self._java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
                         "-c", str(self.home / "server.properties"), *scram, options=("-Xmx256m",))
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise BrokerError(f"formatting the Kafka storage in {self.data_dir} failed "
                              f"(exit {done.returncode}): {(done.stderr or done.stdout).strip()[-_LOG_TAIL_BYTES:]}")

    def _launch(self) -> None:
        cmd = self._java("kafka.Kafka", str(self.home / "server.properties"), options=JAVA_OPTIONS)
        if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
            # (the demo's spark-submit ignores SIGTERM, and a JVM started with it ignored never stops on it:
            # close() would wait its full timeout) the broker gets SIGTERM's default back before it starts
            cmd = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGTERM, signal.SIG_DFL); "
                   "os.execvp(sys.argv[1], sys.argv[1:])", *cmd]
        with open(self.home / "broker.out", "ab") as out:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                # Own session: a Ctrl-C meant for the test runner or the demo must not
                # kill the broker before they have stopped their queries.
                start_new_session=True,
            )
        # Never leak a broker when the owner forgets stop() or the interpreter exits.
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _terminate, self._proc)

    def _wait_ready(self) -> None:
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        deadline = time.monotonic() + self._startup_timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise BrokerError(
                    f"the Kafka broker exited with code {self._proc.returncode} while starting on "
                    f"{self.bootstrap}; its log ({self.log_path}) ends with:\n{self._log_tail()}"
                )
            try:
                consumer = KafkaConsumer(
                    bootstrap_servers=self.bootstrap,
                    bootstrap_timeout_ms=2000,
                    request_timeout_ms=3000,
                    reconnect_backoff_ms=50,
                    reconnect_backoff_max_ms=200,
                    enable_auto_commit=False,
                )
                try:
                    consumer.topics()
                finally:
                    consumer.close()
                return
            except KafkaError as exc:
                last_error = exc
                time.sleep(0.1)
        raise BrokerError(
            f"the Kafka broker did not answer metadata on {self.bootstrap} within "
            f"{self._startup_timeout:.0f}s (last error: {last_error}); "
            f"its log ({self.log_path}) ends with:\n{self._log_tail()}"
        )

    def _halt(self, sig: int, timeout: float = 30.0) -> None:
        proc, self._proc = self._proc, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if proc is not None:
            _terminate(proc, timeout, sig)

    def _log_tail(self) -> str:
        """The errors the broker logged (with their exceptions' messages, not their stack frames), else its
        output's last lines."""
        errors: list[str] = []
        in_error = False
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            lines = []
        for line in lines:
            if line.startswith("["):
                in_error = " ERROR " in line or " FATAL " in line
                if in_error:
                    errors.append(line)
            elif in_error and line.strip() and not line.lstrip().startswith(("at ", "...")):
                errors.append(line)
        if errors:
            return "\n".join(errors)[-_LOG_TAIL_BYTES:]
        texts = []
        for path in (self.home / "broker.out", self.log_path):
            try:
                with open(path, "rb") as f:
                    f.seek(0, os.SEEK_END)
                    f.seek(max(0, f.tell() - _LOG_TAIL_BYTES))
                    texts.append(f.read().decode("utf-8", "replace"))
            except OSError:
                continue
        return "\n".join(t for t in texts if t.strip()) or "<empty>"


def ensure_topics(bootstrap: str, names: Iterable[str], partitions: int | Mapping[str, int] = 1,
                  security: KafkaSecurity = PLAINTEXT) -> None:
    """Create the Kafka topics ``names`` that do not exist yet (existing ones are left as they are), with
    ``partitions`` each (or per topic, 1 for one not named), and
    return once every one is in the brokers' metadata (a creation is acknowledged by the controller before
    the brokers list the topic).

    Works on any Kafka cluster, not only the embedded one (``security``: how to reach it).
    """
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    wanted = list(dict.fromkeys(names))
    if not wanted:
        return
    # 10 s, not kafka-python's 30: a Kafka that refuses this client (a wrong password) stops start-up sooner
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, bootstrap_timeout_ms=ADMIN_BOOTSTRAP_TIMEOUT_MS,
                             **security.kafka_python())
    try:
        existing = set(admin.list_topics())
        each = partitions if isinstance(partitions, Mapping) else dict.fromkeys(wanted, partitions)
        missing = [NewTopic(name, each.get(name, 1), 1) for name in wanted if name not in existing]
        for topic in missing:
            try:
                admin.create_topics([topic])
            except TopicAlreadyExistsError:
                pass  # created meanwhile by someone else: that is the goal anyway
        deadline = time.monotonic() + 30
        while missing and not {t.name for t in missing} <= set(admin.list_topics()):
            if time.monotonic() > deadline:
                raise BrokerError(f"topics {', '.join(t.name for t in missing)} were created on {bootstrap} but "
                                  "are not in its metadata after 30 s")
            time.sleep(0.05)
    finally:
        admin.close()


def _terminate(proc: subprocess.Popen[bytes], timeout: float = 30.0, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

