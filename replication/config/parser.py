"""Parse an instance's AMPS-style XML config (DESIGN §4) into :mod:`replication.config.model` dataclasses.

Parsing is secure (no DTD, no entities, no network, no huge trees) and strict:
an unknown, missing, repeated or malformed element is a :class:`ConfigError`
whose message reads ``<file>:<line>: <element path>: <problem>. Fix: <fix>``.
``${VAR}`` and ``${VAR:-default}`` in text values are replaced from the
environment after parsing, so a value can never inject XML and line numbers stay
those of the file.

Storage locations (``<Storage>``, the ``<InetAddr>`` of replication transports,
destinations and bootstrap) may be ``file:///abs/path``, an absolute path or a
relative path; they come back as normalised absolute paths. A relative path is
resolved against the directory of the config file (not the working directory),
so a config means the same wherever the instance is started from. Remote URIs
(``s3://``, ``abfss://``...) are refused as not supported yet: an instance's
control files (heartbeat, acks, link state) need a local or mounted filesystem,
and a location the engine cannot use must stop the start, not a link later.

Example::

    from replication.config.parser import parse_file
    cfg = parse_file("conf/amps-1.xml")
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from replication.config.model import (
    DEFAULT_BATCH_ROWS,
    DEFAULT_COMPACTION_INTERVAL_S,
    FILTERABLE_TYPES,
    MANDATORY_CHECKS,
    MESSAGE_TYPES,
    SYNC_TYPES,
    VALIDATION_CHECKS,
    Action,
    ActionStep,
    Bootstrap,
    Destination,
    DestinationTopic,
    InstanceConfig,
    KafkaTransport,
    QueueTopic,
    ReplicationTransport,
    SowTopic,
    TopicSpec,
)
from replication.config.xml_reader import (
    MANY,
    OPT,
    Card,
    Ctx,
    Kids,
    Node,
    config_error,
    one,
    read_root,
    some,
    suggest,
)
from replication.errors import ConfigError
from replication.expressions import Filter, FilterSyntaxError

__all__ = ["COMPRESSIONS", "DATA_TYPES", "parse_file", "parse_interval", "parse_location", "parse_string"]

TRANSPORT_TYPES: tuple[str, ...] = ("kafka", "amps-replication")
COMPRESSIONS: tuple[str, ...] = ("zstd", "snappy", "gzip", "lz4", "none")
DATA_TYPES: tuple[str, ...] = ("sow", "txlog")
QUEUE_KINDS: tuple[str, ...] = ("Queue", "GroupLocalQueue", "DistributedQueue")

# Instance names end up in file names (_control/acks/<name>.json) and in the Kafka
# topic "<name>.acks", so they must be legal Kafka topic names.
_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}\Z")
_KAFKA_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}\Z")
_URI = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
# AMPS configs address instances by host:port or a bare port; ours by storage root.
_NETWORK_ADDR = re.compile(r"(\d+|[\w.-]+:\d+)\Z")
# Recognised, to say "not supported yet" rather than "unknown scheme".
_REMOTE_SCHEMES = frozenset(
    {"s3", "s3a", "gs", "gcs", "az", "azure", "abfs", "abfss", "adl", "hdfs", "lakefs", "memory"}
)

# ---------------------------------------------------------------------------
# Intervals


_UNITS: dict[str, float] = {
    "ns": 1e-9,
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
}
_INTERVAL = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*\Z")


def parse_interval(text: str) -> float:
    """Return an AMPS interval such as ``15s``, ``500ms``, ``5m``, ``1h``, ``2d`` in seconds.

    A bare number means seconds. Raises :class:`ValueError` naming the value and the units.

    >>> parse_interval("500ms"), parse_interval("5m"), parse_interval("30")
    (0.5, 300.0, 30.0)
    """
    m = _INTERVAL.match(text)
    if not m:
        raise ValueError(
            f"'{text}' is not an interval: write a number and a unit, e.g. 500ms, 15s, 5m, 1h, 2d"
        )
    unit = m.group(2) or "s"
    if unit not in _UNITS:
        hint = f" (did you mean '{unit.lower()}'?)" if unit.lower() in _UNITS else ""
        raise ValueError(
            f"unknown unit '{unit}' in interval '{text}'{hint}: units are {', '.join(_UNITS)}"
        )
    return float(m.group(1)) * _UNITS[unit]


# ---------------------------------------------------------------------------
# Entry points


def parse_file(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None) -> InstanceConfig:
    """Parse and check the config file at ``path``; ``env`` defaults to ``os.environ``.

    Raises :class:`ConfigError` (with ``.file`` and ``.line``) on any problem.
    """
    display = os.fspath(path)
    try:
        data = Path(display).read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            f"{display}: config file not found. Fix: check the path "
            f"(a relative path is taken from the working directory {os.getcwd()})",
            file=display,
        ) from None
    except IsADirectoryError:
        raise ConfigError(
            f"{display}: is a directory, not a config file. Fix: give the path of an .xml file",
            file=display,
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"{display}: cannot read config file: {exc.strerror or exc}. "
            "Fix: check that the file exists and is readable by this user",
            file=display,
        ) from None
    base_dir = os.path.dirname(os.path.abspath(display))
    return parse_string(data, filename=display, base_dir=base_dir, env=env)


def parse_string(
    text: str | bytes,
    *,
    filename: str = "<string>",
    base_dir: str | None = None,
    env: Mapping[str, str] | None = None,
) -> InstanceConfig:
    """Parse a config held in memory; ``base_dir`` resolves relative paths (default: cwd)."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    ctx = Ctx(filename, base_dir or os.getcwd(), os.environ if env is None else env)
    root = read_root(data, ctx)
    return _instance(root)


