"""Parse an instance's AMPS-style XML config (DESIGN §4) into :mod:`replication.config.model` dataclasses.

The entry points, and the schema of the ``<AMPSConfig>`` root with its
``<Actions>`` and ``<Tuning>``; the sections messages go through are in
:mod:`replication.config.sections`, the value parsers in
:mod:`replication.config.values`.

Parsing is secure (no DTD, no entities, no network, no huge trees) and strict:
an unknown, missing, repeated or malformed element is a :class:`ConfigError`
whose message reads ``<file>:<line>: <element path>: <problem>. Fix: <fix>``.
``${VAR}`` and ``${VAR:-default}`` in text values are replaced from the
environment after parsing, so a value can never inject XML and line numbers stay
those of the file. Storage locations are resolved as
:func:`~replication.config.values.parse_location` says: relative paths against
the config file's directory.

Example::

    from replication.config.parser import parse_file
    cfg = parse_file("conf/amps-1.xml")
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from replication.config import sections, values
from replication.config.model import (
    Action,
    ActionStep,
    Destination,
    InstanceConfig,
    QueueTopic,
    TopicSpec,
)
from replication.config.sections import COMPRESSIONS, DATA_TYPES
from replication.config.values import parse_interval, parse_location
from replication.config.xml_reader import MANY, OPT, Ctx, Node, one, read_root, some
from replication.errors import ConfigError
from replication.routing import is_literal, regex_matches

# parse_interval, parse_location, COMPRESSIONS and DATA_TYPES live in values and sections; kept here for importers.
__all__ = ["COMPRESSIONS", "DATA_TYPES", "parse_file", "parse_interval", "parse_location", "parse_string"]

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
# Root, <Tuning>, <Actions>

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
    # txlog retention (replication.txlog.retention): rows older than Age that every destination has
    "amps-action-do-remove-journal": {"Age": _Option("age", "interval", required=True)},
}


def _instance(root: Node) -> InstanceConfig:
    """The ``<AMPSConfig>`` root: its sections, and the checks that span them."""
    kids = root.children(_ROOT_SCHEMA)
    name = kids.one("Name").read(values.name, "instance name")
    group = kids.text("Group") or name
    storage = kids.one("Storage").read(values.storage_location)
    kafka, inbox = sections.transports(kids.opt("Transports"), storage)
    txlog = sections.txlog_topics(kids.opt("TransactionLog"))
    sow_topics, queues = sections.sow(kids.opt("SOW"))
    replication = kids.opt("Replication")
    destinations = sections.destinations(replication, name, storage, inbox) if replication is not None else ()
    if destinations and not txlog and replication is not None:
        replication.fail(
            "replication is configured but there is no <TransactionLog>; only messages recorded "
            "in the transaction log are replicated",
            "add <TransactionLog><Topic><Name>.*</Name><MessageType>json</MessageType></Topic>"
            "</TransactionLog> to <AMPSConfig>",
        )
    _local_queues_stay_local(root, queues, destinations)
    _queues_recorded(root, queues, txlog)
    bootstrap_node = kids.opt("Bootstrap")
    bootstrap = sections.bootstrap(bootstrap_node, sow_topics) if bootstrap_node is not None else None
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


def _local_queues_stay_local(root: Node, queues: tuple[QueueTopic, ...], destinations: tuple[Destination, ...]) -> None:
    """A ``<LocalQueue>`` cannot be replicated (AMPS reports an error if one is): no destination's ``<Topic>``
    may cover it. Its underlying topics may be."""
    for q in (q for q in queues if q.kind == "LocalQueue"):
        for dest in destinations:
            for topic in dest.topics:
                if topic.message_type == q.message_type and regex_matches(topic.name, q.name):
                    raise root.error(
                        f"destination {dest.name!r} replicates topic {topic.name!r} ({topic.message_type}), which "
                        f"covers the LocalQueue {q.name!r} defined at line {q.source.line}: a LocalQueue cannot be "
                        "replicated", "narrow the destination's <Topic><Name> so it leaves out the queue topic "
                        "(replicating the underlying topic is fine), or define the queue as <Queue>",
                        line=topic.source.line)


def _queues_recorded(root: Node, queues: tuple[QueueTopic, ...], txlog: tuple[TopicSpec, ...]) -> None:
    """A queue's topic (where its acknowledgements and transfers are stored) and a literal underlying topic must
    be recorded in the transaction log, as AMPS requires: otherwise every acknowledgement would be refused."""
    for q in queues:
        for topic, what in ((q.name, "queue topic"), (q.underlying_topic, "underlying topic")):
            if what == "underlying topic" and not is_literal(topic):
                continue
            if not any(t.message_type == q.message_type and regex_matches(t.name, topic) for t in txlog):
                raise root.error(
                    f"the {what} {topic!r} ({q.message_type}) of {q.kind} {q.name!r} (line {q.source.line}) is not "
                    "recorded in the <TransactionLog>: a queue's messages, acknowledgements and transfers are "
                    "stored there", f"add <Topic><Name>{topic}</Name><MessageType>{q.message_type}</MessageType>"
                    "</Topic> to <TransactionLog>", line=q.source.line)


def _tuning(node: Node | None) -> int:
    """``<Tuning>``: instance-level parameters; today ``MinimumSyncDestinations`` (default 0)."""
    if node is None:
        return 0
    value_node = node.children(_TUNING_SCHEMA).opt("MinimumSyncDestinations")
    return value_node.read(values.count) if value_node is not None else 0


def _actions(node: Node) -> tuple[Action, ...]:
    actions: list[Action] = []
    seen: dict[str, ActionStep] = {}  # downgrade/upgrade module -> where it was first written
    for anode in node.children({"Action": MANY}).all("Action"):
        kids = anode.children(_ACTION_SCHEMA)
        steps = []
        for dnode in kids.all("Do"):
            step = _step(dnode, _DO_MODULES)
            first = seen.setdefault(step.module, step)
            if first is not step:
                dnode.fail(
                    f"a second {step.module} action; the instance has one (written at line {first.source.line}), "
                    "and two would only compete over the same destinations",
                    f"keep one <Do><Module>{step.module}</Module></Do> under <Actions>",
                )
            steps.append(step)
        actions.append(Action(on=_step(kids.one("On"), _ON_MODULES), do=tuple(steps), source=anode.source()))
    return tuple(actions)


def _step(node: Node, modules: dict[str, dict[str, _Option]]) -> ActionStep:
    kids = node.children(_STEP_SCHEMA)
    module = kids.one("Module").read(values.enum, tuple(modules))
    spec = modules[module]
    options: dict[str, float | int] = {}
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
            options[opt.field] = onode.read(values.count)
        else:
            options[opt.field] = onode.read(values.interval, allow_zero=opt.kind == "interval0")
    return ActionStep(module=module, source=node.source(), **options)
