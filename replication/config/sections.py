"""Schema of the sections messages go through: <Transports>, <TransactionLog>, <SOW>, <Replication>, <Bootstrap>.

Each function walks one section's elements (:mod:`replication.config.xml_reader`)
into :mod:`replication.config.model` dataclasses, its values parsed by
:mod:`replication.config.values`; :mod:`replication.config.parser` calls them
from the ``<AMPSConfig>`` root and checks what spans sections.
"""

from __future__ import annotations

from replication.config import link_auth, values
from replication.config.model import (
    DEFAULT_BATCH_ROWS,
    DEFAULT_COMPACTION_INTERVAL_S,
    DEFAULT_LEASE_PERIOD_S,
    Bootstrap,
    Destination,
    DestinationTopic,
    KafkaTransport,
    QueueTopic,
    ReplicationTransport,
    SowTopic,
    TopicSpec,
)
from replication.config.security import security
from replication.config.xml_reader import MANY, OPT, Card, Kids, Node, one, some

__all__ = [
    "COMPRESSIONS",
    "DATA_TYPES",
    "QUEUE_KINDS",
    "QUEUE_SEMANTICS",
    "TRANSPORT_TYPES",
    "bootstrap",
    "destinations",
    "sow",
    "transports",
    "txlog_topics",
]