# ---------------------------------------------------------------------------
# Value checks


def _enum(node: Node, choices: tuple[str, ...], *, item: str | None = None) -> str:
    """The element's value (or one ``item`` of its comma list), which must be one of ``choices``."""
    value = node.text() if item is None else item
    if value in choices:
        return value
    guess = suggest(value, choices)
    valid = ", ".join(choices)
    what = f"'{value}' is not a valid {node.tag}; valid values are: {valid}"
    if guess:
        fix = f"write <{node.tag}>{guess}</{node.tag}>" if item is None else f"replace '{value}' with '{guess}'"
        node.fail(f"{what}; did you mean '{guess}'?", fix)
    node.fail(what, f"write one of {valid}, e.g. <{node.tag}>{choices[0]}</{node.tag}>")


def _message_type(node: Node) -> str:
    return _enum(node, MESSAGE_TYPES)


def _regex(node: Node) -> str:
    value = node.text()
    try:
        re.compile(value)
    except re.error as exc:
        node.fail(
            f"'{value}' is not a valid regular expression: {exc}",
            "correct the regex (Python re syntax); escape literal ( ) [ ] . * + ? with a backslash",
        )
    return value


def _name(node: Node, what: str) -> str:
    value = node.text()
    if not _NAME.match(value) or value in (".", ".."):
        node.fail(
            f"{what} '{value}' is not a valid name",
            "use only letters, digits, '.', '_' and '-' (the name is used in file names "
            "and in the Kafka topic '<name>.acks')",
        )
    return value


def _positive_int(node: Node) -> int:
    value = node.text()
    if not re.fullmatch(r"\d+", value) or int(value) <= 0:
        node.fail(
            f"'{value}' is not a positive integer",
            f"write a whole number greater than 0, e.g. <{node.tag}>100000</{node.tag}>",
        )
    return int(value)


def _interval(node: Node, *, allow_zero: bool = False) -> float:
    value = node.text()
    try:
        seconds = parse_interval(value)
    except ValueError as exc:
        node.fail(str(exc), f"write an interval such as <{node.tag}>15s</{node.tag}> (units: {', '.join(_UNITS)})")
    if seconds <= 0 and not allow_zero:
        node.fail(f"interval '{value}' must be greater than 0", f"write e.g. <{node.tag}>15s</{node.tag}>")
    return seconds


def _comma_list(node: Node) -> list[str]:
    value = node.text()
    items = [item.strip() for item in value.split(",")]
    if any(not item for item in items):
        node.fail(f"'{value}' has an empty item", "separate items with single commas, e.g. sow,txlog")
    return items


def _location(node: Node) -> str:
    """A storage root: file URI, absolute or config-relative path (remote URIs: not supported yet)."""
    value = node.text()
    try:
        return parse_location(value, base_dir=node.ctx.base_dir)
    except _BadLocation as exc:
        node.fail(exc.what, exc.fix)


class _BadLocation(ConfigError):
    def __init__(self, what: str, fix: str) -> None:
        super().__init__(f"{what}. Fix: {fix}")
        self.what, self.fix = what, fix


