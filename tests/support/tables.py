"""Txlog and inbox Delta tables written as the engine writes them, for the tests of what reads them."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from replication.connectors.delta.tables import IdempotentAppender
from replication.inbox.schema import INBOX_SCHEMA
from replication.txlog.schema import TXLOG_SCHEMA


def numbered_txlog_rows(first: int, count: int) -> pa.Table:
    """``count`` txlog rows with seq ``first, first+1, ...``."""
    seqs = list(range(first, first + count))
    now = datetime.now(timezone.utc)
    return pa.table(
        {
            "seq": pa.array(seqs, pa.int64()),
            "bookmark": [f"42|{s}|" for s in seqs],
            "publisher": ["pub1"] * count,
            "publisher_seq": pa.array(seqs, pa.int64()),
            "topic": [f"/orders/{s}" for s in seqs],
            "message_type": ["json"] * count,
            "command": ["publish"] * count,
            "sow_key": [None] * count,
            "sow_keys": [None] * count,
            "filter": [None] * count,
            "data": [b'{"seq":%d}' % s for s in seqs],
            "origin": ["amps-1"] * count,
            "received_from": [None] * count,
            "received_from_group": [None] * count,
            "path": [["amps-1"]] * count,
            "publish_time": [now] * count,
            "persist_time": [now] * count,
        },
        schema=TXLOG_SCHEMA,
    )


class TxlogWriter:
    """Appends to a txlog as the ingest writer does: app transaction ``ingest``, commit metadata."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.appender = IdempotentAppender(path, TXLOG_SCHEMA, app_id="ingest", name="txlog")
        self.batch = 0
        self.max_seq = 0

    def append(self, count: int) -> None:
        rows = numbered_txlog_rows(self.max_seq + 1, count)
        metadata = {"batch": self.batch, "first_seq": self.max_seq + 1, "last_seq": self.max_seq + count,
                    "publishers": {"pub1": self.max_seq + count} if count else {}, "links": {}}
        self.appender.append(rows, self.batch, metadata)
        self.batch += 1
        self.max_seq += count


def numbered_inbox_rows(link: str, first: int, count: int) -> pa.Table:
    """What upstream ``link`` pushes: its txlog rows ``first...`` with ``seq`` as ``upstream_seq``."""
    seqs = list(range(first, first + count))
    now = datetime.now(timezone.utc)
    return pa.table(
        {
            "bookmark": [f"{link}|{s}|" for s in seqs],
            "publisher": [f"pub-{link}"] * count,
            "publisher_seq": pa.array(seqs, pa.int64()),
            "topic": ["/orders"] * count,
            "message_type": ["json"] * count,
            "command": ["publish"] * count,
            "sow_key": [None] * count,
            "sow_keys": [None] * count,
            "filter": [None] * count,
            "data": [b'{"n":%d}' % s for s in seqs],
            "origin": [link] * count,
            "received_from": [None] * count,
            "received_from_group": [None] * count,
            "path": [[link]] * count,
            "publish_time": [now] * count,
            "persist_time": [now] * count,
            "upstream_seq": pa.array(seqs, pa.int64()),
            "link": [link] * count,
            "link_group": [f"group-{link}"] * count,
        },
        schema=INBOX_SCHEMA,
    )


class Upstream:
    """One upstream instance appending batches to an inbox (one commit per batch)."""

    def __init__(self, inbox: Path, link: str) -> None:
        self.inbox = inbox
        self.link = link
        self.sent = 0

    def push(self, count: int) -> None:
        write_deltalake(str(self.inbox), numbered_inbox_rows(self.link, self.sent + 1, count), mode="append")
        self.sent += count


def push_concurrently(inbox: Path, upstreams: list[Upstream], batches: int, size: int) -> None:
    """Each upstream commits ``batches`` batches of ``size`` rows, all at the same time."""
    errors: list[BaseException] = []

    def run(upstream: Upstream) -> None:
        try:
            for _ in range(batches):
                upstream.push(size)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(u,)) for u in upstreams]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
