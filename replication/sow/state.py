"""The current record per key of an instance's SOW topics, kept in the driver, and what a batch does to it.

The ingest writer needs the current record of a key when a delta_publish
arrives (the merged message is what is stored) and every current record of a
topic when a sow_delete by filter arrives, within one micro-batch, in ``seq``
order. :class:`SowState` holds each key's body, by SOW topic and topic;
it is rebuilt at start from the SOW tables and the txlog rows after them
(:mod:`replication.sow.table`), so it always equals the fold of the txlog.

A batch is handled in two steps, mirroring the writer's order of effects:

1. :func:`prepare` (before duplicates are dropped): for each candidate row on a
   SOW topic, parse the body (the body check too), find its key or what a
   sow_delete names, and say why a row cannot be accepted (it then goes to
   ``rejected/``);
2. :func:`fold` (on the rows kept, in ``seq`` order, against the state plus
   the batch's own earlier changes): merge delta_publishes (each delta parsed
   again as it merges), resolve sow_deletes to the keys they remove, and
   return the batch's :class:`SowChanges`, which the writer applies to the
   state only after the txlog commit.

The record of one key: its body, ~0.3 KB of driver memory for a
200-byte body (1M records: ~300 MB).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from itertools import islice
from operator import itemgetter
from typing import Any, NamedTuple, cast, final

import numpy as np
import orjson
import pyarrow as pa

from replication.errors import SowRefusal
from replication.expressions import Filter, FilterSyntaxError
from replication.expressions.columnar import matching
from replication.messages import FIELD_TYPES
from replication.sow.keys import (
    SowTopics,
    join_keys,
    key_of,
    missing_key_fields,
    parse_body,
    split_keys,
    value_text,
)
from replication.sow.merge import mergeable, merged_body

#: Records put into the state per call when a batch is applied.
APPLY_STEP = 16_384
#: A record: its body as stored (what merges and filter deletes read; the SOW table has the rest).
Record = bytes


class SowState:
    """Current records of every SOW topic of one instance (see the module docstring)."""

    def __init__(self, topics: SowTopics) -> None:
        self.topics = topics
        self.records: list[dict[str, dict[str, Record]]] = [{} for _ in topics.topics]
        """Per SOW topic position: topic -> key -> record. Read it after :meth:`settle` while batches are
        applied in the background."""
        self.applied_seq = 0
        """Every txlog row through this seq is folded in."""
        self._applying: threading.Thread | None = None
        self._apply_error: BaseException | None = None
        self._lock = threading.Lock()

    def items(self, index: int, topic: str) -> Iterator[tuple[str, Record]]:
        self.settle()
        return iter(self.records[index].get(topic, {}).items())

    def apply(self, changes: SowChanges) -> None:
        """Fold a committed batch's changes in (after its txlog commit)."""
        self.settle()
        self._apply(changes, changes.through_seq)

    def apply_in_background(self, changes: SowChanges | None, through_seq: int) -> None:
        """:meth:`apply` on a thread of its own, while Spark reads the next batch (~80 ms a 200k-row batch off
        the ingest's path); the next :meth:`settle` waits for it. ``changes`` None: a batch with no SOW row."""
        def run() -> None:
            try:
                self._apply(changes, through_seq)
            except BaseException as exc:  # the state is not what the txlog says: settle() raises it
                self._apply_error = exc

        with self._lock:
            self._join()
            self._applying = threading.Thread(target=run, name="sow-apply", daemon=True)
            self._applying.start()

    def settle(self) -> None:
        """Wait for a batch being applied in the background."""
        with self._lock:
            self._join()

    def _join(self) -> None:
        if self._applying is not None:
            self._applying.join()
            self._applying = None
        if self._apply_error is not None:
            raise RuntimeError("the SOW state could not take a committed batch; restart the instance "
                               "(it rebuilds the state from the SOW tables and the txlog)") from self._apply_error

    def _apply(self, changes: SowChanges | None, through_seq: int) -> None:
        for (index, topic), changed in changes.topics.items() if changes is not None else ():
            # deleted records (None) go in with the rest, to be removed just below
            by_key = cast("dict[str, Record | None]", self.records[index].setdefault(topic, {}))
            pairs = iter(changed.items())
            for _ in range(0, len(changed), APPLY_STEP):  # one C call holds the GIL: the writer waits on none long
                by_key.update(islice(pairs, APPLY_STEP))
            for key in [key for key, record in changed.items() if record is None]:
                del by_key[key]
        self.applied_seq = max(self.applied_seq, through_seq)

    def count(self, index: int | None = None) -> int:
        self.settle()
        tables = self.records if index is None else [self.records[index]]
        return sum(len(by_key) for table in tables for by_key in list(table.values()))