def parse_location(value: str, *, base_dir: str) -> str:
    """A storage location as configs take it (``file:///abs/path`` or a path relative to ``base_dir``),
    normalised; a :class:`ConfigError` naming the problem and the fix otherwise (remote URIs: not
    supported yet)."""
    scheme_match = _URI.match(value)
    if scheme_match:
        scheme = scheme_match.group(1).lower()
        if scheme == "file":
            parts = urlsplit(value)
            if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
                raise _BadLocation(f"'{value}' is not a local file URI",
                                   "write file:///absolute/path (three slashes, no host, no ? or #)")
            return os.path.normpath(unquote(parts.path))
        if scheme in _REMOTE_SCHEMES:
            raise _BadLocation(
                f"'{value}': {scheme}:// locations are not supported yet (an instance's control files, "
                "its heartbeat, acknowledgements and link state, need a local or mounted filesystem)",
                "use file:///absolute/path, an absolute path, or a path relative to this config file "
                "(a mounted bucket works as a local path)",
            )
        guess = suggest(scheme, tuple(sorted(_REMOTE_SCHEMES | {"file"})))
        hint = f"; did you mean '{guess}://'?" if guess else ""
        raise _BadLocation(
            f"'{value}' uses the unsupported scheme '{scheme}://'{hint}",
            "use file:///absolute/path, an absolute path, or a path relative to this config file",
        )
    if _NETWORK_ADDR.match(value):
        raise _BadLocation(f"'{value}' looks like an AMPS network address (host:port); instances are "
                           "addressed here by their storage root",
                           "write the instance's <Storage> location, e.g. file:///var/lib/replication/amps-2")
    path = value if os.path.isabs(value) else os.path.join(base_dir, value)
    return os.path.normpath(path)


def _kafka_server(node: Node) -> list[str]:
    servers = [s.strip() for s in node.text().split(",")]
    for server in servers:
        host, _, port = server.rpartition(":") if ":" in server else (server, "", "")
        ok = bool(host) and " " not in server and "://" not in server
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            ok = False
        if not ok:
            node.fail(
                f"'{server}' is not a Kafka bootstrap server",
                "write host:port, e.g. <InetAddr>localhost:9092</InetAddr> (one <InetAddr> per server)",
            )
    return servers


def _filter(node: Node, message_type: str) -> Filter:
    """The ``<Filter>``, parsed now: a filter that does not parse, or on a message type whose bodies
    have no fields to filter on, stops the start with the file and line."""
    value = node.text()
    if message_type not in FILTERABLE_TYPES:
        node.fail(
            f"a <Filter> on {message_type} messages cannot be applied: content filters read fields of "
            f"{', '.join(FILTERABLE_TYPES)} messages only",
            f"remove the <Filter>, or filter a topic whose <MessageType> is {' or '.join(FILTERABLE_TYPES)}",
        )
    try:
        return Filter(value)
    except FilterSyntaxError as exc:
        first, *caret = str(exc).splitlines() or [""]
        problem = re.sub(r"^invalid filter( at position \d+)?:\s*", "", first)
        error = config_error(
            node.ctx,
            node.line,
            node.path,
            f"invalid filter '{value}' at position {exc.position + 1}: {problem}",
            "correct the AMPS filter expression, e.g. <Filter>/qty &gt; 100 AND /side = 'buy'</Filter>",
        )
        # the expression module's picture of where the fault is
        raise ConfigError("\n".join([str(error), *caret]), file=error.file, line=error.line) from None


# ---------------------------------------------------------------------------
# Sections

