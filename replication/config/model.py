"""The parsed configuration: the AMPS-style XML of DESIGN §4 as frozen dataclasses.

Everything is parsed once, at load (:func:`replication.config.load`): filters
are parsed expressions, intervals are seconds, enumerations are ``Literal``
types. Nothing downstream sees lxml objects or re-parses config text. Every
element keeps where it came from in ``source`` so later checks (validation,
link start) can point back at the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from replication.connectors.kafka.security import PLAINTEXT, KafkaSecurity, Secret
from replication.expressions import Filter
from replication.messages import FIELD_TYPES

MessageType = Literal["json", "fix", "nvfix", "xml", "binary"]
MESSAGE_TYPES: tuple[str, ...] = get_args(MessageType)
#: Message types whose bodies have fields that content filters and SOW keys can read.
FILTERABLE_TYPES: tuple[str, ...] = FIELD_TYPES

#: Rows per micro-batch of every query unless configured: bounds the driver's
#: memory (a batch is collected there) and lets a backlog flow through the
#: ingest, replicator and downstream queries in overlapping steps. 1M messages
#: through one instance: 65k rows/s uncapped, 93k with 200k-row batches
#: (bench/replicate.py on 2 cores).
DEFAULT_BATCH_ROWS = 200_000

SyncType = Literal["sync", "async"]
SYNC_TYPES: tuple[str, ...] = get_args(SyncType)

#: Validation checks of "Replication Configuration Validation", in spec order, then this engine's own
#: (``entitlement``: the downstream's ``<Entitlement>`` admits what the destination sends).
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
    "entitlement",
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
    message_type: MessageType = "json"
    """Default message type when a record has no ``amps-type`` header."""
    max_offsets_per_trigger: int = DEFAULT_BATCH_ROWS
    """``<MaxOffsetsPerTrigger>``: cap on records per micro-batch."""
    security: KafkaSecurity = PLAINTEXT
    """``<Security>``: TLS and SASL toward the brokers (every client of this transport: ingest, acks)."""
    source: Source = field(default_factory=Source, compare=False)


@dataclass(frozen=True)
class UpstreamEntitlement:
    """One ``<Entitlement><Upstream>``: an upstream instance (by ``name``) or group (by ``group``) and the
    topics (regexes) it may replicate into this instance."""

    name: str | None
    group: str | None
    topics: tuple[str, ...]
    source: Source = field(default_factory=Source, compare=False)

    def admits(self, upstream: str, upstream_group: str | None) -> bool:
        return upstream == self.name if self.name is not None else upstream_group == self.group

    @property
    def label(self) -> str:
        return f"upstream {self.name}" if self.name is not None else f"group {self.group}"


@dataclass(frozen=True)
class ReplicationTransport:
    """Incoming replication (the inbox): where upstream instances push to."""

    name: str
    inet_addr: str
    """Storage root URI of this instance as upstreams address it."""
    upstream_keys: tuple[tuple[str, Secret], ...] | None = None
    """``<Authentication>`` with signed commits: the upstreams admitted and each one's key
    (:mod:`replication.inbox.signing`); None: every inbox commit is taken, as AMPS's default module does."""
    entitlements: tuple[UpstreamEntitlement, ...] | None = None
    """``<Entitlement>`` by upstream and topic: who may replicate which topics in; None: everything is allowed,
    as AMPS's default module does."""
    source: Source = field(default_factory=Source, compare=False)


@dataclass(frozen=True)
class TopicSpec:
    """A ``<Topic>`` of ``<TransactionLog>`` or ``<Bootstrap>``: a regex and a message type."""

    name: str
    """Topic regex (AMPS: a literal name is a regex that matches itself)."""
    message_type: MessageType
    source: Source = field(default_factory=Source, compare=False)


#: Default ``<CompactionInterval>``: how far the plain SOW Delta table may lag the newest changes.
DEFAULT_COMPACTION_INTERVAL_S = 5.0
#: A queue's ``<LeasePeriod>`` when none is given (this engine's choice; the spec names none).
DEFAULT_LEASE_PERIOD_S = 60.0


