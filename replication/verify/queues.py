"""Queues in ``replication verify``: no message of a queue acknowledged twice across the fabric.

Acknowledgements are txlog rows (a ``sow_delete`` on the queue topic naming
bookmarks) that replicate to every instance hosting the queue, so each
instance's txlog holds the fabric's acknowledgements of the messages it
holds. Two acknowledgement rows naming one message mean two consumers
processed it: the duplicate delivery the spec warns of after a proxied
transfer, or a fault. A barrier message is delivered by every instance
holding it, so it may be acknowledged once per instance (per origin of the
acknowledgements), never twice at one.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from replication.config.model import InstanceConfig, QueueTopic
from replication.connectors.delta.tables import arrow_dataset, open_table
from replication.expressions.columnar import matching
from replication.queues.wire import bookmarks_in
from replication.storage.layout import StorageLayout
from replication.verify.report import LISTED, Compared, Finding, listed

#: The columns of an acknowledgement row the check reads.
ACK_COLUMNS = ["topic", "sow_keys", "publisher", "publisher_seq", "origin"]


def check_queues(cfg: InstanceConfig) -> list[Compared]:
    """One comparison per queue ``cfg`` hosts: its txlog's acknowledgements, message by message. Only the
    acknowledgement rows are read, and the bodies of the messages that may be barriers."""
    if not cfg.queues:
        return []
    dataset = arrow_dataset(open_table(StorageLayout.of(cfg.storage).txlog))
    acks = dataset.to_table(columns=ACK_COLUMNS, filter=(ds.field("command") == "sow_delete")
                            & ds.field("topic").isin(sorted({q.name for q in cfg.queues})))
    return [_check(cfg, queue, acks.filter(pc.equal(acks["topic"], queue.name)), dataset) for queue in cfg.queues]


def _check(cfg: InstanceConfig, queue: QueueTopic, acks: pa.Table, dataset: ds.Dataset) -> Compared:
    compared = Compared(cfg.name, None, cfg.name, topic=queue.name)
    by_message: dict[str, set[tuple[str, int, str]]] = {}
    for sow_keys, publisher, seq, origin in zip(*(acks[c].to_pylist() for c in ("sow_keys", "publisher",
                                                                              "publisher_seq", "origin")),
                                                strict=True):
        for bookmark in bookmarks_in(sow_keys):
            by_message.setdefault(bookmark, set()).add((publisher, seq, origin or ""))
    compared.messages = len(by_message)
    twice = {b for b, acked in by_message.items() if len(acked) > 1}
    if twice and queue.barrier is not None:  # a barrier: once per instance
        barriers = _barriers(queue, dataset, twice)
        twice = {b for b in twice if b not in barriers
                 or len({origin for _p, _s, origin in by_message[b]}) < len(by_message[b])}
    if twice:
        listed_twice = sorted(twice)
        compared.findings.append(Finding(
            "queue", cfg.name, cfg.name, None,
            f"queue {queue.name!r}: {len(twice):,} message(s) acknowledged more than once: bookmark "
            f"{listed(listed_twice, len(twice))} (by {_clients(by_message[listed_twice[0]])})",
            topic=queue.name, bookmarks=tuple(listed_twice[:LISTED])))
    return compared


def _barriers(queue: QueueTopic, dataset: ds.Dataset, bookmarks: set[str]) -> set[str]:
    """Which of ``bookmarks`` are the queue's barrier messages (their publish matches its barrier expression)."""
    assert queue.barrier is not None
    published = dataset.to_table(columns=["bookmark", "data"], filter=(ds.field("command") == "publish")
                                 & ds.field("bookmark").isin(sorted(bookmarks)))
    if not published.num_rows:
        return set()
    hits = matching(queue.barrier, published["data"], queue.message_type)
    return set(published["bookmark"].filter(pa.array(hits)).to_pylist())


def _clients(acked: set[tuple[str, int, str]]) -> str:
    return ", ".join(f"{publisher} at {origin or '?'}" for publisher, _seq, origin in sorted(acked))
