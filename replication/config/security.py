"""``<Security>`` of a Kafka ``<Transport>``: TLS, mutual TLS and SASL toward the brokers.

::

    <Security>
      <Protocol>SASL_SSL</Protocol>                    <!-- PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL -->
      <CAFile>/etc/kafka/ca.pem</CAFile>              <!-- TLS: the brokers' CA (default: the system's) -->
      <CertificateFile>client.pem</CertificateFile>   <!-- mutual TLS: this client's certificate... -->
      <KeyFile>client.key</KeyFile>                   <!-- ...and its private key -->
      <KeyPassword>${KAFKA_KEY_PASSWORD}</KeyPassword> <!-- an encrypted key's password (or KeyPasswordFile) -->
      <SASLMechanism>SCRAM-SHA-512</SASLMechanism>     <!-- PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 -->
      <Username>amps-1</Username>
      <Password>${KAFKA_PASSWORD}</Password>          <!-- or <PasswordFile>/run/secrets/kafka</PasswordFile> -->
    </Security>

A password is read from the environment (exactly ``${VAR}``) or from a file;
one written in the config file itself is refused (anyone who can read the
config could read it), and so is a ``${VAR:-default}`` (the default would be
one). Both are read, and the files checked, only when a Kafka client is made
(:meth:`KafkaSecurity.check` at an instance's start): ``replication status``,
``validate`` or ``replay`` load the config in a shell without the secrets.
File paths are relative to the config file. Errors name the element, never a
secret's value.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from xml.sax.saxutils import escape

from replication.config import values
from replication.config.model import KafkaTransport
from replication.config.xml_reader import OPT, Ctx, Node, one, read_root
from replication.connectors.kafka.security import (
    PLAINTEXT,
    PROTOCOLS,
    SASL_MECHANISMS,
    UNSUPPORTED_MECHANISMS,
    KafkaSecurity,
    Secret,
)
from replication.errors import ConfigError

__all__ = ["SECURITY_SCHEMA", "check_security", "load_security_file", "secret", "security", "security_xml"]

SECURITY_SCHEMA = {
    "Protocol": one("<Protocol>SASL_SSL</Protocol>"),
    "CAFile": OPT,
    "CertificateFile": OPT,
    "KeyFile": OPT,
    "KeyPassword": OPT,
    "KeyPasswordFile": OPT,
    "SASLMechanism": OPT,
    "Username": OPT,
    "Password": OPT,
    "PasswordFile": OPT,
}


def security(node: Node | None) -> KafkaSecurity:
    """The ``<Security>`` element of a Kafka transport (absent: plain text)."""
    if node is None:
        return PLAINTEXT
    kids = node.children(SECURITY_SCHEMA)
    protocol = kids.one("Protocol").read(values.enum, PROTOCOLS)
    tls, sasl = protocol in ("SSL", "SASL_SSL"), protocol.startswith("SASL_")
    for tag in ("CAFile", "CertificateFile", "KeyFile", "KeyPassword", "KeyPasswordFile"):
        extra = kids.opt(tag)
        if extra is not None and not tls:
            extra.fail(f"<{tag}> is a TLS setting, but <Protocol> is {protocol}, which does not use TLS",
                       f"write <Protocol>{'SASL_SSL' if sasl else 'SSL'}</Protocol>, or remove <{tag}>")
    for tag in ("SASLMechanism", "Username", "Password", "PasswordFile"):
        extra = kids.opt(tag)
        if extra is not None and not sasl:
            extra.fail(f"<{tag}> is a SASL setting, but <Protocol> is {protocol}, which does not use SASL",
                       f"write <Protocol>{'SASL_SSL' if tls else 'SASL_PLAINTEXT'}</Protocol>, or remove <{tag}>")
    certificate, key = _file(kids.opt("CertificateFile")), _file(kids.opt("KeyFile"))
    if (certificate is None) != (key is None):
        node.fail("mutual TLS needs both <CertificateFile> and <KeyFile>",
                  "add the missing one (PEM files: this client's certificate and its private key)")
    key_password = secret(kids.opt("KeyPassword"), kids.opt("KeyPasswordFile"), "KeyPassword")
    if key_password is not None and key is None:
        node.fail("<KeyPassword> is the password of <KeyFile>, which is not given",
                  "add <KeyFile> and <CertificateFile>, or remove the key password")
    mechanism = username = password = None
    if sasl:
        mnode = kids.opt("SASLMechanism")
        if mnode is None:
            node.fail(f"<Protocol>{protocol}</Protocol> needs a <SASLMechanism>",
                      "add <SASLMechanism>SCRAM-SHA-512</SASLMechanism> (or PLAIN, SCRAM-SHA-256)")
        mechanism = mnode.text()
        if mechanism in UNSUPPORTED_MECHANISMS:
            mnode.fail(f"SASL mechanism {mechanism} is not supported yet: {UNSUPPORTED_MECHANISMS[mechanism]}",
                       f"use one of {', '.join(SASL_MECHANISMS)}")
        mnode.read(values.enum, SASL_MECHANISMS)
        unode = kids.opt("Username")
        if unode is None:
            node.fail(f"SASL ({mechanism}) needs a <Username>", "add <Username>the user the broker knows</Username>")
        username = unode.text()
        password = secret(kids.opt("Password"), kids.opt("PasswordFile"), "Password")
        if password is None:
            node.fail(f"SASL ({mechanism}) needs a password",
                      "add <Password>${KAFKA_PASSWORD}</Password> or <PasswordFile>/path/to/file</PasswordFile>")
    return KafkaSecurity(protocol=protocol, ca_file=_file(kids.opt("CAFile")), certificate_file=certificate,
                         key_file=key, key_password=key_password, sasl_mechanism=mechanism, username=username,
                         password=password)


def check_security(transport: KafkaTransport) -> None:
    """Before a Kafka client of ``transport`` is made: a :class:`ConfigError` naming the transport, its
    ``<Security>`` problem (a missing file, an unset variable) and the fix; never a secret."""
    try:
        transport.security.check()
    except ValueError as exc:
        raise ConfigError(
            f"{transport.source}: Kafka transport {transport.name}: <Security>: {exc}. Fix: export the variable "
            "or correct the path in <Security> (paths are relative to the config file)",
            file=transport.source.file, line=transport.source.line or None) from None


def _file(node: Node | None) -> str | None:
    """A file the client reads (relative to the config file; checked when a client is made)."""
    if node is None:
        return None
    return str(Path(node.ctx.base_dir, node.text()))


_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def secret(inline: Node | None, file_node: Node | None, tag: str, what: str = "a Kafka password") -> Secret | None:
    """A password or key from exactly ``${VAR}`` (in ``<tag>``) or from a file (``<tag>File``); never written
    in the config. Read when it is used, not here."""
    if inline is not None and file_node is not None:
        file_node.fail(f"<{tag}> and <{tag}File> are both given", "keep one of them")
    if inline is not None:
        variable = _VARIABLE.fullmatch("".join(inline.el.itertext()).strip())
        if variable is None:
            inline.fail(f"{what} must come from the environment or a file: one written in the config file "
                        "(or as a ${VAR:-default}) is readable by anyone who can read the file (the value is "
                        "not shown here)",
                        f"write exactly <{tag}>${{VARIABLE}}</{tag}> and export VARIABLE, or use <{tag}File>")
        return Secret.from_env(variable.group(1), what)
    if file_node is not None:
        return Secret.from_file(str(Path(file_node.ctx.base_dir, file_node.text())), what)
    return None


def load_security_file(path: str | os.PathLike[str]) -> KafkaSecurity:
    """A file holding one ``<Security>`` element (as in a Kafka transport): for tools that take a Kafka
    address on their command line (the benchmarks' ``--kafka-security``). Paths in it are relative to it."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror}). Fix: give a file holding a <Security> element",
                          file=str(path)) from None
    ctx = Ctx(str(path), str(file.resolve().parent), os.environ)
    return security(read_root(data, ctx, "Security"))


def security_xml(sec: KafkaSecurity) -> str:
    """``sec`` as a ``<Security>`` element for a generated config: paths as they are, secrets as the
    ``${VAR}`` or file they come from (ValueError for a secret given as a value)."""
    if sec == PLAINTEXT:
        return ""
    parts = [f"<Protocol>{sec.protocol}</Protocol>"]
    for tag, value in (("CAFile", sec.ca_file), ("CertificateFile", sec.certificate_file), ("KeyFile", sec.key_file),
                       ("SASLMechanism", sec.sasl_mechanism), ("Username", sec.username)):
        if value is not None:
            parts.append(f"<{tag}>{escape(value)}</{tag}>")
    for tag, hidden in (("KeyPassword", sec.key_password), ("Password", sec.password)):
        if hidden is not None:
            kind, ref = hidden.origin()
            parts.append(f"<{tag}>${{{ref}}}</{tag}>" if kind == "env" else f"<{tag}File>{escape(ref)}</{tag}File>")
    return f"<Security>{''.join(parts)}</Security>"