TRANSPORT_TYPES: tuple[str, ...] = ("kafka", "amps-replication")
COMPRESSIONS: tuple[str, ...] = ("zstd", "snappy", "gzip", "lz4", "none")
DATA_TYPES: tuple[str, ...] = ("sow", "txlog")
QUEUE_KINDS: tuple[str, ...] = ("Queue", "GroupLocalQueue", "DistributedQueue", "LocalQueue")
QUEUE_SEMANTICS: tuple[str, ...] = ("at-most-once", "at-least-once")
#: AMPS queue options this engine does not implement yet, and why: refused at load rather than ignored.
_QUEUE_NOT_SUPPORTED = {
    "MaxBacklog": "a subscriber gives its backlog when it subscribes (max_backlog)",
    "MaxPerSubscriptionBacklog": "a subscriber gives its backlog when it subscribes (max_backlog)",
    "Expiration": "messages stay in a queue until they are acknowledged (or delivered, at-most-once)",
    "MaxDeliveries": "a message is redelivered until it is acknowledged",
    "Priority": "messages are delivered in the order they were stored",
    "FairnessModel": "subscribers with room are served in turn",
    "TargetQueueDepth": "a queue holds every message not yet acknowledged",
    "DeliveryFailureTopic": "a message is redelivered until it is acknowledged",
}

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
    "Security": OPT,
}
_REPLICATION_IN_SCHEMA = {**_TRANSPORT_COMMON, "InetAddr": OPT, "Authentication": OPT, "Entitlement": OPT}
_TOPIC_SCHEMA = {
    "Name": one("<Name>.*</Name>"),
    "MessageType": one("<MessageType>json</MessageType>"),
}
_SOW_SCHEMA = {"Topic": MANY, **{kind: MANY for kind in QUEUE_KINDS}}
_SOW_TOPIC_SCHEMA = {**_TOPIC_SCHEMA, "Name": one("<Name>/orders</Name>"), "Key": MANY, "CompactionInterval": OPT}
_QUEUE_SCHEMA = {
    "Name": one("<Name>/work-queue</Name>"),
    "MessageType": one("<MessageType>json</MessageType>"),
    "UnderlyingTopic": OPT,
    "Filter": OPT,
    "Semantics": OPT,
    "LeasePeriod": OPT,
    "BarrierExpression": OPT,
    **{name: OPT for name in _QUEUE_NOT_SUPPORTED},
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
    "Authenticator": OPT,
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

# ---------------------------------------------------------------------------
# <Transports>


def _transport_schema(node: Node) -> dict[str, Card]:
    types = [c for c in node.el if c.tag == "Type"]
    if len(types) != 1:  # let children() report the missing or repeated <Type>
        return {**_KAFKA_SCHEMA, **_REPLICATION_IN_SCHEMA}
    type_node = Node(types[0], f"{node.path}/Type", node.ctx)
    kind = type_node.read(values.enum, TRANSPORT_TYPES)
    return _KAFKA_SCHEMA if kind == "kafka" else _REPLICATION_IN_SCHEMA


def transports(
    node: Node | None, storage: str
) -> tuple[tuple[KafkaTransport, ...], ReplicationTransport | None]:
    """``<Transports>``: the Kafka inputs, and the instance's one incoming replication transport."""
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
        if addr is not None and (inbox_addr := addr.read(values.storage_location)) != storage:
            # Upstreams find an instance's inbox, heartbeat, instance.json and ack files under one
            # root; an inbox elsewhere would never be written to (nothing would connect).
            addr.fail(
                f"an incoming replication address '{inbox_addr}' that differs from <Storage> "
                f"'{storage}' is not supported yet: upstreams write this instance's inbox and read its "
                "heartbeat and acknowledgements under its storage root",
                f"write <InetAddr>{storage}</InetAddr> (the <Storage> location), or leave <InetAddr> out",
            )
        inbox = ReplicationTransport(name=name, inet_addr=storage,
                                     upstream_keys=link_auth.authentication(kids.opt("Authentication")),
                                     entitlements=link_auth.entitlement(kids.opt("Entitlement")),
                                     source=tnode.source())
    return tuple(kafka), inbox


def _kafka(tnode: Node, kids: Kids, name: str) -> KafkaTransport:
    servers = [s for addr in kids.all("InetAddr") for s in addr.read(values.kafka_servers)]
    topics: list[str] = []
    for topic_node in kids.all("Topic"):
        topic = topic_node.read(values.kafka_topic)
        if topic in topics:
            topic_node.fail(f"Kafka topic '{topic}' is listed twice", "list each <Topic> once")
        topics.append(topic)
    mt = kids.opt("MessageType")
    cap = kids.opt("MaxOffsetsPerTrigger")
    return KafkaTransport(
        name=name,
        bootstrap_servers=tuple(servers),
        topics=tuple(topics),
        message_type=mt.read(values.message_type) if mt is not None else "json",
        max_offsets_per_trigger=cap.read(values.positive_int) if cap is not None else DEFAULT_BATCH_ROWS,
        security=security(kids.opt("Security")),
        source=tnode.source(),
    )


# ---------------------------------------------------------------------------
# <TransactionLog> and topic lists


def _topic_spec(node: Node) -> TopicSpec:
    kids = node.children(_TOPIC_SCHEMA)
    return TopicSpec(
        name=kids.one("Name").read(values.regex),
        message_type=kids.one("MessageType").read(values.message_type),
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


def txlog_topics(node: Node | None) -> tuple[TopicSpec, ...]:
    """``<TransactionLog>``: the topics recorded in the transaction log."""
    if node is None:
        return ()
    nodes = node.children({"Topic": some(_TOPIC_SCHEMA["Name"].example)}).all("Topic")
    specs = [_topic_spec(n) for n in nodes]
    _unique_topics(nodes, specs)
    return tuple(specs)


# ---------------------------------------------------------------------------
# <SOW>


def sow(node: Node | None) -> tuple[tuple[SowTopic, ...], tuple[QueueTopic, ...]]:
    """``<SOW>``: SOW topics, and queues in file order."""
    if node is None:
        return (), ()
    kids = node.children(_SOW_SCHEMA)
    topics: list[SowTopic] = []
    seen: dict[tuple[str, str], int] = {}
    for tnode in kids.all("Topic"):
        tk = tnode.children(_SOW_TOPIC_SCHEMA)
        name = tk.one("Name").read(values.regex)
        message_type = tk.one("MessageType").read(values.message_type)
        keys = [key_node.read(values.sow_key, message_type) for key_node in tk.all("Key")]
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
                compaction_interval=(
                    interval.read(values.interval) if interval is not None else DEFAULT_COMPACTION_INTERVAL_S
                ),
                source=tnode.source(),
            )
        )
    queues: list[QueueTopic] = []
    for kind in QUEUE_KINDS:
        schema = {**_QUEUE_SCHEMA, "InitialOwner": OPT} if kind == "GroupLocalQueue" else _QUEUE_SCHEMA
        for qnode in kids.all(kind):
            qk = qnode.children(schema)
            for option, why in _QUEUE_NOT_SUPPORTED.items():
                unsupported = qk.opt(option)
                if unsupported is not None:
                    unsupported.fail(f"<{option}> in <{kind}> is not supported yet: {why}",
                                     f"remove <{option}> from <{kind}>")
            name = qk.one("Name").text()
            message_type = qk.one("MessageType").read(values.message_type)
            _claim(seen, name, message_type, qnode)
            underlying = qk.opt("UnderlyingTopic")
            filter_node = qk.opt("Filter")
            owner = qk.opt("InitialOwner") if kind == "GroupLocalQueue" else None
            semantics, lease, barrier = qk.opt("Semantics"), qk.opt("LeasePeriod"), qk.opt("BarrierExpression")
            queues.append(
                QueueTopic(
                    name=name,
                    message_type=message_type,
                    underlying_topic=underlying.read(values.regex) if underlying is not None else name,
                    kind=kind,
                    filter=(
                        filter_node.read(values.content_filter, message_type) if filter_node is not None else None
                    ),
                    initial_owner=owner.read(values.name, "initial owner") if owner is not None else None,
                    semantics=(semantics.read(values.enum, QUEUE_SEMANTICS) if semantics is not None
                               else QUEUE_SEMANTICS[0]),
                    lease_period_s=lease.read(values.interval) if lease is not None else DEFAULT_LEASE_PERIOD_S,
                    barrier=barrier.read(values.content_filter, message_type) if barrier is not None else None,
                    source=qnode.source(),
                )
            )
    queues.sort(key=lambda q: q.source.line)
    return tuple(topics), tuple(queues)