@dataclass(frozen=True)
class SowTopic:
    """A ``<SOW><Topic>``: the current message per key of every topic its ``name`` matches."""

    name: str
    """Topic name or regex (AMPS matching: a name without regex characters matches only itself)."""
    message_type: MessageType
    keys: tuple[str, ...]
    """``<Key>`` field paths such as ``/id`` (several: a composite key). Empty: each message's key
    comes from its ``amps-sow-key`` header."""
    compaction_interval: float = DEFAULT_COMPACTION_INTERVAL_S
    """``<CompactionInterval>`` (seconds): the plain Delta table under ``sow/`` is brought up to date
    this often; the exact current state is always what ``replication sow`` shows."""
    source: Source = field(default_factory=Source, compare=False)
    key_paths: tuple[tuple[str, ...], ...] = field(init=False, compare=False, repr=False)
    """``keys`` split into path segments (``/a/b`` -> ``("a", "b")``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_paths", tuple(tuple(k[1:].split("/")) for k in self.keys))


@dataclass(frozen=True)
class QueueTopic:
    """A ``<SOW><Queue>`` (or ``GroupLocalQueue``/``DistributedQueue``/``LocalQueue``) definition: its messages
    are the txlog rows of its underlying topics, delivered by :mod:`replication.queues`."""

    name: str
    message_type: MessageType
    underlying_topic: str
    """``<UnderlyingTopic>``: regex of the topics the queue draws from (default: ``name``)."""
    kind: str = "Queue"
    """Element name: ``Queue``, ``GroupLocalQueue`` or ``DistributedQueue``."""
    filter: Filter | None = None
    initial_owner: str | None = None
    """``<InitialOwner>`` of a ``GroupLocalQueue`` (must match across instances, spec)."""
    semantics: str = "at-most-once"
    """``<Semantics>``: ``at-most-once`` (AMPS's default: removed on delivery) or ``at-least-once`` (kept until
    acknowledged; redelivered when its lease ends)."""
    lease_period_s: float = DEFAULT_LEASE_PERIOD_S
    """``<LeasePeriod>``: how long a subscriber holds an at-least-once message before it is redelivered."""
    barrier: Filter | None = None
    """``<BarrierExpression>``: messages matching it are barriers, delivered (by every instance holding them)
    once no message ahead of them is left unacknowledged on that instance."""
    source: Source = field(default_factory=Source, compare=False)


@dataclass(frozen=True)
class DestinationTopic:
    """A ``<Topic>`` of a ``<Destination>``: what is replicated on that link."""

    name: str
    """Topic regex."""
    message_type: MessageType
    filter: Filter | None = None
    """``<Filter>``: AMPS content filter, parsed (see :mod:`replication.expressions`)."""
    exclude_validation: frozenset[str] = frozenset()
    """``<ExcludeValidation>``: checks not applied for this topic."""
    source: Source = field(default_factory=Source, compare=False)


@dataclass(frozen=True)
class Destination:
    """A ``<Replication><Destination>``: one outgoing replication link."""

    name: str
    """``<Name>``; a destination written without one (as AMPS allows, e.g. the cascading mesh's
    inter-tier destinations) is named by its ``<Group>``. The name labels the link (its state file,
    thread, status line); the instance actually reached is the one found at the address in use."""
    group: str
    """``<Group>`` of the destination (default: its name)."""
    sync_type: SyncType
    topics: tuple[DestinationTopic, ...]
    inet_addrs: tuple[str, ...]
    """Failover list of the destination's storage roots, in priority order."""
    pass_through: str | None = None
    """``<PassThrough>``: regex of upstream groups whose messages are forwarded here."""
    compression: str = "zstd"
    """``<Compression>``: Parquet codec of inbox writes (zstd, snappy, gzip, lz4, none)."""
    group_declared: bool = False
    """``<Group>`` was written: the instance reached must declare that group, or the link is refused (AMPS)."""
    signing_key: Secret | None = None
    """``<Transport><Authenticator>``: the key this link signs its inbox commits with (None: unsigned)."""
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
    """An ``<On>`` or ``<Do>`` of an action: its module and the options that module takes.

    Intervals are seconds. An option the module does not take is None.
    """

    module: str
    every: float | None = None
    """``<Every>`` of ``amps-action-on-schedule``: how often the action runs."""
    age: float | None = None
    """``<Age>`` of the downgrade (oldest unacknowledged message), upgrade (behind by less) and remove-journal
    (rows older than this may go) modules."""
    grace_period: float | None = None
    """``<GracePeriod>`` of the downgrade module: no downgrade in the first this many seconds after start,
    while the other instances start and links connect (AMPS)."""
    source: Source = field(default_factory=Source, compare=False)


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
    """Storage root URI (``file:///...``, a plain path, or ``s3://bucket/prefix``)."""
    kafka_transports: tuple[KafkaTransport, ...] = ()
    replication_transport: ReplicationTransport | None = None
    txlog_topics: tuple[TopicSpec, ...] = ()
    sow_topics: tuple[SowTopic, ...] = ()
    queues: tuple[QueueTopic, ...] = ()
    destinations: tuple[Destination, ...] = ()
    bootstrap: Bootstrap | None = None
    actions: tuple[Action, ...] = ()
    minimum_sync_destinations: int = 0
    """``<Tuning><MinimumSyncDestinations>``: the downgrade action never leaves fewer sync destinations
    than this (an instance-level setting, as in AMPS)."""
    source: Source = field(default_factory=Source, compare=False)

    @property
    def on_object_storage(self) -> bool:
        """Whether ``<Storage>`` is an S3 prefix (``s3://bucket/prefix``: config load normalises ``s3a://``)."""
        return self.storage.startswith("s3://")

    def destination(self, name: str) -> Destination:
        for dest in self.destinations:
            if dest.name == name:
                return dest
        raise KeyError(name)


__all__ = [
    "Action",
    "ActionStep",
    "Bootstrap",
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
    "UpstreamEntitlement",
    "VALIDATION_CHECKS",
]
