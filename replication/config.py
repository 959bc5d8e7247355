"""Instance configuration: the AMPS-style XML of DESIGN §4 as frozen dataclasses.

Parse once, at the edge (:func:`load`); nothing downstream sees lxml objects.
Every field that came from the file keeps its line in ``line`` so later checks
(validation, link start) can point back at the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from replication.errors import ConfigError

MessageType = Literal["json", "fix", "nvfix", "xml", "binary"]
MESSAGE_TYPES: tuple[str, ...] = ("json", "fix", "nvfix", "xml", "binary")

#: Rows per micro-batch of every query unless configured: bounds the driver's
#: memory (a batch is collected there) and lets a backlog flow through the
#: ingest, replicator and downstream queries in overlapping steps. 1M messages
#: through one instance: 65k rows/s uncapped, 93k with 200k-row batches
#: (bench/replicate.py on 2 cores).
DEFAULT_BATCH_ROWS = 200_000

SyncType = Literal["sync", "async"]

#: Validation checks of "Replication Configuration Validation", in spec order.
VALIDATION_CHECKS: tuple[str, ...] = (
    "txlog",
    "replicate",
    "sow",
    "cascade",
    "queue",
    "keys",
    "replicate_filter",
    "queue_passthrough",
    "queue_underlying",
)
#: Checks the spec says can never be excluded.
MANDATORY_CHECKS: frozenset[str] = frozenset({"queue", "queue_underlying"})


@dataclass(frozen=True)
class Source:
    """Where an element came from: for error messages that point at the file."""

    file: str = ""
    line: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" if self.file else "<config>"


@dataclass(frozen=True)
class KafkaTransport:
    """Publish ingress: Kafka topics this instance reads publishes from."""

    name: str
    bootstrap_servers: tuple[str, ...]
    """``<InetAddr>`` values, host:port each."""
    topics: tuple[str, ...]
    """``<Topic>`` values: Kafka topic names read by this instance."""
    message_type: str = "json"
    """Default message type when a record has no ``amps-type`` header."""
    max_offsets_per_trigger: int = DEFAULT_BATCH_ROWS
    """``<MaxOffsetsPerTrigger>``: cap on records per micro-batch."""
    source: Source = field(default_factory=Source, compare=False)


@dataclass(frozen=True)
class ReplicationTransport:
    """Incoming replication (the inbox): where upstream instances push to."""

    name: str
    inet_addr: str
    """Storage root URI of this instance as upstreams address it."""
    source: Source = field(default_factory=Source, compare=False)


@dataclass(frozen=True)
class TopicSpec:
    """A ``<Topic>`` of ``<TransactionLog>`` or ``<Bootstrap>``: a regex and a message type."""

    name: str
    """Topic regex (AMPS: a literal name is a regex that matches itself)."""
    message_type: str
    source: Source = field(default_factory=Source, compare=False)


@dataclass(frozen=True)
class SowTopic:
    """A ``<SOW><Topic>``: latest message per key."""

    name: str
    message_type: str
    keys: tuple[str, ...]
    """``<Key>`` values, XPath-like field paths such as ``/id``."""
    source: Source = field(default_factory=Source, compare=False)


@dataclass(frozen=True)
class QueueTopic:
    """A ``<SOW><Queue>`` (or ``GroupLocalQueue``/``DistributedQueue``) definition.

    Queues are not delivered by this product yet; they are parsed because
    replication validation (queue, queue_passthrough, queue_underlying) needs them.
    """

    name: str
    message_type: str
    underlying_topic: str
    """``<UnderlyingTopic>``: regex of the topics the queue draws from (default: ``name``)."""
    kind: str = "Queue"
    """Element name: ``Queue``, ``GroupLocalQueue`` or ``DistributedQueue``."""
    filter: str | None = None
    initial_owner: str | None = None
    """``<InitialOwner>`` of a ``GroupLocalQueue`` (must match across instances, spec)."""
    source: Source = field(default_factory=Source, compare=False)


@dataclass(frozen=True)
class DestinationTopic:
    """A ``<Topic>`` of a ``<Destination>``: what is replicated on that link."""

    name: str
    """Topic regex."""
    message_type: str
    filter: str | None = None
    """``<Filter>``: AMPS content filter expression (see :mod:`replication.expressions`)."""
    exclude_validation: frozenset[str] = frozenset()
    """``<ExcludeValidation>``: checks not applied for this topic."""
    source: Source = field(default_factory=Source, compare=False)


@dataclass(frozen=True)
class Destination:
    """A ``<Replication><Destination>``: one outgoing replication link."""

    name: str
    """Instance name of the destination."""
    group: str
    """``<Group>`` of the destination (default: its name)."""
    sync_type: str
    """``sync`` or ``async``."""
    topics: tuple[DestinationTopic, ...]
    inet_addrs: tuple[str, ...]
    """Failover list of the destination's storage roots, in priority order."""
    pass_through: str | None = None
    """``<PassThrough>``: regex of upstream groups whose messages are forwarded here."""
    compression: str = "zstd"
    """``<Compression>``: Parquet codec of inbox writes (zstd, snappy, gzip, lz4, none)."""
    source: Source = field(default_factory=Source, compare=False)


