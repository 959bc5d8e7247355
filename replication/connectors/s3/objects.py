"""Keys of an S3 bucket used as :class:`pathlib.Path` is for files: what an instance's control files need.

An instance whose ``<Storage>`` is ``s3://bucket/prefix`` keeps its
``_control/`` files there. :class:`ObjectPath` answers the part of ``Path``'s
interface that code uses for them (``/``, ``name``, ``parent``, reading and
writing whole files, ``exists``, ``unlink``, listing a folder), so one code
path serves a local root and a bucket. What differs is said here:

* **A put replaces an object whole**: a reader sees the old body or the new
  one, never part of either, so no temporary file and rename are needed.
* **Folders do not exist** on S3: ``mkdir`` does nothing; a folder "exists"
  while a key lies under it.
* **Conditional writes** (:meth:`ObjectPath.write_bytes` with ``if_match`` or
  ``if_none_match``) make a read-modify-write safe against another writer:
  the put is refused (:class:`PreconditionFailed`) if the object changed since
  it was read, or already exists.
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from replication.connectors.s3.access import S3Access, S3Address, environment_access
from replication.errors import StorageError


class PreconditionFailed(StorageError):
    """A conditional put was refused: the object changed since it was read, or exists already."""

    transient = False


@functools.lru_cache(maxsize=16)
def _client(access: S3Access) -> Any:
    """One boto3 client per set of settings (boto3 clients may be shared between threads)."""
    return access.client()


def _missing(exc: Exception) -> bool:
    response = getattr(exc, "response", None) or {}
    code = response.get("Error", {}).get("Code", "")
    return code in ("NoSuchKey", "404", "NotFound") or response.get("ResponseMetadata", {}).get(
        "HTTPStatusCode") == 404


@dataclass(frozen=True)
class ObjectPath:
    """``s3://bucket/key`` with the settings that reach it; ``str()`` is the URI (no secret in it or ``repr``)."""

    address: S3Address
    access: S3Access = field(compare=False, repr=False)

    @classmethod
    def of(cls, uri: str, access: S3Access | None = None) -> ObjectPath:
        address = S3Address.parse(uri)
        if address is None:
            raise ValueError(f"{uri!r} is not an s3:// address")
        return cls(address, access if access is not None else environment_access())

    # -- names -------------------------------------------------------------------------------------------

    def __truediv__(self, part: str) -> ObjectPath:
        return ObjectPath(self.address.child(str(part)), self.access)

    def __str__(self) -> str:
        return self.address.uri

    @property
    def uri(self) -> str:
        return self.address.uri

    @property
    def name(self) -> str:
        return self.address.key.rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:
        dot = self.name.rfind(".")
        return self.name[dot:] if dot > 0 else ""

    @property
    def parent(self) -> ObjectPath:
        return ObjectPath(S3Address(self.address.bucket, self.address.key.rpartition("/")[0]), self.access)

    def with_suffix(self, suffix: str) -> ObjectPath:
        stem = self.name[: -len(self.suffix)] if self.suffix else self.name
        return self.parent / f"{stem}{suffix}"

    @property
    def storage_options(self) -> dict[str, str]:
        """deltalake's options for a table at this address."""
        return self.access.delta_options()

    # -- reading and writing -----------------------------------------------------------------------------

    def read_bytes(self) -> bytes:
        """The object's body; ``FileNotFoundError`` when there is none, as ``Path.read_bytes`` raises."""
        return self.read_with_etag()[0]

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def read_with_etag(self) -> tuple[bytes, str]:
        """The body and its ETag, for a conditional write back (:meth:`write_bytes` ``if_match``)."""
        try:
            got = _client(self.access).get_object(Bucket=self.address.bucket, Key=self.address.key)
        except Exception as exc:
            if _missing(exc):
                raise FileNotFoundError(f"{self}: no such object") from None
            raise StorageError(f"{self}: cannot be read ({type(exc).__name__}: {exc})") from None
        return got["Body"].read(), got["ETag"]

    def write_bytes(self, data: bytes, *, if_match: str | None = None, if_none_match: bool = False) -> str:
        """Put ``data`` whole; returns the new ETag. ``if_match``: only over the body read with that ETag;
        ``if_none_match``: only if no object is there. Either refused: :class:`PreconditionFailed`."""
        kwargs: dict[str, Any] = {}
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        try:
            put = _client(self.access).put_object(Bucket=self.address.bucket, Key=self.address.key, Body=data,
                                                  **kwargs)
        except Exception as exc:
            response = getattr(exc, "response", None) or {}
            if response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (409, 412):
                raise PreconditionFailed(f"{self}: changed by another writer since it was read") from None
            raise StorageError(f"{self}: cannot be written ({type(exc).__name__}: {exc})") from None
        return str(put.get("ETag", ""))

    def write_text(self, text: str, encoding: str = "utf-8") -> str:
        return self.write_bytes(text.encode(encoding))

    def unlink(self, missing_ok: bool = False) -> None:
        if not missing_ok and not self.is_file():
            raise FileNotFoundError(f"{self}: no such object")
        _client(self.access).delete_object(Bucket=self.address.bucket, Key=self.address.key)

    def delete_tree(self) -> None:
        """Delete every object under this key as a folder (``shutil.rmtree`` of a folder): a thousand per request."""
        keys = [{"Key": p.address.key} for p in self._keys(recursive=True)]
        for start in range(0, len(keys), 1000):
            _client(self.access).delete_objects(Bucket=self.address.bucket,
                                                Delete={"Objects": keys[start:start + 1000], "Quiet": True})

    # -- what is there -----------------------------------------------------------------------------------

    def is_file(self) -> bool:
        try:
            _client(self.access).head_object(Bucket=self.address.bucket, Key=self.address.key)
        except Exception as exc:
            if _missing(exc):
                return False
            raise StorageError(f"{self}: cannot be read ({type(exc).__name__}: {exc})") from None
        return True

    def is_dir(self) -> bool:
        """Whether some key lies under this one as a folder."""
        return next(self._keys(recursive=True, limit=1), None) is not None

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def mkdir(self, mode: int = 0o777, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to do: a key needs no folder."""

    def iterdir(self) -> Iterator[ObjectPath]:
        """The objects and folders directly under this one."""
        yield from self._keys(recursive=False)

    def glob(self, pattern: str) -> Iterator[ObjectPath]:
        """The objects directly under this one whose names match ``pattern`` (no ``**``)."""
        return (p for p in self._keys(recursive=False) if fnmatch.fnmatchcase(p.name, pattern))

    def _keys(self, *, recursive: bool, limit: int | None = None) -> Iterator[ObjectPath]:
        prefix = f"{self.address.key}/" if self.address.key else ""
        kwargs: dict[str, Any] = {"Bucket": self.address.bucket, "Prefix": prefix}
        if not recursive:
            kwargs["Delimiter"] = "/"
        if limit is not None:
            kwargs["PaginationConfig"] = {"MaxItems": limit}
        pages = _client(self.access).get_paginator("list_objects_v2").paginate(**kwargs)
        for page in pages:
            for common in page.get("CommonPrefixes", []):
                yield ObjectPath(S3Address(self.address.bucket, common["Prefix"].rstrip("/")), self.access)
            for item in page.get("Contents", []):
                yield ObjectPath(S3Address(self.address.bucket, item["Key"]), self.access)
