"""The ingest query's Kafka input: Spark's own Kafka source, its headers taken out in Arrow.

Spark's ``format("kafka")`` reads and decodes Kafka's record batches in the JVM
of its executors, warm about 1.7x as fast as the project's Python source for about
half the CPU (docs/benchmarks.md). Its rows carry each record's raw ``headers``
array. Taking the DESIGN §7 headers out with Spark expressions (a lambda per header
per row) costs more than the faster read saves; so the array travels to the driver
as it is, in the column :data:`HEADERS`, and :func:`with_publish_headers` takes
the headers out column by column in Arrow once the batch is collected.

Small batches are still read in the driver by the project's reader
(:class:`replication.ingest.inputs.DriverRead`): Spark's Kafka source keeps its
offsets in the checkpoint as ``{"topic": {"partition": next offset}}``, the form
that reader plans from.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replication.connectors.kafka.ranges import PUBLISH_HEADERS
from replication.connectors.kafka.records import utf8
from replication.ingest.classify import CANDIDATE_SCHEMA

#: The column of a collected ingest batch that holds each Kafka record's headers, until they are taken out.
HEADERS = "kafka_headers"


def topics_pattern(topics: tuple[str, ...]) -> str:
    """A Java regex that matches exactly these topic names: ``subscribePattern`` also finds a topic created
    after the query started. Each name is quoted (``\\Q...\\E``): Kafka's topic names hold no backslash."""
    return "^(?:" + "|".join(r"\Q" + topic + r"\E" for topic in topics) + ")$"


def header_columns(spec: dict[str, tuple]) -> dict[str, str]:
    """Which candidate column each publish header fills, from the mapping of
    :func:`replication.ingest.inputs.kafka_candidate_columns`: header key -> candidate column."""
    key_of = {column: key for key, column in PUBLISH_HEADERS}
    out = {}
    for name, how in spec.items():
        if how[0] in ("col", "first") and how[1] in key_of:
            out[key_of[how[1]]] = name
    return out


def without_headers(spec: dict[str, tuple]) -> dict[str, tuple]:
    """The mapping as Spark computes it before the headers are taken out: a header's column holds its
    default (``first``) or null; the headers come later, in :func:`with_publish_headers`."""
    key_of = {column for _key, column in PUBLISH_HEADERS}
    out = {}
    for name, how in spec.items():
        if how[0] == "col" and how[1] in key_of:
            out[name] = ("lit", None)
        elif how[0] == "first" and how[1] in key_of:
            out[name] = how[2]
        else:
            out[name] = how
    return out


def with_publish_headers(batch: pa.Table, columns: dict[str, str]) -> pa.Table:
    """``batch`` with the publish headers of :data:`HEADERS` in their candidate ``columns`` (header key ->
    column), over the defaults Spark put there, and without :data:`HEADERS`.

    When a key repeats, the last value wins (Kafka's ``lastHeader``); bytes that are not UTF-8 are decoded
    with U+FFFD replacements: as the project's own reader does. Rows with no headers (null: the inbox's)
    keep their columns as they are.
    """
    if HEADERS not in batch.column_names:
        return batch
    headers = batch[HEADERS].combine_chunks()
    batch = batch.drop_columns([HEADERS])
    n = len(headers)
    if n == 0:
        return batch
    entries = pc.list_flatten(headers)
    if len(entries) == 0:
        return batch
    parents = pc.list_parent_indices(headers).to_numpy()
    keys, values = entries.flatten()
    wanted = list(columns)
    # one pass over every header key: the publish header each is (-1: another header)
    slots = pc.fill_null(pc.index_in(keys, value_set=pa.array(wanted, pa.string())), -1).to_numpy()
    for slot, key in enumerate(wanted):
        where = np.flatnonzero(slots == slot)
        if where.size == 0:
            continue
        rows = parents[where]
        last = np.empty(rows.size, dtype=bool)  # a row's entries are in order: its last one wins
        last[:-1] = rows[1:] != rows[:-1]
        last[-1] = True
        where, rows = where[last], rows[last]
        index = np.full(n, -1, dtype=np.int64)
        index[rows] = where
        found = utf8(pc.take(values, pa.array(index, mask=index < 0)))
        column = columns[key]
        at = batch.schema.get_field_index(column)
        field = CANDIDATE_SCHEMA.field(column)
        batch = batch.set_column(at, field, pc.coalesce(found.cast(field.type), batch[column]))
    return batch