_ROOT_SCHEMA = {
    "Name": one("<Name>amps-1</Name>"),
    "Group": OPT,
    "Storage": one("<Storage>file:///var/lib/replication/amps-1</Storage>"),
    "Transports": OPT,
    "TransactionLog": OPT,
    "SOW": OPT,
    "Replication": OPT,
    "Bootstrap": OPT,
    "Actions": OPT,
    "Tuning": OPT,
}
_TUNING_SCHEMA = {"MinimumSyncDestinations": OPT}
_TRANSPORT_COMMON = {
    "Name": one("<Name>json-kafka</Name>"),
    "Type": one("<Type>kafka</Type> (or amps-replication)"),
}
_KAFKA_SCHEMA = {
    **_TRANSPORT_COMMON,
    "InetAddr": some("<InetAddr>localhost:9092</InetAddr>"),
    "Topic": some("<Topic>amps-1.publish</Topic>"),
    "MessageType": OPT,
    "MaxOffsetsPerTrigger": OPT,
}
_REPLICATION_IN_SCHEMA = {**_TRANSPORT_COMMON, "InetAddr": OPT}
_TOPIC_SCHEMA = {
    "Name": one("<Name>.*</Name>"),
    "MessageType": one("<MessageType>json</MessageType>"),
}
_SOW_SCHEMA = {"Topic": MANY, "Queue": MANY, "GroupLocalQueue": MANY, "DistributedQueue": MANY}
_SOW_TOPIC_SCHEMA = {**_TOPIC_SCHEMA, "Name": one("<Name>/orders</Name>"), "Key": MANY, "CompactionInterval": OPT}
_QUEUE_SCHEMA = {
    "Name": one("<Name>/work-queue</Name>"),
    "MessageType": one("<MessageType>json</MessageType>"),
    "UnderlyingTopic": OPT,
    "Filter": OPT,
}
_DESTINATION_SCHEMA = {
    "Name": OPT,  # AMPS allows a destination named only by its <Group> (the cascading mesh's)
    "Group": OPT,
    "SyncType": one("<SyncType>sync</SyncType> (or async)"),
    "PassThrough": OPT,
    "Topic": some("<Topic><Name>.*</Name><MessageType>json</MessageType></Topic>"),
    "Transport": one(
        "<Transport><Type>amps-replication</Type>"
        "<InetAddr>file:///var/lib/replication/amps-2</InetAddr></Transport>"
    ),
    "Compression": OPT,
}
_DESTINATION_TOPIC_SCHEMA = {**_TOPIC_SCHEMA, "Filter": OPT, "ExcludeValidation": OPT}
_REPLICATION_OUT_SCHEMA = {
    "Type": one("<Type>amps-replication</Type>"),
    "InetAddr": some("<InetAddr>file:///var/lib/replication/amps-2</InetAddr>"),
    "Name": OPT,  # AMPS examples label the transport; accepted as a label only
}
_BOOTSTRAP_SCHEMA = {
    "Topic": some("<Topic><Name>.*</Name><MessageType>json</MessageType></Topic>"),
    "DataType": OPT,
    "Transport": one(
        "<Transport><Type>amps-replication</Type>"
        "<InetAddr>file:///var/lib/replication/source</InetAddr></Transport>"
    ),
}
_BOOTSTRAP_TRANSPORT_SCHEMA = {
    "Type": one("<Type>amps-replication</Type>"),
    "InetAddr": some("<InetAddr>file:///var/lib/replication/source</InetAddr>"),
}
_ACTION_SCHEMA = {
    "On": one("<On><Module>amps-action-on-schedule</Module><Options><Every>15s</Every></Options></On>"),
    "Do": some("<Do><Module>amps-action-do-downgrade-replication</Module><Options><Age>300s</Age></Options></Do>"),
}
_STEP_SCHEMA = {"Module": one("<Module>amps-action-on-schedule</Module>"), "Options": OPT}


@dataclass(frozen=True)
class _Option:
    field: str  # the ActionStep field it fills
    kind: str  # "interval", "interval0" (zero allowed), "count" (non-negative int), "moved" (refused)
    required: bool = False


# The modules this product implements, with their options. Any other module would
# silently do nothing, so it is refused.
_ON_MODULES: dict[str, dict[str, _Option]] = {
    "amps-action-on-schedule": {"Every": _Option("every", "interval", required=True)},
}
_DO_MODULES: dict[str, dict[str, _Option]] = {
    "amps-action-do-downgrade-replication": {
        "Age": _Option("age", "interval", required=True),
        "GracePeriod": _Option("grace_period", "interval0"),
        # AMPS sets this at instance level; written here it is refused with where it goes.
        "MinimumSyncDestinations": _Option("", "moved"),
    },
    "amps-action-do-upgrade-replication": {"Age": _Option("age", "interval", required=True)},
}


def _instance(root: Node) -> InstanceConfig:
    kids = root.children(_ROOT_SCHEMA)
    name = _name(kids.one("Name"), "instance name")
    group = kids.text("Group") or name
    storage = _location(kids.one("Storage"))
    kafka, inbox = _transports(kids.opt("Transports"), storage)
    txlog = _txlog(kids.opt("TransactionLog"))
    sow_topics, queues = _sow(kids.opt("SOW"))
    replication = kids.opt("Replication")
    destinations = _replication(replication, name, storage, inbox) if replication is not None else ()
    if destinations and not txlog and replication is not None:
        replication.fail(
            "replication is configured but there is no <TransactionLog>; only messages recorded "
            "in the transaction log are replicated",
            "add <TransactionLog><Topic><Name>.*</Name><MessageType>json</MessageType></Topic>"
            "</TransactionLog> to <AMPSConfig>",
        )
    bootstrap_node = kids.opt("Bootstrap")
    bootstrap = _bootstrap(bootstrap_node, sow_topics) if bootstrap_node is not None else None
    if bootstrap_node is not None:
        if not txlog:
            bootstrap_node.fail(
                "<Bootstrap> needs a <TransactionLog> to copy messages into",
                "add <TransactionLog><Topic><Name>.*</Name><MessageType>json</MessageType></Topic>"
                "</TransactionLog> to <AMPSConfig>, covering the bootstrapped topics",
            )
        if inbox is None:
            bootstrap_node.fail(
                "<Bootstrap> needs an incoming replication transport",
                "add <Transport><Name>amps-replication</Name><Type>amps-replication</Type></Transport> "
                "to <Transports>",
            )
    actions_node = kids.opt("Actions")
    actions = _actions(actions_node) if actions_node is not None else ()
    minimum_sync = _tuning(kids.opt("Tuning"))
    return InstanceConfig(
        name=name,
        group=group,
        storage=storage,
        kafka_transports=kafka,
        replication_transport=inbox,
        txlog_topics=txlog,
        sow_topics=sow_topics,
        queues=queues,
        destinations=destinations,
        bootstrap=bootstrap,
        actions=actions,
        minimum_sync_destinations=minimum_sync,
        source=root.source(),
    )


