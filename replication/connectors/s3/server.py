"""A local S3-compatible server in its own process, for the tests, the benchmarks and the demo's S3 variant.

It is moto's S3 service (``moto[server]`` from PyPI: pure Python, starts in a
second, no JVM and no Go toolchain), served on a free loopback port. Two things
are added around it, both needed for Delta on S3 and checked at start:

* **Requests are served one at a time.** moto checks ``If-None-Match`` and then
  stores the object in two steps of its code; a lock around each request makes
  a conditional put atomic by construction, as S3's is, rather than by the
  timing of threads. Delta commits (put-if-absent of ``_delta_log/N.json``)
  depend on that.
* **The access key id is checked** (not the signature): a request signed with
  another key gets S3's ``403 InvalidAccessKeyId``, so wrong credentials are
  observable as they are on S3.

``python -m replication.connectors.s3.server --port P --access-key K`` runs it;
:class:`LocalS3Server` starts, probes and stops it.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from replication.connectors.ports import free_loopback_port
from replication.connectors.s3.access import S3Access
from replication.errors import StorageError

#: Seconds a server has to answer before start-up fails.
START_TIMEOUT_S = 60
_KEY_ID = re.compile(r"Credential=([^/,\s]+)/")
_REFUSED = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidAccessKeyId</Code><Message>The AWS Access '
            b'Key Id you provided does not exist in our records.</Message></Error>')


class LocalS3Server:
    """An S3 endpoint on ``127.0.0.1``; ``access`` gives clients its credentials."""

    def __init__(self, *, access_key: str = "replication-local", secret_key: str = "replication-local-secret",
                 region: str = "us-east-1", port: int = 0) -> None:
        """``port``: where it will listen (default: a free loopback port chosen at start)."""
        self.access_key, self.secret_key, self.region = access_key, secret_key, region
        self.port = port
        self._proc: subprocess.Popen | None = None
        self._dir = Path(tempfile.mkdtemp(prefix="replication-s3-"))

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def access(self) -> S3Access:
        return S3Access(region=self.region, endpoint=self.endpoint, access_key=self.access_key,
                        secret_key=self.secret_key)

    def environment(self) -> dict[str, str]:
        """The standard AWS variables a process needs to use this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": self.region}

    def start(self) -> LocalS3Server:
        self.port = self.port or free_loopback_port()
        log = open(self._dir / "server.log", "wb")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "replication.connectors.s3.server", "--port", str(self.port),
             "--access-key", self.access_key], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self._proc.poll() is not None:
                raise StorageError(f"the local S3 server exited at start: {self._log_tail()}")
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise StorageError(f"the local S3 server did not answer in {START_TIMEOUT_S} s") from None
                time.sleep(0.1)
        self._probe_conditional_writes()
        return self

    def create_bucket(self, name: str) -> None:
        self.access.client().create_bucket(Bucket=name)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait(10)
        self._proc = None

    def _probe_conditional_writes(self) -> None:
        """Refuse a server that would let two writers both create one object (Delta would lose commits)."""
        from botocore.exceptions import ClientError

        client = self.access.client()
        bucket = "replication-probe"
        client.create_bucket(Bucket=bucket)
        client.put_object(Bucket=bucket, Key="once", Body=b"1", IfNoneMatch="*")
        try:
            client.put_object(Bucket=bucket, Key="once", Body=b"2", IfNoneMatch="*")
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") != 412:
                raise
        else:
            self.stop()
            raise StorageError("the local S3 server does not honour If-None-Match: Delta commits would not be safe")
        finally:
            if self._proc is not None:
                client.delete_object(Bucket=bucket, Key="once")
                client.delete_bucket(Bucket=bucket)

    def _log_tail(self) -> str:
        try:
            return (self._dir / "server.log").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def __enter__(self) -> LocalS3Server:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _serve(port: int, access_key: str) -> None:
    from moto.moto_server.threaded_moto_server import MotoRequestHandler
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    moto_api = DomainDispatcherApplication(create_backend_app)
    # every request but moto's own API is S3's: moto's dispatcher would find that out again for each request,
    # scanning its modules' folders on disk (a fifth of the server's time in bench/replicate.py --storage s3)
    s3 = create_backend_app("s3")
    one_at_a_time = threading.Lock()

    def app(environ: dict, start_response: Any) -> list[bytes]:
        signed = environ.get("HTTP_AUTHORIZATION", "") or environ.get("QUERY_STRING", "")
        key = _KEY_ID.search(signed.replace("X-Amz-Credential=", "Credential=").replace("%2F", "/"))
        if key and key.group(1) != access_key:
            start_response("403 Forbidden", [("Content-Type", "application/xml")])
            return [_REFUSED]
        # the body is read before the lock: a client that stops half way through sending one (a process
        # killed while its socket lives on in a child) must not stop every other request behind it
        stream, length = environ["wsgi.input"], environ.get("CONTENT_LENGTH")
        environ["wsgi.input"] = io.BytesIO(stream.read(int(length)) if length else
                                           stream.read() if environ.get("wsgi.input_terminated") else b"")
        moto = moto_api if environ.get("PATH_INFO", "").startswith("/moto-api") else s3
        with one_at_a_time:
            body = moto(environ, start_response)
            try:
                return [b"".join(body)]
            finally:
                getattr(body, "close", lambda: None)()

    make_server("127.0.0.1", port, app, threaded=True, request_handler=MotoRequestHandler).serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="serve S3 on 127.0.0.1 (moto), one request at a time")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--access-key", required=True, help="the only access key id accepted")
    args = parser.parse_args(argv)
    _serve(args.port, args.access_key)


if __name__ == "__main__":
    main()
