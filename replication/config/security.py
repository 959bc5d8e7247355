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

A password is read from the environment (``${VAR}``) or from a file; one
written in the config file itself is refused (anyone who can read the config
could read it). File paths are relative to the config file. Errors name the
element, never a secret's value.
"""

from __future__ import annotations

from pathlib import Path

from replication.config import values
from replication.config.xml_reader import OPT, Node, one
from replication.connectors.kafka.security import (
    PLAINTEXT,
    PROTOCOLS,
    SASL_MECHANISMS,
    UNSUPPORTED_MECHANISMS,
    KafkaSecurity,
    Secret,
)

__all__ = ["SECURITY_SCHEMA", "security"]

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
    key_password = _secret(kids.opt("KeyPassword"), kids.opt("KeyPasswordFile"), "KeyPassword")
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
        password = _secret(kids.opt("Password"), kids.opt("PasswordFile"), "Password")
        if password is None:
            node.fail(f"SASL ({mechanism}) needs a password",
                      "add <Password>${KAFKA_PASSWORD}</Password> or <PasswordFile>/path/to/file</PasswordFile>")
    return KafkaSecurity(protocol=protocol, ca_file=_file(kids.opt("CAFile")), certificate_file=certificate,
                         key_file=key, key_password=key_password, sasl_mechanism=mechanism, username=username,
                         password=password)


def _file(node: Node | None) -> str | None:
    """A file the client reads (relative to the config file); it must exist."""
    if node is None:
        return None
    path = Path(node.ctx.base_dir, node.text())
    if not path.is_file():
        node.fail(f"file '{path}' does not exist", f"write the path of the PEM file in <{node.tag}>")
    return str(path)


def _secret(inline: Node | None, file_node: Node | None, tag: str) -> Secret | None:
    """A password from ``${VAR}`` (in ``<tag>``) or from a file (``<tag>File``); never written in the config."""
    if inline is not None and file_node is not None:
        file_node.fail(f"<{tag}> and <{tag}File> are both given", "keep one of them")
    if inline is not None:
        if "${" not in "".join(inline.el.itertext()):
            inline.fail("a password written in the config file is readable by anyone who can read the file "
                        "(its value is not shown here)",
                        f"write <{tag}>${{VARIABLE}}</{tag}> and export VARIABLE, or use <{tag}File>")
        return Secret(inline.text())
    if file_node is not None:
        path = Path(file_node.ctx.base_dir, file_node.text())
        try:
            value = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            file_node.fail(f"the password file '{path}' cannot be read ({exc.strerror})",
                           f"write the path of a readable file holding the password in <{tag}File>")
        if not value:
            file_node.fail(f"the password file '{path}' is empty", "write the password into the file")
        return Secret(value)
    return None