@dataclass
class SowChanges:
    """What one batch does to the SOW: each record it wrote (``None``: deleted), last write wins."""

    through_seq: int
    topics: dict[tuple[int, str], dict[str, Record | None]] = field(default_factory=dict)
    """(SOW topic position, topic) -> key -> its record after the batch (None: deleted)."""


class Prepared(NamedTuple):
    """A candidate row on a SOW topic, checked: its key, its parsed body, or what its sow_delete names."""

    index: int  # type: ignore[assignment]  # shadows tuple.index, which nothing calls on a Prepared
    """Position of its ``<SOW><Topic>``."""
    key: str | None = None
    """publish / delta_publish: the record's key."""
    delete_keys: tuple[str, ...] | None = None
    """sow_delete by keys or by data: the keys it names."""
    delete_filter: Filter | None = None
    """sow_delete by filter."""


def prepare(topics: SowTopics, rows: dict[str, list],
            indexes: list[int]) -> tuple[list[Prepared | None], dict[int, str]]:
    """Check rows (``rows``: a dict of column lists); ``indexes[i]`` is row i's SOW topic position (-1: none).
    Each row on a SOW topic gets a :class:`Prepared`, each that cannot be accepted a reason (by position).

    ``rows`` needs ``topic``, ``message_type``, ``command``, ``data``, ``sow_key``
    (the ``amps-sow-key`` header, or the upstream's key for replicated rows),
    ``sow_keys`` and ``filter``. A sow_delete on a topic that is not a SOW
    topic is refused; a delta_publish there is a publish.
    """
    prepared: list[Prepared | None] = [None] * len(indexes)
    reasons: dict[int, str] = {}
    topic_col, type_col, command_col, data_col = rows["topic"], rows["message_type"], rows["command"], rows["data"]
    # The common case on its own short path: a publish or delta_publish on a JSON topic keyed by one top-level
    # field. Anything else, and any row it cannot take, goes the general way (which also words the reason).
    simple = [s.key_paths[0][0] if s.message_type == "json" and len(s.key_paths) == 1 and len(s.key_paths[0]) == 1
              else None for s in topics.topics]
    loads, decode_error, dict_, str_, int_ = orjson.loads, orjson.JSONDecodeError, dict, str, int
    new = tuple.__new__  # a Prepared without its Python-level __new__ (a third of the short path's time)
    for i, (index, command, data) in enumerate(zip(indexes, command_col, data_col)):
        if index < 0:
            topic, message_type = topic_col[i], type_col[i]
            if command == "sow_delete":
                reasons[i] = (f"sow_delete on topic {topic!r} ({message_type}), which is not a SOW topic of this "
                              "instance: add a <SOW><Topic> for it, or send the delete to a SOW topic")
            continue
        name = simple[index]
        if name is not None and command != "sow_delete":
            try:
                doc = loads(data)
            except decode_error:
                doc = None
            if type(doc) is dict_:
                value = doc.get(name)
                kind = type(value)  # the usual keys inline; value_text has every rule
                if kind is str_ and value and "," not in value and "|" not in value and "\\" not in value:
                    key = value
                elif kind is int_:
                    key = str(value)
                else:
                    key = value_text(value)
                if key is not None:  # the parsed body is let go: a merge parses its delta again, when it merges
                    prepared[i] = new(Prepared, (index, key, None, None))
                    continue
        try:
            prepared[i] = _prepare_row(topics.topics[index], index, topic_col[i], command, rows, i)
        except SowRefusal as exc:
            reasons[i] = str(exc)
    return prepared, reasons


