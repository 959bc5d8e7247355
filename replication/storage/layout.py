"""Where an instance keeps things under its storage root (DESIGN §3), and the names built from instance names.

Every table and control-file path comes from :class:`StorageLayout`; every
name made of two instances' names (a link's app transaction, its replicator's
thread, its manager's thread) comes from :func:`link_name`, so they cannot
drift apart.
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar
from urllib.parse import unquote, urlparse

from replication.connectors.s3.access import S3Address, check_reachable
from replication.connectors.s3.objects import ObjectPath
from replication.errors import UnsupportedAddressError

#: Where an instance keeps a table or a control file: a local (or mounted) path, or a key in an S3 bucket.
StoragePath = Path | ObjectPath

#: Checkpoint folder of the ingest query.
INGEST_QUERY = "ingest"


def local_path(uri: str) -> Path:
    """Turn ``file:///abs/path`` or a plain path into a local :class:`Path`; a scheme other than ``file``
    (or ``s3``, which :meth:`StorageLayout.of` takes first) is refused with :class:`UnsupportedAddressError`."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path) if parsed.scheme else uri)
    if len(parsed.scheme) == 1:  # a Windows drive letter, not a scheme
        return Path(uri)
    raise UnsupportedAddressError(
        f"storage address {uri!r} uses scheme {parsed.scheme!r}, which is not supported yet. Fix: use "
        "s3://bucket/prefix, file:///path or a plain path"
    )


def storage_path(uri: str) -> StoragePath:
    """``uri`` as the path of its kind: :class:`ObjectPath` for ``s3://``, else a local :class:`Path`."""
    return StorageLayout.of(uri).root


def remove_tree(path: StoragePath) -> None:
    """Remove a folder and everything under it, on a disk or in a bucket (nothing there: nothing to do)."""
    if isinstance(path, ObjectPath):
        path.delete_tree()
    else:
        shutil.rmtree(path, ignore_errors=True)


def spark_location(path: StoragePath) -> str:
    """How Spark (Hadoop's filesystems) names ``path``: ``s3a://bucket/key`` for a key in a bucket."""
    if isinstance(path, ObjectPath):
        return f"s3a://{path.address.bucket}/{path.address.key}"
    return str(path)


def spark_uri(uri: str) -> str:
    """How Spark names a file or table at ``uri`` (as deltalake and the config give it): ``s3a://`` for
    ``s3://`` (Hadoop's S3 filesystem is S3A), any other unchanged."""
    return f"s3a://{uri.removeprefix('s3://')}" if uri.startswith("s3://") else uri


def link_name(upstream: str, destination: str, incarnation: str | None = None) -> str:
    """``<upstream>-><destination>`` (``#<incarnation>`` for one replicator incarnation).

    Names the link's thread, and with the incarnation its replicator thread and
    its app transaction in the destination's inbox.
    """
    name = f"{upstream}->{destination}"
    return f"{name}#{incarnation}" if incarnation else name


#: A layout's kind of path: local (:class:`Path`) or in a bucket (:class:`ObjectPath`).
P = TypeVar("P", Path, ObjectPath)


@dataclass(frozen=True)
class StorageLayout(Generic[P]):
    """Paths of one instance's tables and control files under its storage root: a local (or mounted) folder,
    or a prefix in an S3 bucket (reached with the standard AWS settings of this process)."""

    root: P

    @staticmethod
    def of(uri: str) -> StorageLayout[Path] | StorageLayout[ObjectPath]:
        if S3Address.parse(uri) is not None:
            return StorageLayout(ObjectPath.of(uri))
        return StorageLayout(local_path(uri))

    @staticmethod
    def local(uri: str, what: str) -> StorageLayout[Path]:
        """The layout of a local (or mounted) root, for ``what`` that is not supported on object storage yet
        (:class:`UnsupportedAddressError` for an S3 one; config load refuses what would get here)."""
        layout = StorageLayout.of(uri)
        if isinstance(layout.root, ObjectPath):
            raise UnsupportedAddressError(f"{what} at {uri}: not supported on object storage yet")
        return StorageLayout(layout.root)

    def check_reachable(self, what: str = "<Storage>") -> StorageLayout[P]:
        """This layout, once its bucket answered a listing with this process's settings (on S3); else a
        :class:`~replication.connectors.s3.access.StorageAccessError`, one line naming ``what``, the address
        and the fix (unreachable endpoint, refused credentials, missing bucket). Writes nothing."""
        if isinstance(self.root, ObjectPath):
            check_reachable(self.root.address, self.root.access, what=what)
        return self

    @property
    def txlog(self) -> P:
        return self.root / "txlog"

    @property
    def inbox(self) -> P:
        return self.root / "inbox"

    @property
    def rejected(self) -> P:
        return self.root / "rejected"

    def sow(self, topic_id: str) -> P:
        return self.root / "sow" / topic_id

    @property
    def control(self) -> P:
        return self.root / "_control"

    @property
    def instance_json(self) -> P:
        return self.control / "instance.json"

    @property
    def heartbeat_json(self) -> P:
        return self.control / "heartbeat.json"

    @property
    def publishers_json(self) -> P:
        return self.control / "publishers.json"

    @property
    def durable_json(self) -> P:
        return self.control / "durable.json"

    @property
    def retention_json(self) -> P:
        """What retention removed from the txlog (:mod:`replication.txlog.retention`)."""
        return self.control / "retention.json"

    @property
    def bootstrap_json(self) -> P:
        return self.control / "bootstrap.json"

    @property
    def bootstrap_staging(self) -> P:
        """Where a bootstrap keeps the source's SOW records until its txlog copy is done."""
        return self.root / "_bootstrap"

    def backfill_parts(self, client: str) -> P:
        """Where the Spark tasks of a backfill by ``client`` announce each part they have written (see
        :mod:`replication.backfill`); scratch, cleared by the client's next backfill."""
        return self.root / "_backfill" / hashlib.sha256(client.encode()).hexdigest()[:32]  # (any name, any length)

    def backfill_staging(self, client: str) -> P:
        """Where a backfill by ``client`` stages its parts as txlog files until the instance stores them (moved
        into the txlog as they are, see :mod:`replication.ingest.staged_parts`): in the inbox, its entrance."""
        return self.inbox / "_backfill" / hashlib.sha256(client.encode()).hexdigest()[:32]  # (staged_parts.STAGING)

    def backfill_input(self, client: str) -> P:
        """The files (name, rows) of the backfills by ``client``, in order: a re-run must give them first."""
        return self.control / "backfill" / f"{hashlib.sha256(client.encode()).hexdigest()[:32]}.json"

    def ack_file(self, upstream: str) -> P:
        return self.control / "acks" / f"{upstream}.json"

    def link_file(self, destination: str) -> P:
        return self.control / "links" / f"{destination}.json"

    def manual_downgrade_file(self, destination: str) -> P:
        """Present while an operator has downgraded ``destination`` (``replication downgrade``)."""
        return self.control / "downgraded" / f"{destination}.json"

    @property
    def proxied_transfer_json(self) -> P:
        """The instances whose queue messages this one takes over (``replication queue``)."""
        return self.control / "proxied_transfer.json"

    def checkpoint(self, query: str) -> P:
        return self.root / "_checkpoints" / query

