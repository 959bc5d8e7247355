"""The four routing rules of DESIGN §5, written once and compiled to Python and to Spark.

AMPS ("Understanding Replication Message Routing") replicates a message from
this instance to a destination only when all of these hold:

1. ``txlog``: its topic and message type are recorded in this instance's txlog;
2. ``topic``/``filter``: a ``<Topic>`` of the destination matches the topic
   (regex) and message type, and that Topic's ``<Filter>``, if any, matches;
3. ``passthrough``: it was published here (``received_from`` is NULL), or the
   group it was received from matches the destination's ``<PassThrough>``
   (no PassThrough: replicated messages are not forwarded);
4. ``loop``: the destination instance is not already on the message's ``path``.

:func:`rules` turns a config and a destination into a tuple of :class:`Rule`,
each holding one condition tree (:class:`Cond`). The same trees are
interpreted row by row in Python (:func:`decide`, used by ``replication trace``;
:func:`route_mask`, used by the replicator, once per distinct header
combination) and compiled to one native Spark column (:func:`spark_condition`,
used by ``replication verify`` on Spark), so the engine and the offline tools
cannot drift apart.

``path`` convention: the instances that have stored the message, in order,
origin first and *including the instance holding the row* (see
:func:`published` and :func:`forwarded`; Arrow: :func:`received_paths`).

Topic and group regexes follow AMPS: a name with no regex metacharacter is a
literal that matches only itself; otherwise it is a regex searched anywhere in
the value (PCRE semantics, so anchor with ``^...$`` to match the whole value).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from replication import expressions

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    from pyspark.sql import Column

    from replication.config.model import Destination, DestinationTopic, InstanceConfig

__all__ = [
    "Decision",
    "Message",
    "Rule",
    "RULES",
    "decide",
    "forwarded",
    "is_literal",
    "published",
    "received_paths",
    "regex_matches",
    "rules",
    "spark_condition",
]

#: Rule names in evaluation order (``topic`` and ``filter`` both come from rule 2).
RULES: tuple[str, ...] = ("txlog", "topic", "filter", "passthrough", "loop")

_META = re.compile(r"[.^$*+?()\[\]{}|\\]")


def is_literal(pattern: str) -> bool:
    """True when ``pattern`` has no regex metacharacter (AMPS then matches it exactly)."""
    return _META.search(pattern) is None


@lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def regex_matches(pattern: str, value: str | None) -> bool:
    """AMPS topic/group matching: literal names match exactly, regexes are searched."""
    if value is None:
        return False
    if is_literal(pattern):
        return pattern == value
    return _compiled(pattern).search(value) is not None


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class Message:
    """The routing-relevant columns of one txlog row."""

    topic: str
    message_type: str = "json"
    data: Any = None
    """Message body: dict, JSON text or bytes (only read by content filters)."""
    received_from: str | None = None
    """Upstream instance it came from; None when published at this instance."""
    received_from_group: str | None = None
    path: tuple[str, ...] = ()
    origin: str | None = None


def published(topic: str, at: str, *, message_type: str = "json", data: Any = None) -> Message:
    """A message as a publisher's copy is stored at instance ``at``."""
    return Message(topic, message_type, data, None, None, (at,), at)


def forwarded(msg: Message, sender: InstanceConfig, receiver: str) -> Message:
    """The row ``receiver`` stores when ``sender`` replicates ``msg`` to it."""
    return replace(
        msg,
        received_from=sender.name,
        received_from_group=sender.group or sender.name,
        path=tuple(msg.path) + (receiver,),
        origin=msg.origin or (msg.path[0] if msg.path else sender.name),
    )


def received_paths(paths: pa.Array | pa.ChunkedArray, instance: str) -> pa.ListArray:
    """Arrow: the ``path`` an instance stores for rows it received (each upstream path + itself; null: [])."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    lists = paths.combine_chunks() if isinstance(paths, pa.ChunkedArray) else paths
    lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    values = pc.list_flatten(lists).cast(pa.string())
    offsets: np.ndarray = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths + 1, out=offsets[1:])
    last: np.ndarray = offsets[1:] - 1  # where each row's new item goes
    take: np.ndarray = np.empty(int(offsets[-1]), dtype=np.int64)
    is_new: np.ndarray = np.zeros(len(take), dtype=bool)
    is_new[last] = True
    take[~is_new] = np.arange(len(values))
    take[is_new] = len(values)  # the instance, after the upstream's values
    pool = pa.concat_arrays([values, pa.array([instance], pa.string())])
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pool.take(pa.array(take)))


# --------------------------------------------------------------------------- conditions


@dataclass(frozen=True)
class Matches:
    """``column`` (first non-NULL of ``columns``) matches an AMPS topic/group regex."""

    columns: tuple[str, ...]
    pattern: str


@dataclass(frozen=True)
class Equals:
    column: str
    value: str


@dataclass(frozen=True)
class IsNull:
    column: str


@dataclass(frozen=True)
class Contains:
    """Array ``column`` contains ``value``."""

    column: str
    value: str


@dataclass(frozen=True)
class ContentFilter:
    expr: expressions.Expr
    text: str
    message_type: str = "json"
    """The bodies' type: the filter reads JSON, FIX or NVFIX fields."""


