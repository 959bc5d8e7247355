"""The inbox table: what upstream instances append (DESIGN §3), its columns, and its creation."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from replication.connectors.delta.tables import open_or_create
from replication.txlog.schema import TXLOG_SCHEMA

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from replication.connectors.s3.objects import ObjectPath

#: Columns of the inbox table: a txlog row of the upstream without its local
#: ``seq``, which becomes ``upstream_seq``, and the link it came by.
INBOX_SCHEMA = pa.schema(
    [f for f in TXLOG_SCHEMA if f.name != "seq"]
    + [
        pa.field("upstream_seq", pa.int64(), nullable=False),  # the row's seq in the upstream's txlog
        pa.field("link", pa.string(), nullable=False),  # upstream instance name
        pa.field("link_group", pa.string(), nullable=False),  # upstream instance group
    ]
)

#: Columns of the stream: :data:`INBOX_SCHEMA` plus the Delta version that committed the row.
STREAM_SCHEMA = INBOX_SCHEMA.append(pa.field("inbox_version", pa.int64(), nullable=False))

#: Columns of a ``versionsOnly`` stream: one row per inbox version.
VERSIONS_SCHEMA = pa.schema([pa.field("inbox_version", pa.int64(), nullable=False)])

#: Table properties of an inbox. The change data feed is what Delta readers
#: (delta-spark, Databricks) require before they stream changes by version.
INBOX_TABLE_CONFIGURATION: dict[str, str] = {"delta.enableChangeDataFeed": "true"}

#: commitInfo key of an inbox commit that hands the instance a backfill part staged beside the inbox (its
#: descriptor, JSON; the commit adds no rows): see :mod:`replication.inbox.staged_parts`.
STAGED_PART_KEY = "replication.staged_part"


def create_inbox(path: Path | ObjectPath | str, storage_options: dict[str, str] | None = None) -> DeltaTable:
    """Open the inbox at ``path`` (a local path or an object-store URI), creating it (with the change data feed
    on) if absent."""
    return open_or_create(path, INBOX_SCHEMA, name="inbox", configuration=INBOX_TABLE_CONFIGURATION,
                          storage_options=storage_options)
