"""Signed inbox commits: who wrote an inbox commit, and whether its rows are what they signed.

An upstream replicator with a key (its destination's ``<Authenticator>``) puts a signature in the
``commitInfo`` of every commit it appends to a downstream inbox (key :data:`SIGNATURE_KEY`)::

    {"v": 1, "upstream": "amps-1", "to": "amps-2", "app": "amps-1->amps-2#<incarnation>", "batch": 17250,
     "rows": 5000, "digest": "<sha256 of the rows>", "mac": "<HMAC-SHA256 of the rest>"}

The downstream (its incoming transport's ``<Authentication>``) checks each commit before it takes
its rows (:class:`CommitVerifier`): the MAC with the key it holds for the named upstream, the
digest against the rows it read, and that the batch is newer than any the same replicator
committed before (Delta's app transaction of that replicator just before the commit), for this instance's
inbox (``to``: a commit copied from another instance's inbox is refused too). So a commit
written by anyone without the key is refused as unsigned or forged, one changed after signing as
tampered, and a valid commit copied again as replayed.

The digest is of the rows' values in :data:`~replication.inbox.schema.INBOX_SCHEMA` column order,
independent of how they are chunked or encoded in Parquet: what one side writes and the other reads
hash the same.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replication.inbox.schema import INBOX_SCHEMA

log = logging.getLogger(__name__)

#: ``commitInfo`` key of an inbox commit's signature.
SIGNATURE_KEY = "replication.signature"
_VERSION = 1


def rows_digest(rows: pa.Table) -> str:
    """SHA-256 of ``rows``' values (INBOX_SCHEMA columns, in order): the same for the same rows however
    they are chunked."""
    if rows.schema != INBOX_SCHEMA:
        rows = rows.select(INBOX_SCHEMA.names).cast(INBOX_SCHEMA)
    total = hashlib.sha256(str(rows.num_rows).encode())
    for name in INBOX_SCHEMA.names:
        for part in _column_digests(rows[name]):
            total.update(part)
    return total.hexdigest()


def _column_digests(column: pa.ChunkedArray) -> list[bytes]:
    """Digests of one column: of its value lengths or null marks, and of its value bytes (a list column: of
    its list lengths, then of its items as a column)."""
    if pa.types.is_list(column.type):
        lengths = hashlib.sha256()
        for chunk in column.chunks:
            lengths.update(_int64_bytes(pc.fill_null(pc.list_value_length(chunk), -1)))
        items = pa.chunked_array([pc.list_flatten(chunk) for chunk in column.chunks], column.type.value_type)
        return [lengths.digest(), *_column_digests(items)]
    shape, data = hashlib.sha256(), hashlib.sha256()
    for chunk in column.chunks:
        _feed(chunk, shape, data)
    return [shape.digest(), data.digest()]


def _feed(chunk: pa.Array, shape, data) -> None:
    kind = chunk.type
    if pa.types.is_string(kind) or pa.types.is_binary(kind):
        shape.update(_int64_bytes(pc.fill_null(pc.binary_length(chunk), -1)))
        filled = pc.fill_null(chunk, pa.scalar(b"" if pa.types.is_binary(kind) else "", kind)) \
            if chunk.null_count else chunk
        offsets = np.frombuffer(filled.buffers()[1], dtype=np.int32)[filled.offset:filled.offset + len(filled) + 1]
        values = filled.buffers()[2]
        if values is not None and len(filled):
            data.update(memoryview(values)[int(offsets[0]):int(offsets[-1])])
        return
    # fixed width (int64, timestamps): the values as int64, nulls marked in the shape digest
    shape.update(pc.is_null(chunk).to_numpy(zero_copy_only=False).astype(np.uint8).tobytes())
    data.update(_int64_bytes(pc.fill_null(chunk.cast(pa.int64()), 0)))


def _int64_bytes(values: pa.Array) -> bytes:
    return values.cast(pa.int64()).to_numpy(zero_copy_only=False).astype("<i8", copy=False).tobytes()


def _mac(key: bytes, fields: Mapping[str, object]) -> str:
    payload = json.dumps({k: fields[k] for k in sorted(fields) if k != "mac"}, separators=(",", ":"))
    return hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()


def sign(key: bytes, *, upstream: str, to: str, app_id: str, batch: int, rows: pa.Table) -> str:
    """The signature (JSON, for ``commitInfo[SIGNATURE_KEY]``) of the commit ``app_id`` version ``batch``
    appending ``rows`` to the inbox of instance ``to``, by ``upstream``."""
    fields: dict[str, object] = {"v": _VERSION, "upstream": upstream, "to": to, "app": app_id, "batch": int(batch),
                                 "rows": rows.num_rows, "digest": rows_digest(rows)}
    fields["mac"] = _mac(key, fields)
    return json.dumps(fields, separators=(",", ":"))


@dataclass(frozen=True)
class Refusal:
    """Why an inbox commit is not taken, and the upstream it names (``?`` when it names none)."""

    upstream: str
    reason: str


class CommitVerifier:
    """Checks inbox commits against the keys of the upstreams admitted (see the module docstring).

    ``keys``: upstream instance name -> its key. ``check`` is called with each version's rows in version
    order; a version checked again (a micro-batch retried) gets the same answer.
    """

    #: Verdicts remembered for a retried batch.
    REMEMBER = 4096

    def __init__(self, path: str, keys: Mapping[str, bytes], instance: str) -> None:
        """``instance``: the name of the instance whose inbox this is (a commit signed for another is refused)."""
        self.path = path
        self.keys = dict(keys)
        self.instance = instance
        self._newest: dict[str, int] = {}
        """Per replicator (app id): the newest batch taken."""
        self._verdicts: dict[int, Refusal | None] = {}

    def check(self, version: int, rows: pa.Table, commit_info: Mapping[str, object] | None) -> Refusal | None:
        """Why the commit ``version`` (its ``commitInfo`` and the rows it appended) is refused; None: taken."""
        if version in self._verdicts:
            return self._verdicts[version]
        verdict = self._verdict(version, rows, commit_info or {})
        if len(self._verdicts) >= self.REMEMBER:
            for old in sorted(self._verdicts)[: self.REMEMBER // 2]:
                del self._verdicts[old]
        self._verdicts[version] = verdict
        return verdict

    def _verdict(self, version: int, rows: pa.Table, info: Mapping[str, object]) -> Refusal | None:
        named = _named_upstream(rows, info)
        reason = self._reason(version, rows, info, named)
        if reason is None:
            return None
        return Refusal(reason[0] or named or "?", reason[1])

    def _reason(self, version: int, rows: pa.Table, info: Mapping[str, object],
                named: str | None) -> tuple[str | None, str] | None:
        """(the upstream the signature names, why) when the commit is refused."""
        where = f"inbox commit {version}" + (f" (upstream {named})" if named else "")
        raw = info.get(SIGNATURE_KEY)
        if not raw:
            return None, f"{where}: unsigned: this instance takes only commits signed by an upstream it holds a key for"
        try:
            fields = json.loads(str(raw))
            upstream, app, batch = str(fields["upstream"]), str(fields["app"]), int(fields["batch"])
            mac, digest, count = str(fields["mac"]), str(fields["digest"]), int(fields["rows"])
            to = str(fields["to"])
        except (ValueError, KeyError, TypeError):
            return None, f"{where}: the signature cannot be read"
        where = f"inbox commit {version} (upstream {upstream})"
        key = self.keys.get(upstream)
        if key is None:
            return upstream, (f"{where}: upstream {upstream} is not admitted: <Authentication> of the incoming "
                              "transport holds no key for it")
        if not hmac.compare_digest(mac, _mac(key, fields)):
            return upstream, f"{where}: forged: the signature does not verify with the key held for {upstream}"
        if to != self.instance:
            return upstream, f"{where}: replayed: signed for the inbox of {to}, not of {self.instance}"
        if named and named != upstream:
            return upstream, f"{where}: tampered: its rows name upstream {named}, the signature {upstream}"
        if count != rows.num_rows or digest != rows_digest(rows):
            return upstream, f"{where}: tampered: its rows are not the rows {upstream} signed"
        newest = self._newest.get(app)
        if newest is None:
            newest = self._newest[app] = self._committed_before(app, version)
        if batch <= newest:
            return upstream, (f"{where}: replayed: batch {batch} of {app} was already committed (newest "
                              f"before it: {newest})")
        self._newest[app] = batch
        return None

    def _committed_before(self, app: str, version: int) -> int:
        """The replicator ``app``'s app-transaction version in the inbox just before ``version`` (-1: none)."""
        if version <= 0:
            return -1
        from replication.connectors.delta.tables import open_table

        committed = open_table(self.path, version=version - 1).transaction_version(app)
        return -1 if committed is None else int(committed)


def _named_upstream(rows: pa.Table, info: Mapping[str, object]) -> str | None:
    """The upstream a commit names: its rows' ``link``, else its batch record's."""
    if rows.num_rows:
        links = pc.unique(rows["link"]).to_pylist()
        return str(links[0]) if len(links) == 1 else ",".join(sorted(str(x) for x in links))
    batch = info.get("replication.batch")
    try:
        return str(json.loads(str(batch))["link"]) if batch else None
    except (ValueError, KeyError, TypeError):
        return None