def _tuning(node: Node | None) -> int:
    """``<Tuning>``: instance-level parameters; today ``MinimumSyncDestinations`` (default 0)."""
    if node is None:
        return 0
    value_node = node.children(_TUNING_SCHEMA).opt("MinimumSyncDestinations")
    return _count(value_node) if value_node is not None else 0


def _count(node: Node) -> int:
    value = node.text()
    if not value.isdigit():
        node.fail(f"'{value}' is not a whole number", f"write e.g. <{node.tag}>1</{node.tag}>")
    return int(value)


def _transport_schema(node: Node) -> dict[str, Card]:
    types = [c for c in node.el if c.tag == "Type"]
    if len(types) != 1:  # let children() report the missing or repeated <Type>
        return {**_KAFKA_SCHEMA, **_REPLICATION_IN_SCHEMA}
    type_node = Node(types[0], f"{node.path}/Type", node.ctx)
    kind = _enum(type_node, TRANSPORT_TYPES)
    return _KAFKA_SCHEMA if kind == "kafka" else _REPLICATION_IN_SCHEMA


def _transports(
    node: Node | None, storage: str
) -> tuple[tuple[KafkaTransport, ...], ReplicationTransport | None]:
    if node is None:
        return (), None
    kafka: list[KafkaTransport] = []
    inbox: ReplicationTransport | None = None
    names: dict[str, int] = {}
    for tnode in node.children({"Transport": MANY}).all("Transport"):
        schema = _transport_schema(tnode)
        kids = tnode.children(schema)
        name_node = kids.one("Name")
        name = name_node.text()
        if name in names:
            name_node.fail(
                f"transport name '{name}' is already used by the transport at line {names[name]}",
                "give each <Transport> a distinct <Name>",
            )
        names[name] = tnode.line
        if schema is _KAFKA_SCHEMA:
            kafka.append(_kafka(tnode, kids, name))
            continue
        if inbox is not None:
            tnode.fail(
                f"a second amps-replication transport '{name}' (the first is at line {inbox.source.line}); "
                "an instance has exactly one inbox",
                "keep a single <Transport> with <Type>amps-replication</Type>",
            )
        addr = kids.opt("InetAddr")
        if addr is not None and _location(addr) != storage:
            # Upstreams find an instance's inbox, heartbeat, instance.json and ack files under one
            # root; an inbox elsewhere would never be written to (nothing would connect).
            addr.fail(
                f"an incoming replication address '{_location(addr)}' that differs from <Storage> "
                f"'{storage}' is not supported yet: upstreams write this instance's inbox and read its "
                "heartbeat and acknowledgements under its storage root",
                f"write <InetAddr>{storage}</InetAddr> (the <Storage> location), or leave <InetAddr> out",
            )
        inbox = ReplicationTransport(name=name, inet_addr=storage, source=tnode.source())
    return tuple(kafka), inbox


def _kafka(tnode: Node, kids: Kids, name: str) -> KafkaTransport:
    servers = [s for addr in kids.all("InetAddr") for s in _kafka_server(addr)]
    topics: list[str] = []
    for topic_node in kids.all("Topic"):
        topic = topic_node.text()
        if not _KAFKA_TOPIC.match(topic) or topic in (".", ".."):
            topic_node.fail(
                f"'{topic}' is not a legal Kafka topic name",
                "use only letters, digits, '.', '_' and '-'; an AMPS topic such as /orders/1 "
                "goes in the amps-topic header of each record, not here",
            )
        if topic in topics:
            topic_node.fail(f"Kafka topic '{topic}' is listed twice", "list each <Topic> once")
        topics.append(topic)
    mt = kids.opt("MessageType")
    cap = kids.opt("MaxOffsetsPerTrigger")
    return KafkaTransport(
        name=name,
        bootstrap_servers=tuple(servers),
        topics=tuple(topics),
        message_type=_message_type(mt) if mt is not None else "json",
        max_offsets_per_trigger=_positive_int(cap) if cap is not None else DEFAULT_BATCH_ROWS,
        source=tnode.source(),
    )