@dataclass(frozen=True)
class AllOf:
    items: tuple[Cond, ...]


@dataclass(frozen=True)
class AnyOf:
    items: tuple[Cond, ...]


@dataclass(frozen=True)
class Negate:
    item: Cond


Cond = Matches | Equals | IsNull | Contains | ContentFilter | AllOf | AnyOf | Negate


@dataclass(frozen=True)
class Rule:
    """One routing rule for one destination: a name and the condition a row must meet."""

    name: str
    """One of :data:`RULES`."""
    condition: Cond
    description: str


def _topic_cond(name: str, message_type: str) -> AllOf:
    return AllOf((Matches(("topic",), name), Equals("message_type", message_type)))


def _filter_of(topic: DestinationTopic) -> ContentFilter | None:
    # parsed, and checked against the topic's message type, when the config was loaded
    if topic.filter is None:
        return None
    return ContentFilter(topic.filter.expr, topic.filter.text, topic.message_type)


def rules(cfg: InstanceConfig, dest: Destination, *, target: str | None = None) -> tuple[Rule, ...]:
    """The rules a row must meet to go from ``cfg`` to ``dest``.

    Args:
        cfg: the sending instance.
        dest: one of ``cfg.destinations``.
        target: name of the instance actually reached through ``dest`` (its
            failover list may lead to several); default ``dest.name``.

    """
    target = target or dest.name
    txlog = AnyOf(tuple(_topic_cond(t.name, t.message_type) for t in cfg.txlog_topics))
    topic = AnyOf(tuple(_topic_cond(t.name, t.message_type) for t in dest.topics))
    with_filters = []
    for t in dest.topics:
        flt = _filter_of(t)
        cond = _topic_cond(t.name, t.message_type)
        with_filters.append(AllOf(cond.items + (flt,)) if flt else cond)
    if dest.pass_through is None:
        passthrough: Cond = IsNull("received_from")
        pt_text = "published here (no PassThrough: replicated messages are not forwarded)"
    else:
        passthrough = AnyOf(
            (IsNull("received_from"), Matches(("received_from_group", "received_from"), dest.pass_through))
        )
        pt_text = f"published here, or received from a group matching PassThrough {dest.pass_through!r}"
    return (
        Rule("txlog", txlog, f"topic and message type recorded in {cfg.name}'s transaction log"),
        Rule("topic", topic, f"a <Topic> of destination {dest.name} matches topic and message type"),
        Rule("filter", AnyOf(tuple(with_filters)), "and that <Topic>'s <Filter>, if any, matches the message"),
        Rule("passthrough", passthrough, pt_text),
        Rule("loop", Negate(Contains("path", target)), f"{target} is not already on the message's path"),
    )


# --------------------------------------------------------------------------- Python form


@dataclass(frozen=True)
class Decision:
    """Whether a message goes to a destination, and if not, the first rule that stops it."""

    sent: bool
    rule: str | None
    """None when sent; else one of :data:`RULES`."""
    reason: str

    def __bool__(self) -> bool:
        return self.sent


def _py(cond: Cond, msg: Message) -> bool:
    if isinstance(cond, Matches):
        value = next((getattr(msg, c) for c in cond.columns if getattr(msg, c) is not None), None)
        return regex_matches(cond.pattern, value)
    if isinstance(cond, Equals):
        return getattr(msg, cond.column) == cond.value
    if isinstance(cond, IsNull):
        return getattr(msg, cond.column) is None
    if isinstance(cond, Contains):
        return cond.value in (getattr(msg, cond.column) or ())
    if isinstance(cond, ContentFilter):
        return expressions.evaluate(cond.expr, msg.data, cond.message_type)
    if isinstance(cond, AllOf):
        return all(_py(c, msg) for c in cond.items)
    if isinstance(cond, AnyOf):
        return any(_py(c, msg) for c in cond.items)
    if isinstance(cond, Negate):
        return not _py(cond.item, msg)
    raise TypeError(f"not a routing condition: {cond!r}")


def decide(cfg: InstanceConfig, dest: Destination, msg: Message, *, target: str | None = None) -> Decision:
    """Apply the four rules to one message, in order; say which one stops it and why.

    Example:
        >>> d = decide(cfg, cfg.destination("amps-2"), published("/orders/1", "amps-1"))  # doctest: +SKIP
        >>> d.sent, d.rule, d.reason  # doctest: +SKIP
        (True, None, 'sent to amps-2')
    """
    target = target or dest.name
    for rule in rules(cfg, dest, target=target):
        if not _py(rule.condition, msg):
            return Decision(False, rule.name, _why(rule.name, cfg, dest, msg, target))
    return Decision(True, None, f"sent to {target} (destination {dest.name}, {dest.sync_type})")