def _prepare_row(sow, index: int, topic: str, command: str, rows: dict[str, list], i: int) -> Prepared:
    where = f"SOW topic {topic!r}"
    if command == "sow_delete":
        given_keys, given_filter = rows["sow_keys"][i], rows["filter"][i]
        if given_keys is not None:
            keys = split_keys(given_keys)
            if not keys:
                raise SowRefusal(f"sow_delete on {where}: amps-sow-keys {given_keys!r} names no key; give "
                                 "comma-separated keys as shown in the SOW's sow_key column")
            return Prepared(index, delete_keys=tuple(keys))
        if given_filter is not None:
            try:
                return Prepared(index, delete_filter=Filter(given_filter))
            except FilterSyntaxError as exc:
                raise SowRefusal(f"sow_delete on {where}: amps-filter does not parse: "
                                 f"{str(exc).splitlines()[0]}") from None
        data = rows["data"][i]
        if not data or not sow.keys:
            how = f"a body with the key fields {', '.join(sow.keys)}" if sow.keys else "(this topic has no <Key>)"
            raise SowRefusal(f"sow_delete on {where} names nothing to delete: give amps-sow-keys, amps-filter "
                             f"or {how}")
        doc = _parsed(sow.message_type, data, f"sow_delete on {where}")
        key = key_of(sow, doc)
        if key is None:
            raise SowRefusal(f"sow_delete on {where} names nothing to delete: its body has no value for "
                             f"{', '.join(missing_key_fields(sow, doc))}; give the key fields, amps-sow-keys or "
                             "amps-filter")
        return Prepared(index, delete_keys=(key,))
    doc = None
    if sow.message_type in FIELD_TYPES:
        doc = _parsed(sow.message_type, rows["data"][i], f"{command} on {where}")
    if command == "delta_publish":
        problem = (mergeable(sow.message_type, doc) if sow.message_type in FIELD_TYPES else
                   f"delta_publish on {sow.message_type} messages cannot be merged: their bodies have no fields; "
                   "publish the whole message")
        if problem:
            raise SowRefusal(f"{problem} (on {where})")
    if sow.keys:
        key = key_of(sow, doc)
        if key is None:
            raise SowRefusal(f"{command} on {where} has no value for key {', '.join(missing_key_fields(sow, doc))}: "
                             "a SOW record needs its key fields")
    else:
        key = rows["sow_key"][i]
        if not key:
            raise SowRefusal(f"{command} on {where} has no amps-sow-key header: the SOW topic {sow.name!r} has no "
                             "<Key>, so each message names its key in amps-sow-key")
    return Prepared(index, key=key)


def _parsed(message_type: str, data: bytes | None, what: str) -> Any:
    try:
        return parse_body(message_type, data)
    except SowRefusal as exc:
        raise SowRefusal(f"{what}: {exc}") from None


@dataclass
class Folded:
    """:func:`fold`'s answer for the kept rows, in order."""

    sow_keys: list[str | None]
    """Each row's ``sow_key``: the record it wrote, or the keys a sow_delete removed here."""
    bodies: dict[int, bytes | None]
    """Row position -> its body as stored, where that is not the body as published: a delta_publish merged
    into its record, a sow_delete by keys or filter (no body)."""
    changes: SowChanges


def fold(state: SowState, topics: list[str], commands: list[str], datas: list[bytes | None],
         checks: list[Prepared], through_seq: int) -> Folded:
    """Apply the kept rows (columns: topic, command as published, body, :func:`prepare`'s check), in seq
    order, to the state plus the batch's own earlier changes (the state itself is not changed).

    Rows of different (SOW topic, topic) never touch the same record, so each such group is folded on its own
    (a batch is mostly one group: its columns are then used as they are)."""
    state.settle()
    changes = SowChanges(through_seq)
    indexes = list(map(_INDEX, checks))
    groups = set(zip(indexes, topics))
    if len(groups) == 1:
        ((index, topic),) = groups
        sow_keys, bodies = _fold_group(state, changes, index, topic, commands, datas, checks)
        return Folded(sow_keys, bodies, changes)
    sow_keys = [None] * len(checks)
    bodies = {}
    rows_of: dict[tuple[int, str], list[int]] = {}
    for position, group in enumerate(zip(indexes, topics)):
        rows_of.setdefault(group, []).append(position)
    for (index, topic), rows in rows_of.items():
        keys, changed = _fold_group(state, changes, index, topic, [commands[r] for r in rows],
                                    [datas[r] for r in rows], [checks[r] for r in rows])
        for r, key in zip(rows, keys):
            sow_keys[r] = key
        bodies.update((rows[at], body) for at, body in changed.items())
    return Folded(sow_keys, dict(sorted(bodies.items())), changes)