def _topic_spec(node: Node) -> TopicSpec:
    kids = node.children(_TOPIC_SCHEMA)
    return TopicSpec(
        name=_regex(kids.one("Name")),
        message_type=_message_type(kids.one("MessageType")),
        source=node.source(),
    )


def _unique_topics(nodes: list[Node], specs: list[TopicSpec] | tuple[TopicSpec, ...]) -> None:
    seen: dict[tuple[str, str], int] = {}
    for node, spec in zip(nodes, specs):
        key = (spec.name, spec.message_type)
        if key in seen:
            node.fail(
                f"topic '{spec.name}' ({spec.message_type}) is listed twice (first at line {seen[key]})",
                "remove the repeated <Topic>",
            )
        seen[key] = node.line


def _txlog(node: Node | None) -> tuple[TopicSpec, ...]:
    if node is None:
        return ()
    nodes = node.children({"Topic": some(_TOPIC_SCHEMA["Name"].example)}).all("Topic")
    specs = [_topic_spec(n) for n in nodes]
    _unique_topics(nodes, specs)
    return tuple(specs)


def _sow(node: Node | None) -> tuple[tuple[SowTopic, ...], tuple[QueueTopic, ...]]:
    if node is None:
        return (), ()
    kids = node.children(_SOW_SCHEMA)
    topics: list[SowTopic] = []
    seen: dict[tuple[str, str], int] = {}
    for tnode in kids.all("Topic"):
        tk = tnode.children(_SOW_TOPIC_SCHEMA)
        name = _regex(tk.one("Name"))
        message_type = _message_type(tk.one("MessageType"))
        keys = [_sow_key(key_node, message_type) for key_node in tk.all("Key")]
        for i, key_node in enumerate(tk.all("Key")):
            if keys[i] in keys[:i]:
                key_node.fail(f"key '{keys[i]}' is listed twice", "list each <Key> once")
        interval = tk.opt("CompactionInterval")
        _claim(seen, name, message_type, tnode)
        topics.append(
            SowTopic(
                name=name,
                message_type=message_type,
                keys=tuple(keys),
                compaction_interval=_interval(interval) if interval is not None else DEFAULT_COMPACTION_INTERVAL_S,
                source=tnode.source(),
            )
        )
    queues: list[QueueTopic] = []
    for kind in QUEUE_KINDS:
        schema = {**_QUEUE_SCHEMA, "InitialOwner": OPT} if kind == "GroupLocalQueue" else _QUEUE_SCHEMA
        for qnode in kids.all(kind):
            qk = qnode.children(schema)
            name = qk.one("Name").text()
            message_type = _message_type(qk.one("MessageType"))
            _claim(seen, name, message_type, qnode)
            underlying = qk.opt("UnderlyingTopic")
            filter_node = qk.opt("Filter")
            owner = qk.opt("InitialOwner") if kind == "GroupLocalQueue" else None
            queues.append(
                QueueTopic(
                    name=name,
                    message_type=message_type,
                    underlying_topic=_regex(underlying) if underlying is not None else name,
                    kind=kind,
                    filter=_filter(filter_node, message_type) if filter_node is not None else None,
                    initial_owner=_name(owner, "initial owner") if owner is not None else None,
                    source=qnode.source(),
                )
            )
    queues.sort(key=lambda q: q.source.line)
    return tuple(topics), tuple(queues)


def _sow_key(node: Node, message_type: str) -> str:
    """A ``<Key>`` field path, on a message type whose bodies have fields."""
    key = node.text()
    if message_type not in FILTERABLE_TYPES:
        node.fail(
            f"a <Key> on {message_type} messages cannot be read: SOW keys are fields of "
            f"{', '.join(FILTERABLE_TYPES)} messages",
            f"remove the <Key> elements: each {message_type} message then names its key in the amps-sow-key "
            "header; or keep a SOW topic of a message type with fields",
        )
    if not key.startswith("/") or len(key) < 2 or any(ch.isspace() for ch in key) or "//" in key:
        node.fail(f"'{key}' is not a SOW key path", "write a field path such as <Key>/id</Key> (nested: /order/id)")
    if message_type in ("fix", "nvfix") and key.count("/") > 1:
        node.fail(
            f"'{key}' is a nested path, but {message_type} fields are flat",
            "name the tag itself, e.g. <Key>/55</Key>" if message_type == "fix" else "name the field, e.g. <Key>/Symbol</Key>",
        )
    return key


