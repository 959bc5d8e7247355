"""How a Kafka client authenticates and encrypts: TLS (with or without a client certificate) and SASL.

One :class:`KafkaSecurity` describes it, and is turned into the settings of each
client the project uses: kafka-python's keyword arguments (the engine's Kafka
reads and topic checks), librdkafka's configuration (``confluent-kafka``: the
publisher, the acks, queue deliveries) and Spark's Kafka source options (the
ingest query's reads). Secrets are :class:`Secret` values:
their ``str``/``repr`` never show them, so a log line, an error or a status that
formats one prints ``<secret>``; only :meth:`Secret.reveal` gives the value, and
only where a client is made.

Between a Spark driver and its Python workers the settings travel as data source
options (:meth:`KafkaSecurity.to_options` / :meth:`KafkaSecurity.from_options`);
every option holding a secret has ``password`` in its key, which Spark redacts
wherever it shows options (``spark.redaction.regex``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

#: Security protocols, as Kafka names them.
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
#: SASL mechanisms the project's clients all support.
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
#: Mechanisms not supported yet, and why.
UNSUPPORTED_MECHANISMS = {
    "OAUTHBEARER": "it needs a token provider (a callback that fetches and refreshes tokens), which the engine's "
                   "Kafka clients are not given yet",
    "GSSAPI": "Kerberos needs a keytab and a krb5 configuration in every Spark worker, which the engine does not "
              "distribute yet",
}

#: Data source option of each field (a secret's key has ``password`` in it: Spark redacts those).
_OPTIONS = {
    "protocol": "kafka.security.protocol",
    "ca_file": "kafka.ssl.ca.file",
    "certificate_file": "kafka.ssl.certificate.file",
    "key_file": "kafka.ssl.key.file",
    "key_password": "kafka.ssl.key.password",
    "sasl_mechanism": "kafka.sasl.mechanism",
    "username": "kafka.sasl.username",
    "password": "kafka.sasl.password",
}


class Secret:
    """A password or key: printed as ``<secret>``, revealed only on purpose.

    Given as a value, or as where to find it when a client is made (:meth:`from_env`, :meth:`from_file`):
    a config that names ``${KAFKA_PASSWORD}`` then loads where the variable is not set (``replication status``
    in an operator's shell); only a command that connects to Kafka needs it. Compared by where it comes from.
    """

    __slots__ = ("_kind", "_ref", "_what")

    def __init__(self, value: str, *, kind: str = "value", what: str = "a Kafka password") -> None:
        self._kind = kind
        self._ref = value
        self._what = what

    @classmethod
    def from_env(cls, variable: str, what: str = "a Kafka password") -> Secret:
        return cls(variable, kind="env", what=what)

    @classmethod
    def from_file(cls, path: str, what: str = "a Kafka password") -> Secret:
        return cls(path, kind="file", what=what)

    def problem(self) -> str | None:
        """Why it cannot be revealed here (without the secret), else None."""
        if self._kind == "env" and not os.environ.get(self._ref):
            return f"the environment variable {self._ref} ({self._what}) is not set"
        if self._kind == "file":
            try:
                if not Path(self._ref).read_text(encoding="utf-8").strip():
                    return f"the file {self._ref} ({self._what}) is empty"
            except OSError as exc:
                return f"the file {self._ref} ({self._what}) cannot be read ({exc.strerror})"
        return None

    def origin(self) -> tuple[str, str]:
        """Where it comes from, without it: ``("env", VARIABLE)`` or ``("file", path)``; ValueError for a
        secret given as a value (it has nowhere to be written but itself)."""
        if self._kind not in ("env", "file"):
            raise ValueError(f"{self._what} given as a value has no variable or file to name")
        return self._kind, self._ref

    def reveal(self) -> str:
        """The secret itself; ValueError (without it) when it cannot be found."""
        problem = self.problem()
        if problem:
            raise ValueError(problem)
        if self._kind == "env":
            return os.environ[self._ref]
        if self._kind == "file":
            return Path(self._ref).read_text(encoding="utf-8").strip()
        return self._ref

    def __repr__(self) -> str:
        return "<secret>"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and (other._kind, other._ref) == (self._kind, self._ref)

    def __hash__(self) -> int:
        return hash((self._kind, self._ref))

    def __reduce__(self):  # pickled as where it comes from: a Secret again on the other side
        return (_secret, (self._kind, self._ref, self._what))


def _secret(kind: str, ref: str, what: str = "a Kafka password") -> Secret:
    return Secret(ref, kind=kind, what=what)


@dataclass(frozen=True)
class KafkaSecurity:
    """A client's security settings; the default is plain text with no authentication."""

    protocol: str = "PLAINTEXT"
    ca_file: str | None = None
    """PEM file of the CAs that signed the brokers' certificates (None: the system's)."""
    certificate_file: str | None = None
    """PEM file of this client's certificate (mutual TLS)."""
    key_file: str | None = None
    """PEM file of this client's private key (mutual TLS)."""
    key_password: Secret | None = None
    """Password of an encrypted ``key_file``."""
    sasl_mechanism: str | None = None
    username: str | None = None
    password: Secret | None = None

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    def check(self) -> None:
        """ValueError naming what a client could not use (a missing file, an unset variable); never a secret."""
        problems = [f"{what} {path} does not exist" for what, path in (
            ("CAFile", self.ca_file), ("CertificateFile", self.certificate_file), ("KeyFile", self.key_file))
            if path and not os.path.isfile(path)]
        problems += [p for p in (s.problem() for s in (self.password, self.key_password) if s is not None) if p]
        if self.key_file and os.path.isfile(self.key_file) and (problem := _not_pkcs8(self.key_file)):
            problems.append(problem)
        if problems:
            raise ValueError("; ".join(problems))

    def describe(self) -> str:
        """What a log line may say about it: protocol, mechanism, user; never a secret."""
        parts = [self.protocol]
        if self.sasl:
            parts.append(f"{self.sasl_mechanism} as {self.username}")
        if self.certificate_file:
            parts.append("client certificate")
        return ", ".join(parts)

    # -- kafka-python ---------------------------------------------------------------
    def kafka_python(self) -> dict[str, Any]:
        """Keyword arguments for kafka-python's ``KafkaProducer``, ``KafkaConsumer`` and ``KafkaAdminClient``:
        how to reach the brokers, and how soon to try again when one is away (1 s at most, as Java clients do;
        kafka-python's own 30 s left an instance idle for up to that long after a broker came back)."""
        out: dict[str, Any] = {"security_protocol": self.protocol, "reconnect_backoff_max_ms": 1000}
        if self.tls:
            out.update(ssl_cafile=self.ca_file, ssl_certfile=self.certificate_file, ssl_keyfile=self.key_file,
                       ssl_password=self.key_password.reveal() if self.key_password else None,
                       ssl_check_hostname=True)
        if self.sasl:
            out.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.username,
                       sasl_plain_password=self.password.reveal() if self.password else None)
        return {k: v for k, v in out.items() if v is not None}

    # -- librdkafka -----------------------------------------------------------------
    def librdkafka(self) -> dict[str, str]:
        """Settings for ``confluent_kafka``'s ``Producer``/``Consumer`` (librdkafka names)."""
        out = {"security.protocol": self.protocol.lower()}
        if self.tls:
            for key, value in (("ssl.ca.location", self.ca_file), ("ssl.certificate.location", self.certificate_file),
                               ("ssl.key.location", self.key_file)):
                if value:
                    out[key] = value
            if self.key_password:
                out["ssl.key.password"] = self.key_password.reveal()
        if self.sasl and self.sasl_mechanism and self.username and self.password:
            out.update({"sasl.mechanisms": self.sasl_mechanism, "sasl.username": self.username,
                        "sasl.password": self.password.reveal()})
        return out

    # -- Spark's Kafka source (the Java client) -----------------------------------------
    def spark_kafka(self) -> dict[str, str]:
        """Options for Spark's ``format("kafka")`` (``kafka.``-prefixed Java client settings)."""
        out = {"kafka.security.protocol": self.protocol}
        if self.tls and self.ca_file:
            out.update({"kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": self.ca_file})
        if self.tls and self.certificate_file and self.key_file:
            # The Java client reads a client certificate from one keystore: a PEM file of the key and its chain.
            out.update({"kafka.ssl.keystore.type": "PEM",
                        "kafka.ssl.keystore.location": pem_keystore(self.certificate_file, self.key_file)})
            if self.key_password:
                out["kafka.ssl.key.password"] = self.key_password.reveal()
        if self.sasl and self.username and self.password:
            module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if self.sasl_mechanism == "PLAIN"
                      else "org.apache.kafka.common.security.scram.ScramLoginModule")
            value = self.password.reveal().replace("\\", "\\\\").replace('"', '\\"')
            out.update({"kafka.sasl.mechanism": str(self.sasl_mechanism),
                        "kafka.sasl.jaas.config": f'{module} required username="{self.username}" password="{value}";'})
        return out

    # -- through data source options ----------------------------------------------------
    def to_options(self) -> dict[str, str]:
        """This as string options (secrets under keys with ``password`` in them: Spark redacts those)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[_OPTIONS[f.name]] = value.reveal() if isinstance(value, Secret) else str(value)
        return out

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> KafkaSecurity:
        """The inverse of :meth:`to_options` (keys compared without case, as Spark passes them)."""
        lowered = {k.lower(): v for k, v in options.items()}
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = lowered.get(_OPTIONS[f.name])
            if raw is not None:
                values[f.name] = Secret(raw) if f.name in ("password", "key_password") else raw
        return cls(**values)


PLAINTEXT = KafkaSecurity()

_KEYSTORES: dict[tuple[str, str], str] = {}


def _not_pkcs8(key_file: str, key: str | None = None) -> str | None:
    """Why Spark's Kafka client cannot read this key (None: it can); ``key``: the file's text, if read already."""
    if key is None:
        key = Path(key_file).read_text(encoding="ascii", errors="replace")
    if "-----BEGIN PRIVATE KEY-----" in key or "-----BEGIN ENCRYPTED PRIVATE KEY-----" in key:
        return None
    return (f"KeyFile {key_file} is not a PKCS#8 key, the only kind Spark's Kafka client reads; "
            f"convert it: openssl pkcs8 -topk8 -in {key_file} -out key-pkcs8.pem "
            "(add -nocrypt for a key without a password) and name that file in <KeyFile>")


def pem_keystore(certificate_file: str, key_file: str) -> str:
    """A PEM keystore for the Java client (its ``ssl.keystore.type=PEM``): the private key, then the
    certificate chain, in a file only this user can read, removed when the process exits.

    The Java client reads PKCS#8 keys only (``BEGIN PRIVATE KEY`` or ``BEGIN ENCRYPTED PRIVATE KEY``); any
    other is refused here with the command that converts it. The file is on this machine: Spark executors on
    other machines need a keystore of their own at the same path.
    """
    import atexit
    import shutil
    import tempfile

    made = _KEYSTORES.get((certificate_file, key_file))
    if made is not None and os.path.isfile(made):
        return made
    key = Path(key_file).read_text(encoding="ascii", errors="replace")
    problem = _not_pkcs8(key_file, key)
    if problem:
        raise ValueError(problem)
    folder = tempfile.mkdtemp(prefix="replication-keystore-")  # (mode 0700)
    atexit.register(shutil.rmtree, folder, True)
    path = os.path.join(folder, "keystore.pem")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(key.strip() + "\n" + Path(certificate_file).read_text(encoding="ascii").strip() + "\n")
    _KEYSTORES[(certificate_file, key_file)] = path
    return path
