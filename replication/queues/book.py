"""Every queue of one instance: txlog rows folded in, acknowledgements checked, subscribe requests taken (pure).

:class:`QueueBook` is what the ingest asks (is this ``sow_delete`` an acknowledgement, and may it be stored?)
and what the dispatcher delivers from. It holds no lock: its owner serializes calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from replication.config.model import InstanceConfig
from replication.expressions import Filter, FilterSyntaxError
from replication.queues.state import Delivery, QueueState
from replication.queues.wire import (
    QUEUE_MANAGEMENT,
    SUBSCRIBE,
    TRANSFER,
    TRANSFER_REQUEST,
    QueueRequest,
    Refusal,
    bookmarks_in,
    manager_client,
    transfer_of,
)

if TYPE_CHECKING:
    from replication.txlog.reader import TxlogReader

#: Columns of the txlog rows a queue reads.
COLUMNS = ["seq", "bookmark", "publisher", "publisher_seq", "topic", "message_type", "command", "sow_keys", "data",
           "origin"]


class QueueBook:
    """The queues of one instance, by queue topic."""

    def __init__(self, cfg: InstanceConfig) -> None:
        self.instance = cfg.name
        self.queues: dict[str, QueueState] = {q.name: QueueState(q, cfg.name) for q in cfg.queues}
        self.applied_seq = 0
        """The txlog's rows through this seq are folded in."""
        self.manager = manager_client(cfg.name)
        self.manager_stored = 0
        """The highest sequence of this instance's own queue rows (client ``<instance>.queues``) stored."""
        self.requests: list[tuple[QueueState, list[str], str]] = []
        """Transfer requests of other instances stored since the dispatcher last took them: (queue, bookmarks,
        the instance asking)."""

    @property
    def topics(self) -> frozenset[str]:
        return frozenset(self.queues)

    # -- the txlog --------------------------------------------------------------------------------------

    def relevant(self, rows: pa.Table) -> pa.Table:
        """The rows of ``rows`` a queue reads: publishes on an underlying topic, sow_deletes on a queue topic."""
        if rows.num_rows == 0 or not self.queues:
            return rows.slice(0, 0)
        keys = pc.binary_join_element_wise(pc.fill_null(rows["topic"], ""), pc.fill_null(rows["message_type"], ""),
                                           "\x00")
        underlying = [key for key in pc.unique(keys).to_pylist()
                      if any(q.takes(*key.split("\x00", 1)) for q in self.queues.values())]
        publish = pc.and_(pc.equal(rows["command"], "publish"), pc.is_in(keys, pa.array(underlying, pa.string())))
        acks = pc.and_(pc.is_in(rows["command"], pa.array(("sow_delete", *QUEUE_MANAGEMENT))),
                       pc.is_in(rows["topic"], pa.array(sorted(self.queues), pa.string())))
        return rows.filter(pc.fill_null(pc.or_(publish, acks), False))

    def fold_txlog(self, reader: TxlogReader, now: float = 0.0) -> int:
        """Fold in every row ``reader``'s txlog still holds (from its first retained seq; its transfer requests
        are not answered). How many rows were read."""
        through = reader.committed_seq() if reader.exists() else 0
        after = reader.first_retained()[0] - 1 if through else 0  # (retention removed what is before)
        rows = 0
        for part in reader.read(after, through) if through > after else ():
            rows += part.num_rows
            self.apply(part.select(COLUMNS), now, live=False)
        self.applied_seq = max(self.applied_seq, through)
        return rows

    def apply(self, rows: pa.Table, now: float = 0.0, *, live: bool = True) -> None:
        """Fold stored txlog rows (in seq order; any columns holding :data:`COLUMNS`) into the queues.
        ``live``: rows just stored, whose transfer requests are to be answered (a restart's fold answers
        none: an old request is made again if still wanted)."""
        if rows.num_rows:
            self.applied_seq = max(self.applied_seq, int(pc.max(rows["seq"]).as_py()))
        mine = self.relevant(rows)
        if mine.num_rows == 0:
            return
        # (column by column, not ``to_pylist()``: a dict per row was most of folding a commit in)
        columns = [mine[name].to_pylist() for name in COLUMNS]
        for seq, bookmark, publisher, publisher_seq, topic, message_type, command, sow_keys, data, origin \
                in zip(*columns):
            if publisher == self.manager and publisher_seq is not None:
                self.manager_stored = max(self.manager_stored, publisher_seq)
            if command == "publish":
                for queue in self.queues.values():
                    if queue.takes(topic, message_type):
                        queue.add(seq, bookmark, topic, data or b"", origin, now)
                continue
            queue = self.queues[topic]
            if command == "sow_delete":
                queue.remove(bookmarks_in(sow_keys), publisher, now, local=origin == self.instance)
            elif command == TRANSFER:
                bookmarks, to = transfer_of(data)
                queue.transferred(bookmarks, to, now)
            elif command == TRANSFER_REQUEST and live:
                bookmarks, to = transfer_of(data)
                if to != self.instance:
                    self.requests.append((queue, bookmarks, to))

    # -- acknowledgements published here ----------------------------------------------------------------

    def check_acks(self, acks: list[tuple[str, str, str | None]], manager: str) -> list[str | None]:
        """Why each ``(client, queue topic, sow_keys)`` acknowledgement of one batch cannot be stored (None: it
        can). ``manager``: the client name of this instance's own removals, which are always taken."""
        taken: dict[str, set[str]] = {}
        out: list[str | None] = []
        for client, topic, keys in acks:
            queue = self.queues[topic]
            if client == manager:
                out.append(None)
                continue
            out.append(queue.check_ack(client, bookmarks_in(keys), taken.setdefault(topic, set())))
        return out

    def seen_acks(self, acks: list[tuple[str, str, str]]) -> int:
        """Acknowledgements ``(client, queue topic, sow_keys)`` seen on Kafka before the ingest checks them: the
        room of what they name is freed (:meth:`QueueState.seen_acks`). How many bookmarks freed room."""
        return sum(self.queues[topic].seen_acks(client, bookmarks_in(keys)) for client, topic, keys in acks
                   if topic in self.queues)

    # -- consumers ---------------------------------------------------------------------------------------

    def request(self, request: QueueRequest, now: float) -> Refusal | None:
        """Take a subscribe or unsubscribe; a refusal for one that cannot be taken."""
        queue = self.queues.get(request.topic)
        if queue is None:
            known = ", ".join(sorted(self.queues)) or "none"
            return Refusal(request.client, request.topic,
                           f"topic {request.topic!r} is not a queue of {self.instance} (its queues: {known}); "
                           "subscribe to a queue topic defined in <SOW>")
        if request.command != SUBSCRIBE:
            queue.unsubscribe(request.client)
            return None
        try:
            text, backlog = request.options()
            flt = Filter(text) if text else None
        except (ValueError, FilterSyntaxError) as exc:
            return Refusal(request.client, request.topic, f"subscribe to {request.topic!r}: {exc}")
        queue.subscribe(request.client, flt, backlog, now, session=request.session)
        return None

    def expire(self, now: float, silent_after: float) -> int:
        return sum(q.expire(now, silent_after) for q in self.queues.values())

    def dispatch(self, now: float) -> list[tuple[QueueState, list[Delivery]]]:
        return [(q, d) for q in self.queues.values() if (d := q.dispatch(now))]

    def status(self, now: float) -> dict[str, dict]:
        return {name: q.status(now) for name, q in self.queues.items()}
