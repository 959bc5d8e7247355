"""The security tests' user and recognisable secrets, and the ``<Security>`` elements that use them."""

from __future__ import annotations

from pathlib import Path

#: The SASL user the session's broker knows, and its password: recognisable, so a test can search every file and
#: every output of a run for it.
KAFKA_USER = "replication-svc"
KAFKA_PASSWORD = "Pw-7f3a9c-do-not-print"
#: The environment variable a config names for it.
PASSWORD_VARIABLE = "TEST_KAFKA_PASSWORD"


def sasl_ssl_xml(ca_file: Path, *, mechanism: str = "SCRAM-SHA-512", password: str | None = None,
                 password_file: Path | None = None) -> str:
    """``<Security>`` for the broker's SASL_SSL listener; the password from ``${TEST_KAFKA_PASSWORD}`` unless
    ``password`` (written inline) or ``password_file`` is given."""
    if password_file is not None:
        secret = f"<PasswordFile>{password_file}</PasswordFile>"
    else:
        secret = f"<Password>{password if password is not None else '${' + PASSWORD_VARIABLE + '}'}</Password>"
    return (f"<Security><Protocol>SASL_SSL</Protocol><CAFile>{ca_file}</CAFile>"
            f"<SASLMechanism>{mechanism}</SASLMechanism><Username>{KAFKA_USER}</Username>{secret}</Security>")