_INDEX = itemgetter(0)  # Prepared.index, read by a C-level getter (map over a batch's checks)
_KEY = itemgetter(1)  # Prepared.key


def _fold_group(state: SowState, changes: SowChanges, index: int, topic: str, commands: list[str],
                datas: list[bytes | None], checks: list[Prepared]) -> tuple[list[str | None], dict[int, bytes | None]]:
    """:func:`fold` of one (SOW topic, topic)'s rows, into ``changes``: each row's ``sow_key`` and the bodies it
    changed (by position in these rows)."""
    pending: dict[str, Any] = changes.topics.setdefault((index, topic), {})  # and _Merge markers, until _merge
    current = state.records[index].get(topic, {})
    message_type = state.topics.topics[index].message_type
    bodies: dict[int, Any] = {}  # likewise
    merges: list[_Merge] = []
    keys = list(map(_KEY, checks))
    sow_keys = keys.copy()  # a publish's or a delta_publish's own key; a sow_delete's set below
    data: bytes | _Merge | None  # a merging delta_publish's: the marker of its merge
    for position, (command, key, data) in enumerate(zip(commands, keys, datas)):
        if command == "publish":  # most rows: a dict store
            pending[key] = data or b""  # (None marks a deleted record)
        elif command == "sow_delete":
            check = checks[position]
            if check.delete_filter is not None:
                _merge(merges, message_type, pending, bodies)  # the filter reads the merged records
                gone = _matching_keys(check.delete_filter, current, pending, message_type)
            else:
                gone = [key for key in check.delete_keys or ()
                        if (pending[key] if key in pending else current.get(key)) is not None]
            for key in gone:
                pending[key] = None
            if not data:
                bodies[position] = None  # by keys or by filter: no body
            sow_keys[position] = join_keys(gone) or None
        else:
            if command == "delta_publish":
                record = pending[key] if key in pending else current.get(key)
                if record is not None:
                    # (data not None: prepare refuses a delta_publish without a body)
                    data = bodies[position] = _Merge(position, key, record, data)  # type: ignore[arg-type]
                    merges.append(data)
            pending[key] = data or b""
    _merge(merges, message_type, pending, bodies)
    return sow_keys, bodies


@final  # (so that ``type(record) is not _Merge`` says it is a body)
class _Merge:
    """A delta_publish to merge into ``record`` (a body, or an earlier merge of the batch)."""

    __slots__ = ("position", "key", "record", "delta")

    def __init__(self, position: int, key: str, record: bytes | _Merge, delta: bytes) -> None:
        self.position, self.key, self.record, self.delta = position, key, record, delta


def _merge(merges: list[_Merge], message_type: str, pending: dict[str, Any], bodies: dict[int, Any]) -> None:
    """Do the ``merges`` waiting, in seq order (one may merge into an earlier one), and put their bodies in
    place of the markers in ``pending`` and ``bodies``.

    Why after the fold's loop, each delta parsed again here rather than kept parsed from :func:`prepare`: the
    SOW's cost of a 200k-message batch measured ~9% lower this way than merging in the loop (merges in a row
    run ~1 us faster each, and no batch's worth of parsed deltas is kept alive)."""
    parse = partial(parse_body, message_type)
    for merge in merges:
        record = merge.record
        body = bodies[merge.position] = merged_body(message_type, record if type(record) is not _Merge else
                                                    bodies[record.position], parse(merge.delta))
        if pending[merge.key] is merge:
            pending[merge.key] = body
    merges.clear()


def _matching_keys(flt: Filter, records: dict[str, Record], overlay: dict[str, Record | None],
                   message_type: str) -> list[str]:
    """The keys of the records ``flt`` matches: a topic's ``records`` with the batch's changes so far
    (``overlay``; None: deleted) laid over them, tested column-wise (a record's body was parsed at ingest)."""
    current = {**records, **overlay} if overlay else records
    if overlay and None in overlay.values():
        for key in [key for key, record in overlay.items() if record is None]:
            del current[key]
    if not current:
        return []
    keys = list(current)
    bodies = pa.array(list(current.values()), pa.binary())
    mask = matching(flt, bodies, message_type, valid_json=True)
    return [keys[i] for i in np.flatnonzero(mask).tolist()]