@dataclass(frozen=True)
class Bootstrap:
    """``<Bootstrap>``: copy a source instance's data before streaming starts."""

    topics: tuple[TopicSpec, ...]
    data_types: frozenset[str]
    """Subset of {"sow", "txlog"}."""
    inet_addr: str
    """The first (preferred) source address: ``inet_addrs[0]``."""
    inet_addrs: tuple[str, ...] = ()
    """All ``<InetAddr>`` values of the bootstrap ``<Transport>``: failover list, in priority order."""
    source: Source = field(default_factory=Source, compare=False)


@dataclass(frozen=True)
class ActionStep:
    """An ``<On>`` or ``<Do>`` of an action: a module and its options."""

    module: str
    options: tuple[tuple[str, str], ...] = ()
    """``<Options>`` children as (element name, text) pairs, in file order."""
    source: Source = field(default_factory=Source, compare=False)

    def option(self, name: str, default: str | None = None) -> str | None:
        for key, value in self.options:
            if key == name:
                return value
        return default


@dataclass(frozen=True)
class Action:
    """``<Actions><Action>``: when (``on``) do what (``do``)."""

    on: ActionStep
    do: tuple[ActionStep, ...]
    source: Source = field(default_factory=Source, compare=False)


@dataclass(frozen=True)
class InstanceConfig:
    """One instance's whole configuration (an ``<AMPSConfig>`` file)."""

    name: str
    group: str
    """``<Group>`` (default: the name)."""
    storage: str
    """Storage root URI (``file:///...`` or a plain path)."""
    kafka_transports: tuple[KafkaTransport, ...] = ()
    replication_transport: ReplicationTransport | None = None
    txlog_topics: tuple[TopicSpec, ...] = ()
    sow_topics: tuple[SowTopic, ...] = ()
    queues: tuple[QueueTopic, ...] = ()
    destinations: tuple[Destination, ...] = ()
    bootstrap: Bootstrap | None = None
    actions: tuple[Action, ...] = ()
    source: Source = field(default_factory=Source, compare=False)

    def destination(self, name: str) -> Destination:
        for dest in self.destinations:
            if dest.name == name:
                return dest
        raise KeyError(name)


def load(path: str) -> InstanceConfig:
    """Parse and check one config file. Raises :class:`ConfigError` naming file, line and fix."""
    from replication.config_parser import parse_file

    return parse_file(path)


__all__ = [
    "Action",
    "ActionStep",
    "Bootstrap",
    "ConfigError",
    "Destination",
    "DestinationTopic",
    "InstanceConfig",
    "KafkaTransport",
    "MANDATORY_CHECKS",
    "MESSAGE_TYPES",
    "QueueTopic",
    "ReplicationTransport",
    "Source",
    "SowTopic",
    "TopicSpec",
    "VALIDATION_CHECKS",
    "load",
]