def _claim(seen: dict[tuple[str, str], int], name: str, message_type: str, node: Node) -> None:
    if (name, message_type) in seen:
        node.fail(
            f"SOW topic or queue '{name}' ({message_type}) is already defined at line "
            f"{seen[(name, message_type)]}",
            "give each SOW topic and queue a distinct <Name>, or remove the repeated definition",
        )
    seen[(name, message_type)] = node.line


def _replication(
    node: Node, instance: str, storage: str, inbox: ReplicationTransport | None
) -> tuple[Destination, ...]:
    own = {storage} | ({inbox.inet_addr} if inbox else set())
    destinations: list[Destination] = []
    names: dict[str, int] = {}
    addresses: dict[str, str] = {}
    for dnode in node.children({"Destination": MANY}).all("Destination"):
        kids = dnode.children(_DESTINATION_SCHEMA)
        name_node = kids.opt("Name")
        if name_node is None:
            name_node = kids.opt("Group")
        if name_node is None:
            dnode.fail(
                "a <Destination> needs a <Name> or a <Group> (AMPS identifies a destination written "
                "without a <Name> by its group)",
                "add the destination's <Group>, e.g. <Group>LiveProdSubscriptions</Group>, or a <Name>, "
                "e.g. <Name>amps-2</Name>",
            )
        by_group = name_node.tag == "Group"
        if by_group and not _NAME.match(name_node.text()):
            name_node.fail(
                f"this destination has no <Name>, so its <Group> '{name_node.text()}' would name it, and a "
                "destination's name must be usable in file names",
                "add a <Name> of letters, digits, '.', '_' and '-' to this <Destination>, e.g. <Name>dr-site</Name>",
            )
        name = _name(name_node, "destination name")
        if name == instance:
            name_node.fail(
                f"destination '{name}' is this instance itself",
                "name another instance in <Destination><Name>; an instance never replicates to itself"
                if not by_group else f"add a <Name> to this destination: its <Group> '{name}' is this "
                "instance's name",
            )
        if name in names:
            name_node.fail(
                f"destination '{name}' is already defined at line {names[name]}"
                + (" (a destination with no <Name> is named by its <Group>)" if by_group else ""),
                "give each <Destination> a distinct <Name>, or merge their <Topic> lists",
            )
        names[name] = dnode.line
        tk = kids.one("Transport").children(_REPLICATION_OUT_SCHEMA)
        _enum(tk.one("Type"), ("amps-replication",))
        if tk.opt("Name") is not None:
            tk.text("Name")  # a label only, but it must still be well-formed
        addrs: list[str] = []
        for anode in tk.all("InetAddr"):
            addr = _location(anode)
            if addr in own:
                anode.fail(
                    f"'{addr}' is this instance's own storage",
                    "write the destination instance's <Storage> location",
                )
            if addresses.get(addr, name) != name:
                anode.fail(
                    f"'{addr}' is also the address of destination '{addresses[addr]}'",
                    "give each destination its own instance's storage location",
                )
            addresses[addr] = name
            addrs.append(addr)
        compression = kids.opt("Compression")
        pass_through = kids.opt("PassThrough")
        destinations.append(
            Destination(
                name=name,
                group=kids.text("Group") or name,
                sync_type=_enum(kids.one("SyncType"), SYNC_TYPES),
                topics=_destination_topics(kids.all("Topic")),
                inet_addrs=tuple(addrs),
                pass_through=_regex(pass_through) if pass_through is not None else None,
                compression=_enum(compression, COMPRESSIONS) if compression is not None else "zstd",
                source=dnode.source(),
            )
        )
    return tuple(destinations)


def _destination_topics(nodes: list[Node]) -> tuple[DestinationTopic, ...]:
    topics: list[DestinationTopic] = []
    for tnode in nodes:
        kids = tnode.children(_DESTINATION_TOPIC_SCHEMA)
        filter_node = kids.opt("Filter")
        exclude_node = kids.opt("ExcludeValidation")
        message_type = _message_type(kids.one("MessageType"))
        topics.append(
            DestinationTopic(
                name=_regex(kids.one("Name")),
                message_type=message_type,
                filter=_filter(filter_node, message_type) if filter_node is not None else None,
                exclude_validation=_exclusions(exclude_node) if exclude_node is not None else frozenset(),
                source=tnode.source(),
            )
        )
    _unique_topics(nodes, [TopicSpec(t.name, t.message_type) for t in topics])
    return tuple(topics)


