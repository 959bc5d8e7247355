"""The columns of the tables the ingest query writes: the txlog (DESIGN §3) and ``rejected/``."""

from __future__ import annotations

import pyarrow as pa

TXLOG_SCHEMA = pa.schema(
    [
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("bookmark", pa.string(), nullable=False),
        pa.field("publisher", pa.string(), nullable=False),
        pa.field("publisher_seq", pa.int64(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("message_type", pa.string(), nullable=False),
        pa.field("command", pa.string(), nullable=False),
        # The SOW record key(s) this row changed here: a publish's key; the keys a sow_delete removed.
        pa.field("sow_key", pa.string()),
        # A sow_delete as published, replicated so each instance applies it to its own SOW:
        # by keys (the amps-sow-keys header as given) or by filter (amps-filter); by data: neither, the body.
        pa.field("sow_keys", pa.string()),
        pa.field("filter", pa.string()),
        pa.field("data", pa.binary()),
        pa.field("origin", pa.string(), nullable=False),
        pa.field("received_from", pa.string()),
        pa.field("received_from_group", pa.string()),
        pa.field("path", pa.list_(pa.string())),
        pa.field("publish_time", pa.timestamp("us", tz="UTC")),
        pa.field("persist_time", pa.timestamp("us", tz="UTC")),
    ]
)

REJECTED_SCHEMA = pa.schema(
    [
        pa.field("reason", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("kafka_topic", pa.string()),
        pa.field("kafka_partition", pa.int32()),
        pa.field("kafka_offset", pa.int64()),
        pa.field("publisher", pa.string()),
        pa.field("publisher_seq", pa.string()),
        pa.field("topic", pa.string()),
        pa.field("message_type", pa.string()),
        pa.field("command", pa.string()),
        pa.field("data", pa.binary()),
        pa.field("rejected_time", pa.timestamp("us", tz="UTC")),
    ]
)
