"""Object-storage addresses (``s3://bucket/prefix``) and how to reach them.

Credentials, region and endpoint come the way Delta and Hadoop users already
give them: the standard AWS environment variables (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``,
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``) and profiles
(``AWS_PROFILE``, ``~/.aws/credentials``), resolved once by botocore so a
profile, SSO or an instance role works the same for Delta (delta-rs) and for
Arrow. :class:`S3Access` holds the result; its ``repr`` and every error here
name the address and the endpoint, never a key.
"""

from __future__ import annotations

import atexit
import functools
import gc
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from replication.errors import StorageAccessError

__all__ = ["S3Access", "S3Address", "StorageAccessError", "check_reachable"]

#: Schemes taken as S3 (``s3a`` is Hadoop's name for the same store).
S3_SCHEMES = ("s3", "s3a")
#: How botocore says it found keys that do not expire (anything else is renewed by its provider).
STATIC_CREDENTIALS = frozenset({"env", "shared-credentials-file", "config-file", "explicit"})
#: Seconds to wait for an endpoint before calling it unreachable.
CONNECT_TIMEOUT_S = 5


@dataclass(frozen=True)
class S3Address:
    """``s3://bucket/key``: ``key`` has no leading or trailing slash ('' for the bucket's root)."""

    bucket: str
    key: str = ""

    @classmethod
    def parse(cls, uri: str) -> S3Address | None:
        """The address ``uri`` names, or None when it is not an S3 URI."""
        parsed = urlparse(uri)
        if parsed.scheme not in S3_SCHEMES:
            return None
        if not parsed.netloc:
            raise StorageAccessError(f"{uri!r} names no bucket. Fix: write s3://BUCKET/PREFIX")
        return cls(parsed.netloc, parsed.path.strip("/"))

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}" if self.key else f"s3://{self.bucket}"

    def child(self, *parts: str) -> S3Address:
        return S3Address(self.bucket, "/".join(p.strip("/") for p in (self.key, *parts) if p.strip("/")))

    def __str__(self) -> str:
        return self.uri


@dataclass(frozen=True)
class S3Access:
    """Resolved credentials, region and endpoint for S3; ``repr`` shows no secret."""

    region: str
    endpoint: str | None = None
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    expiring: bool = False
    """The credentials are temporary ones a provider renews (an instance or container role, web identity,
    SSO, an assumed role): the keys above are a snapshot, so no client is given them; each client's own
    chain (boto3's, delta-rs's, Arrow's) fetches and renews them."""
    profile: str | None = None

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> S3Access:
        """Resolve what the standard AWS settings give (environment, profile, config files, instance role)."""
        import botocore.session

        env = os.environ if env is None else env
        session = botocore.session.Session()
        if env.get("AWS_PROFILE"):
            session.set_config_variable("profile", env["AWS_PROFILE"])
        credentials = session.get_credentials()
        frozen = credentials.get_frozen_credentials() if credentials else None
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or session.get_config_variable("region")
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        expiring = credentials is not None and getattr(credentials, "method", "") not in STATIC_CREDENTIALS
        return cls(region=region or "us-east-1", endpoint=endpoint,
                   access_key=frozen.access_key if frozen else None,
                   secret_key=frozen.secret_key if frozen else None,
                   session_token=frozen.token if frozen else None,
                   expiring=expiring, profile=env.get("AWS_PROFILE") or None)

    @property
    def _static_keys(self) -> bool:
        return bool(self.access_key and self.secret_key) and not self.expiring

    @property
    def where(self) -> str:
        """The endpoint, for messages: the given one, or AWS's."""
        return self.endpoint or f"AWS S3 ({self.region})"

    def delta_options(self) -> dict[str, str]:
        """deltalake ``storage_options``. Commits use S3's conditional writes (put-if-absent), which delta-rs
        uses by default: no unsafe rename and no lock service."""
        options = {"AWS_REGION": self.region}
        if self.endpoint:
            options["AWS_ENDPOINT_URL"] = self.endpoint
            if self.endpoint.startswith("http://"):
                options["AWS_ALLOW_HTTP"] = "true"
        if self._static_keys and self.access_key and self.secret_key:
            options["AWS_ACCESS_KEY_ID"] = self.access_key
            options["AWS_SECRET_ACCESS_KEY"] = self.secret_key
            if self.session_token:
                options["AWS_SESSION_TOKEN"] = self.session_token
        return options

    def hadoop_conf(self) -> dict[str, str]:
        """Spark settings of Hadoop's S3A filesystem for this endpoint and region. No credential: S3A reads
        them as this process was given them (the standard AWS variables, or an instance role), so no secret
        is put in a Spark setting."""
        conf = {"spark.hadoop.fs.s3a.endpoint.region": self.region,
                # S3A's own keys if a user set them, else the AWS SDK's default chain: the environment, a
                # profile (AWS_PROFILE, as the Python side reads it), web identity, a container or instance role
                "spark.hadoop.fs.s3a.aws.credentials.provider": ",".join((
                    "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider",
                    "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
                    "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider")),
                # Spark writes each checkpoint file under a new temporary name, then renames it: S3A's checks
                # that a created file overwrites nothing and that its parents are folders (a HEAD and a LIST
                # each) find nothing there. Skipped, a sync pair on S3 ran 52.8k against 47.6k rows/s
                # (bench/replicate.py --storage s3). Spark still checks, before its rename, that the checkpoint
                # file does not exist.
                "spark.hadoop.fs.s3a.performance.flags": "create,mkdir"}
        if self.endpoint:  # an S3-compatible server: its address, and buckets in the path, not the host name
            conf["spark.hadoop.fs.s3a.endpoint"] = self.endpoint
            conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
            conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(self.endpoint.startswith("https://")).lower()
        return conf

    def arrow_filesystem(self) -> Any:
        """A ``pyarrow.fs.S3FileSystem`` with the same credentials, region and endpoint."""
        from pyarrow import fs

        kwargs: dict[str, Any] = {"region": self.region}
        if self.endpoint:
            parsed = urlparse(self.endpoint)
            kwargs["endpoint_override"] = parsed.netloc or self.endpoint
            kwargs["scheme"] = parsed.scheme or "https"
        if self._static_keys:
            kwargs.update(access_key=self.access_key, secret_key=self.secret_key, session_token=self.session_token)
        return fs.S3FileSystem(**kwargs)

    def client(self) -> Any:
        """A boto3 S3 client (conditional puts of control files, checks)."""
        import boto3
        from botocore.config import Config

        keys = {"aws_access_key_id": self.access_key, "aws_secret_access_key": self.secret_key,
                "aws_session_token": self.session_token} if self._static_keys else {}
        return boto3.Session(profile_name=self.profile).client(
            "s3", region_name=self.region, endpoint_url=self.endpoint, **keys,
            config=Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=30,
                          retries={"max_attempts": 2, "mode": "standard"}))


