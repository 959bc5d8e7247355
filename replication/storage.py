"""An instance's storage root (DESIGN §3): table paths and atomically replaced control files."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from replication.errors import StorageError


def local_path(uri: str) -> Path:
    """Turn ``file:///abs/path`` or a plain path into a local :class:`Path`.

    Only local storage is supported for the control files today; the Delta
    tables themselves would work on any deltalake URI.
    """
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path) if parsed.scheme else uri)
    if len(parsed.scheme) == 1:  # a Windows drive letter, not a scheme
        return Path(uri)
    raise StorageError(
        f"storage URI {uri!r} uses scheme {parsed.scheme!r}; only local paths and file:// URIs "
        "are supported. Fix: point <Storage> at a local or mounted directory."
    )


@dataclass(frozen=True)
class StorageLayout:
    """Paths of one instance's tables and control files under its storage root."""

    root: Path

    @classmethod
    def of(cls, uri: str) -> "StorageLayout":
        return cls(local_path(uri))

    @property
    def txlog(self) -> Path:
        return self.root / "txlog"

    @property
    def inbox(self) -> Path:
        return self.root / "inbox"

    @property
    def rejected(self) -> Path:
        return self.root / "rejected"

    def sow(self, topic_id: str) -> Path:
        return self.root / "sow" / topic_id

    @property
    def control(self) -> Path:
        return self.root / "_control"

    @property
    def instance_json(self) -> Path:
        return self.control / "instance.json"

    @property
    def heartbeat_json(self) -> Path:
        return self.control / "heartbeat.json"

    @property
    def publishers_json(self) -> Path:
        return self.control / "publishers.json"

    @property
    def durable_json(self) -> Path:
        return self.control / "durable.json"

    def ack_file(self, upstream: str) -> Path:
        return self.control / "acks" / f"{upstream}.json"

    def link_file(self, destination: str) -> Path:
        return self.control / "links" / f"{destination}.json"

    def checkpoint(self, query: str) -> Path:
        return self.root / "_checkpoints" / query


def write_json_atomic(path: Path, payload: Any, *, indent: int | None = None) -> None:
    """Replace ``path`` with ``payload`` as JSON so readers never see a torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(payload, fh, indent=indent, separators=(",", ": ") if indent else (",", ":"), sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read_json(path: Path, default: Any = None) -> Any:
    """Read a control file; a missing file gives ``default``."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return default
    except json.JSONDecodeError as exc:
        raise StorageError(f"control file {path} is not valid JSON ({exc}); delete it to rebuild it") from exc
