"""A small certificate authority for the embedded broker's TLS listeners, made with the ``openssl`` command.

:func:`make_ca` writes, in a folder: the CA (``ca.pem``, ``ca.key``) and the
broker's certificate for ``127.0.0.1`` and ``localhost`` with its key
(``broker.pem``: certificate then PKCS#8 key, the PEM keystore Kafka reads).
:func:`issue` signs a client certificate (mutual TLS). Keys are EC P-256: quick
to make, and read by the Java, kafka-python and librdkafka clients alike.
For the demo, tests and benchmarks only; a production broker has its own PKI.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from replication.errors import BrokerError

_DAYS = "3650"
_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def _openssl(*args: str, cwd: Path) -> None:
    if shutil.which("openssl") is None:
        raise BrokerError("the openssl command is needed to make the embedded broker's certificates; "
                          "install it (Debian: apt-get install openssl)")
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise BrokerError(f"openssl {args[0]} failed in {cwd}: {done.stderr.strip()[-1000:]}")


def make_ca(folder: Path) -> None:
    """The CA and the broker's certificate in ``folder`` (kept when already there)."""
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "broker.pem").exists():
        return
    _openssl("req", "-x509", *_KEY, "-keyout", "ca.key", "-out", "ca.pem", "-days", _DAYS,
             "-subj", "/CN=replication embedded broker CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=folder)
    cert, key = issue(folder, "broker")
    (folder / "broker.pem").write_text(cert.read_text() + key.read_text())


def issue(folder: Path, name: str) -> tuple[Path, Path]:
    """A certificate for ``name`` (also valid for 127.0.0.1 and localhost) signed by the CA of ``folder``:
    (certificate PEM, PKCS#8 private key PEM)."""
    cert, key, request = folder / f"{name}.crt", folder / f"{name}.key", folder / f"{name}.csr"
    (folder / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                        "extendedKeyUsage=serverAuth,clientAuth\n")
    _openssl("req", *_KEY, "-keyout", key.name, "-out", request.name, "-subj", f"/CN={name}", cwd=folder)
    _openssl("x509", "-req", "-in", request.name, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", cert.name, "-days", _DAYS, "-extfile", f"{name}.ext", cwd=folder)
    return cert, key