def route_mask(cfg: InstanceConfig, dest: Destination, rows: pa.Table, *,
               target: str | None = None) -> np.ndarray:
    """:func:`decide` for every row of a txlog table: True where the row goes to ``dest``.

    The replicator's evaluation of each batch. ``rows`` needs the columns of :func:`spark_condition_columns`.
    Without a content filter the answer depends on a row's headers only, so
    it is computed once per distinct combination of them (a backlog of 200k
    rows holds a handful) and spread back to the rows with numpy.
    """
    import numpy as np

    conds = [r.condition for r in rules(cfg, dest, target=target) if r.name != "topic"]
    names = [f for f in ("topic", "message_type", "received_from", "received_from_group", "path", "origin")
             if f in rows.column_names]
    if any(_has_filter(c) for c in conds):
        return _route_each(conds, names, rows, bodies=rows["data"].to_pylist())
    if rows.num_rows == 0:
        return np.zeros(0, dtype=bool)
    distinct = _distinct_combinations(rows, names)
    if distinct is None:
        return _route_each(conds, names, rows, bodies=None)
    firsts, which = distinct
    return _route_each(conds, names, rows.select(names).take(firsts), bodies=None)[which]


def _route_each(conds: list[Cond], names: list[str], rows: pa.Table, *, bodies: list | None) -> np.ndarray:
    """The conditions evaluated row by row (rows equal in ``names`` share one answer unless ``bodies``)."""
    import numpy as np

    columns = [rows[name].to_pylist() for name in names]
    out = np.empty(rows.num_rows, dtype=bool)
    seen: dict[tuple, bool] = {}
    for i, values in enumerate(zip(*columns, strict=True)):
        key = tuple(tuple(v) if isinstance(v, list) else v for v in values)
        if bodies is None and key in seen:
            out[i] = seen[key]
            continue
        fields: dict[str, Any] = dict(zip(names, key, strict=True))
        fields["path"] = fields.get("path") or ()
        msg = Message(**fields, data=bodies[i] if bodies is not None else None)
        out[i] = all(_py(c, msg) for c in conds)
        if bodies is None:
            seen[key] = bool(out[i])
    return out


