"""Inbox rows as an upstream's replicator appends them, for tests that write inboxes directly."""

from __future__ import annotations

import json

import pyarrow as pa

from replication.inbox.schema import INBOX_SCHEMA


def inbox_rows(n: int, *, link: str = "amps-1", publisher: str = "pub", first: int = 1) -> pa.Table:
    """``n`` rows from ``link`` of ``publisher``, sequences from ``first`` (upstream seq = publisher seq)."""
    seqs = list(range(first, first + n))
    return pa.table({
        "bookmark": [f"1|{s}" for s in seqs], "publisher": [publisher] * n, "publisher_seq": seqs,
        "topic": ["/orders"] * n, "message_type": ["json"] * n, "command": ["publish"] * n,
        "sow_key": [None] * n, "sow_keys": [None] * n, "filter": [None] * n,
        "data": [json.dumps({"i": s}).encode() for s in seqs], "origin": [link] * n,
        "received_from": [None] * n, "received_from_group": [None] * n, "path": [[link]] * n,
        "publish_time": pa.array([None] * n, pa.timestamp("us", tz="UTC")),
        "persist_time": pa.array([None] * n, pa.timestamp("us", tz="UTC")),
        "upstream_seq": seqs, "link": [link] * n, "link_group": [link] * n,
    }).cast(INBOX_SCHEMA)