@functools.cache
def environment_access() -> S3Access:
    """This process's S3 settings (:meth:`S3Access.from_environment`), resolved once: a profile or an
    instance role is looked up once, not at every table opened."""
    return S3Access.from_environment()


@functools.cache
def environment_filesystem() -> Any:
    """An Arrow S3 filesystem with this process's S3 settings (one per process: it pools connections)."""
    filesystem = environment_access().arrow_filesystem()
    atexit.register(_release_filesystem)  # (after pyarrow.fs's own exit hook, so it runs before it)
    return filesystem


def _release_filesystem() -> None:
    """Drop the cached filesystem before pyarrow shuts its S3 support down at exit. Arrow defers that
    shutdown while a filesystem is alive; one still held by this cache then meets the AWS SDK torn down by
    static destructors, and the process, its work done, aborted with SIGABRT now and then."""
    environment_filesystem.cache_clear()
    gc.collect()


def arrow_location(uri: str) -> tuple[str, Any]:
    """What ``pyarrow`` reads ``uri`` with: (``bucket/key``, the S3 filesystem) for an ``s3://`` URI, else
    (the local path, None)."""
    address = S3Address.parse(uri)
    if address is None:
        return uri, None
    return f"{address.bucket}/{address.key}".rstrip("/"), environment_filesystem()


def delta_options_for(uri: str) -> dict[str, str] | None:
    """deltalake's ``storage_options`` for a table at ``uri``: this process's S3 settings for an ``s3://``
    one, None for a local one."""
    return environment_access().delta_options() if S3Address.parse(uri) is not None else None


def check_reachable(address: S3Address, access: S3Access, *, what: str = "storage address") -> None:
    """Raise :class:`StorageAccessError`, one line naming ``address`` and the fix, unless its bucket can be
    listed with ``access``. Writes nothing."""
    from botocore.exceptions import ClientError, ConnectionClosedError, EndpointConnectionError, NoCredentialsError
    from botocore.exceptions import ConnectTimeoutError as BotoConnectTimeout
    from botocore.exceptions import ReadTimeoutError as BotoReadTimeout

    client = access.client()
    try:
        client.list_objects_v2(Bucket=address.bucket, Prefix=address.key, MaxKeys=1)
    except (EndpointConnectionError, BotoConnectTimeout) as exc:
        raise StorageAccessError(
            f"{what} {address}: cannot reach {access.where} ({type(exc).__name__}). Fix: check that the endpoint "
            "is up and AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3) names it", transient=True) from None
    except (BotoReadTimeout, ConnectionClosedError) as exc:
        raise StorageAccessError(
            f"{what} {address}: {access.where} accepted the connection but did not answer ({type(exc).__name__}). "
            "Fix: check that the endpoint is healthy, then start again", transient=True) from None
    except NoCredentialsError:
        raise StorageAccessError(
            f"{what} {address}: no AWS credentials found. Fix: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "or AWS_PROFILE") from None
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("NoSuchBucket", "404") or status == 404:
            raise StorageAccessError(
                f"{what} {address}: bucket {address.bucket!r} does not exist at {access.where}. Fix: create the "
                "bucket, or correct the address") from None
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403", "ExpiredToken") \
                or status == 403:
            raise StorageAccessError(
                f"{what} {address}: {access.where} refused the credentials ({code or status}). Fix: give "
                "credentials that may read and write the bucket (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or "
                "AWS_PROFILE)") from None
        raise StorageAccessError(f"{what} {address}: {access.where} answered {code or status}. Fix: check the "
                                 "address and the endpoint") from None