def _distinct_combinations(rows: pa.Table, names: list[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """(the first row of each distinct combination of ``names``, each row's combination), in Arrow and numpy;
    None when a list holds a null item or one with a NUL (the joined form below would not tell two lists apart),
    or a column is of a type that is not a string or a list of strings (not the txlog's: left to the loop)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    def string(t: pa.DataType) -> bool:
        return pa.types.is_string(t) or pa.types.is_large_string(t)

    combination, bound = np.zeros(rows.num_rows, dtype=np.int64), 1  # (every code is below bound)
    for name in names:
        column = rows[name].combine_chunks()
        parts = [column]
        if (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)) and string(column.type.value_type):
            items = pc.list_flatten(column)
            if items.null_count or len(items) and pc.any(pc.match_substring(items.cast(pa.string()), "\x00")).as_py():
                return None
            # (a list is its items joined with NUL, which names never hold, and its length: null and [] differ)
            parts = [pc.binary_join(column, "\x00"), pc.list_value_length(column)]
        elif not string(column.type):
            return None
        for part in parts:
            encoded = pc.dictionary_encode(part)
            codes = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64) + 1
            if bound * (len(encoded.dictionary) + 1) >= 1 << 62:  # renumbered densely first: no overflow
                combination = np.unique(combination, return_inverse=True)[1]
                bound = rows.num_rows
            combination = combination * (len(encoded.dictionary) + 1) + codes
            bound *= len(encoded.dictionary) + 1
    _values, firsts, which = np.unique(combination, return_index=True, return_inverse=True)
    return firsts, which


def _why(rule: str, cfg: InstanceConfig, dest: Destination, msg: Message, target: str) -> str:
    what = f"topic {msg.topic!r} ({msg.message_type})"
    if rule == "txlog":
        return f"{what} is not recorded in {cfg.name}'s transaction log"
    if rule == "topic":
        names = ", ".join(f"{t.name!r} ({t.message_type})" for t in dest.topics) or "none"
        return f"no <Topic> of destination {dest.name} matches {what}; its topics: {names}"
    if rule == "filter":
        filters = [t.filter.text for t in dest.topics if t.filter and _py(_topic_cond(t.name, t.message_type), msg)]
        return f"filter false: the message does not match {' / '.join(repr(f) for f in filters)}"
    if rule == "passthrough":
        group = msg.received_from_group or msg.received_from
        if dest.pass_through is None:
            return (
                f"{cfg.name} received it from {msg.received_from} (group {group}) and destination "
                f"{dest.name} has no PassThrough, so replicated messages are not forwarded"
            )
        return (
            f"{cfg.name} received it from {msg.received_from} (group {group}), which does not match "
            f"PassThrough {dest.pass_through!r} of destination {dest.name}"
        )
    if rule == "loop":
        return f"loop: {target} is already on the message's path {' -> '.join(msg.path)}"
    return rule


# --------------------------------------------------------------------------- Spark form


def spark_condition(
    cfg: InstanceConfig,
    dest: Destination,
    *,
    target: str | None = None,
    data_col: str = "data",
    variant: Column | None = None,
) -> Column:
    """One native Spark boolean column: the rows of ``cfg``'s txlog that go to ``dest``.

    Reads the txlog columns ``topic``, ``message_type``, ``data``,
    ``received_from``, ``received_from_group`` and ``path``. The content filter
    (if any) parses ``data`` as JSON once per row, or uses ``variant`` (see
    :func:`replication.expressions.parse_json_column`) when given.

    Example:
        >>> txlog_df.where(spark_condition(cfg, cfg.destination("amps-2")))  # doctest: +SKIP
    """
    from pyspark.sql import functions as F

    all_rules = rules(cfg, dest, target=target)
    # "topic" is implied by "filter" (each filter term includes its topic match).
    conds = [r.condition for r in all_rules if r.name != "topic"]
    needs_json = any(_has_filter(c, "json") for c in conds)
    v = variant if variant is not None else (expressions.parse_json_column(data_col) if needs_json else None)
    out = _spark(conds[0], v, data_col)
    for c in conds[1:]:
        out = out & _spark(c, v, data_col)
    return F.coalesce(out, F.lit(False))


def spark_condition_columns(cfg: InstanceConfig, dest: Destination, *, target: str | None = None,
                            data_col: str = "data") -> tuple[str, ...]:
    """The txlog columns :func:`spark_condition` reads for ``dest`` (``data`` only with a content filter)."""
    found: list[str] = []

    def walk(cond: Cond) -> None:
        if isinstance(cond, Matches):
            found.extend(cond.columns)
        elif isinstance(cond, (Equals, IsNull, Contains)):
            found.append(cond.column)
        elif isinstance(cond, ContentFilter):
            found.append(data_col)
        elif isinstance(cond, (AllOf, AnyOf)):
            for item in cond.items:
                walk(item)
        elif isinstance(cond, Negate):
            walk(cond.item)

    for rule in rules(cfg, dest, target=target):
        if rule.name != "topic":  # implied by "filter", as in spark_condition
            walk(rule.condition)
    return tuple(dict.fromkeys(found))


def _has_filter(cond: Cond, message_type: str | None = None) -> bool:
    """Does ``cond`` hold a content filter (on bodies of ``message_type``, when given)?"""
    if isinstance(cond, ContentFilter):
        return message_type is None or cond.message_type == message_type
    if isinstance(cond, (AllOf, AnyOf)):
        return any(_has_filter(c, message_type) for c in cond.items)
    if isinstance(cond, Negate):
        return _has_filter(cond.item, message_type)
    return False


def _spark(cond: Cond, v: Column | None, data_col: str = "data") -> Column:
    from pyspark.sql import functions as F

    if isinstance(cond, Matches):
        col = F.coalesce(*[F.col(c) for c in cond.columns]) if len(cond.columns) > 1 else F.col(cond.columns[0])
        if is_literal(cond.pattern):
            return F.coalesce(col == F.lit(cond.pattern), F.lit(False))
        return F.coalesce(col.rlike(cond.pattern), F.lit(False))
    if isinstance(cond, Equals):
        return F.coalesce(F.col(cond.column) == F.lit(cond.value), F.lit(False))
    if isinstance(cond, IsNull):
        return F.col(cond.column).isNull()
    if isinstance(cond, Contains):
        return F.coalesce(F.array_contains(F.col(cond.column), F.lit(cond.value)), F.lit(False))
    if isinstance(cond, ContentFilter):
        return expressions.to_spark_column(cond.expr, data_col, variant=v, message_type=cond.message_type)
    if isinstance(cond, (AllOf, AnyOf)):
        if not cond.items:
            return F.lit(isinstance(cond, AllOf))
        parts = [_spark(c, v, data_col) for c in cond.items]
        out = parts[0]
        for p in parts[1:]:
            out = (out & p) if isinstance(cond, AllOf) else (out | p)
        return out
    if isinstance(cond, Negate):
        return ~_spark(cond.item, v, data_col)
    raise TypeError(f"not a routing condition: {cond!r}")