def _exclusions(node: Node) -> frozenset[str]:
    checks = _comma_list(node)
    excludable = tuple(c for c in VALIDATION_CHECKS if c not in MANDATORY_CHECKS)
    for check in checks:
        if check in MANDATORY_CHECKS:
            node.fail(
                f"'{check}' cannot be excluded: queue and queue_underlying are mandatory validation checks",
                f"remove '{check}' from <ExcludeValidation>; a replicated queue must be a queue with the "
                "same underlying topic on both instances",
            )
        if check not in VALIDATION_CHECKS:
            guess = suggest(check, excludable)
            hint = f"; did you mean '{guess}'?" if guess else ""
            node.fail(
                f"'{check}' is not a validation check{hint} (checks that can be excluded: {', '.join(excludable)})",
                f"replace '{check}' with {repr(guess) if guess else 'one of them'}, comma-separated, "
                "e.g. <ExcludeValidation>replicate,cascade</ExcludeValidation>",
            )
    return frozenset(checks)


def _bootstrap(node: Node, sow_topics: tuple[SowTopic, ...]) -> Bootstrap:
    kids = node.children(_BOOTSTRAP_SCHEMA)
    topic_nodes = kids.all("Topic")
    topics = [_topic_spec(n) for n in topic_nodes]
    _unique_topics(topic_nodes, topics)
    has_sow = any(s.message_type == t.message_type for s in sow_topics for t in topics)
    # default: the txlog, and the SOW when a bootstrapped message type has SOW topics here
    data_types: frozenset[str] = frozenset({"txlog", "sow"} if has_sow else {"txlog"})
    dt_node = kids.opt("DataType")
    if dt_node is not None:
        items = _comma_list(dt_node)
        for item in items:
            _enum(dt_node, DATA_TYPES, item=item)
        data_types = frozenset(items)
        if "sow" in data_types and not has_sow:
            dt_node.fail(
                "the sow data type copies the source's SOW records into this instance's SOW topics, but no "
                "<SOW><Topic> here has the message type of a bootstrapped <Topic>",
                "add the SOW topics to <SOW>, or write <DataType>txlog</DataType>",
            )
    tk = kids.one("Transport").children(_BOOTSTRAP_TRANSPORT_SCHEMA)
    _enum(tk.one("Type"), ("amps-replication",))
    addrs = tuple(_location(a) for a in tk.all("InetAddr"))
    return Bootstrap(
        topics=tuple(topics),
        data_types=data_types,
        inet_addr=addrs[0],
        inet_addrs=addrs,
        source=node.source(),
    )


def _actions(node: Node) -> tuple[Action, ...]:
    actions: list[Action] = []
    for anode in node.children({"Action": MANY}).all("Action"):
        kids = anode.children(_ACTION_SCHEMA)
        actions.append(
            Action(
                on=_step(kids.one("On"), _ON_MODULES),
                do=tuple(_step(d, _DO_MODULES) for d in kids.all("Do")),
                source=anode.source(),
            )
        )
    return tuple(actions)


def _step(node: Node, modules: dict[str, dict[str, _Option]]) -> ActionStep:
    kids = node.children(_STEP_SCHEMA)
    module = _enum(kids.one("Module"), tuple(modules))
    spec = modules[module]
    values: dict[str, float | int] = {}
    options_node = kids.opt("Options")
    okids = options_node.children({name: OPT for name in spec}) if options_node is not None else None
    for name, opt in spec.items():
        onode = okids.opt(name) if okids is not None else None
        if onode is None:
            if opt.required:
                node.fail(
                    f"module {module} needs the option <{name}>",
                    f"add <Options><{name}>15s</{name}></Options> to <{node.tag}>",
                )
            continue
        if opt.kind == "moved":
            onode.fail(
                f"<{name}> is an instance-level setting (AMPS: an instance-level tuning parameter), "
                f"not an option of {module}",
                f"remove it here and write <Tuning><{name}>{onode.text()}</{name}></Tuning> "
                "directly under <AMPSConfig>",
            )
        if opt.kind == "count":
            values[opt.field] = _count(onode)
        else:
            values[opt.field] = _interval(onode, allow_zero=opt.kind == "interval0")
    return ActionStep(module=module, source=node.source(), **values)