def _claim(seen: dict[tuple[str, str], int], name: str, message_type: str, node: Node) -> None:
    if (name, message_type) in seen:
        node.fail(
            f"SOW topic or queue '{name}' ({message_type}) is already defined at line "
            f"{seen[(name, message_type)]}",
            "give each SOW topic and queue a distinct <Name>, or remove the repeated definition",
        )
    seen[(name, message_type)] = node.line


# ---------------------------------------------------------------------------
# <Replication>


def destinations(
    node: Node, instance: str, storage: str, inbox: ReplicationTransport | None
) -> tuple[Destination, ...]:
    """``<Replication>``: the destinations of ``instance``, none of them itself or sharing an address."""
    own = {storage} | ({inbox.inet_addr} if inbox else set())
    out: list[Destination] = []
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
        if by_group and not values.NAME.match(name_node.text()):
            name_node.fail(
                f"this destination has no <Name>, so its <Group> '{name_node.text()}' would name it, and a "
                "destination's name must be usable in file names",
                "add a <Name> of letters, digits, '.', '_' and '-' to this <Destination>, e.g. <Name>dr-site</Name>",
            )
        name = name_node.read(values.name, "destination name")
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
        tk.one("Type").read(values.enum, ("amps-replication",))
        if tk.opt("Name") is not None:
            tk.text("Name")  # a label only, but it must still be well-formed
        addrs: list[str] = []
        for anode in tk.all("InetAddr"):
            addr = anode.read(values.storage_location)
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
        out.append(
            Destination(
                name=name,
                group=kids.text("Group") or name,
                sync_type=kids.one("SyncType").read(values.sync_type),
                topics=_destination_topics(kids.all("Topic")),
                inet_addrs=tuple(addrs),
                pass_through=pass_through.read(values.regex) if pass_through is not None else None,
                compression=compression.read(values.enum, COMPRESSIONS) if compression is not None else "zstd",
                group_declared=kids.opt("Group") is not None,
                signing_key=link_auth.authenticator(tk.opt("Authenticator")),
                source=dnode.source(),
            )
        )
    return tuple(out)


def _destination_topics(nodes: list[Node]) -> tuple[DestinationTopic, ...]:
    topics: list[DestinationTopic] = []
    for tnode in nodes:
        kids = tnode.children(_DESTINATION_TOPIC_SCHEMA)
        filter_node = kids.opt("Filter")
        exclude_node = kids.opt("ExcludeValidation")
        message_type = kids.one("MessageType").read(values.message_type)
        topics.append(
            DestinationTopic(
                name=kids.one("Name").read(values.regex),
                message_type=message_type,
                filter=filter_node.read(values.content_filter, message_type) if filter_node is not None else None,
                exclude_validation=exclude_node.read(values.exclusions) if exclude_node is not None else frozenset(),
                source=tnode.source(),
            )
        )
    _unique_topics(nodes, [TopicSpec(t.name, t.message_type) for t in topics])
    return tuple(topics)


# ---------------------------------------------------------------------------
# <Bootstrap>


def bootstrap(node: Node, sow_topics: tuple[SowTopic, ...]) -> Bootstrap:
    """``<Bootstrap>``: what to copy from which source at first start (its needs are checked by the caller)."""
    kids = node.children(_BOOTSTRAP_SCHEMA)
    topic_nodes = kids.all("Topic")
    topics = [_topic_spec(n) for n in topic_nodes]
    _unique_topics(topic_nodes, topics)
    has_sow = any(s.message_type == t.message_type for s in sow_topics for t in topics)
    # default: the txlog, and the SOW when a bootstrapped message type has SOW topics here
    data_types: frozenset[str] = frozenset({"txlog", "sow"} if has_sow else {"txlog"})
    dt_node = kids.opt("DataType")
    if dt_node is not None:
        items = dt_node.read(values.comma_list)
        for item in items:
            values.enum(item, dt_node, DATA_TYPES, item=True)
        # (sow applies to the bootstrapped topics that are SOW topics here, and to none when none is:
        # the spec's "if either of these topics is recorded in the SOW")
        data_types = frozenset(items)
    tk = kids.one("Transport").children(_BOOTSTRAP_TRANSPORT_SCHEMA)
    tk.one("Type").read(values.enum, ("amps-replication",))
    addrs = tuple(a.read(values.storage_location) for a in tk.all("InetAddr"))
    return Bootstrap(
        topics=tuple(topics),
        data_types=data_types,
        inet_addr=addrs[0],
        inet_addrs=addrs,
        source=node.source(),
    )
